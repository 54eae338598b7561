//! Index tensors uploaded once for all the layers of a forward pass.
//!
//! Every layer of a forward pass attends through the same block tables and writes its new K/V
//! at the same pool slots, so the integers each kernel call sends are equal from layer to layer
//! (and between a layer's K and V writes). Each upload is a round of host work (a buffer, a
//! copy, a queue submission) that a GPU decode step, bound by the host, pays 30 layers over.
//! Here each call site keeps its last upload per thread and hands it out again while the
//! integers and the device are equal. The kernels only read these tensors, so sharing one
//! buffer between calls is safe.

use burn::tensor::{Int, Tensor, TensorData};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use std::any::Any;
use std::cell::RefCell;
use std::thread::LocalKey;

/// One call site's last upload: `(device, integers, tensors)` behind `Any` (the runtime type is
/// a generic parameter; a thread-local cannot be).
pub(crate) type Slot = RefCell<Option<Box<dyn Any>>>;

/// The tensors of `ints` on `device`: the last ones `slot` uploaded if their integers and
/// device are the same, else `upload(ints)` (then kept in `slot`).
pub(crate) fn uploaded<R: CubeRuntime, const N: usize>(
    slot: &'static LocalKey<Slot>,
    device: &R::CubeDevice,
    ints: [Vec<i32>; N],
    upload: impl FnOnce(&[Vec<i32>; N]) -> [CubeTensor<R>; N],
) -> [CubeTensor<R>; N] {
    type Entry<R, const N: usize> = (
        <R as CubeRuntime>::CubeDevice,
        [Vec<i32>; N],
        [CubeTensor<R>; N],
    );
    slot.with(|cell| {
        if let Some((d, kept, tensors)) = cell
            .borrow()
            .as_ref()
            .and_then(|b| b.downcast_ref::<Entry<R, N>>())
        {
            if d == device && *kept == ints {
                return tensors.clone();
            }
        }
        let tensors = upload(&ints);
        crate::host_work::uploaded(N as u64);
        *cell.borrow_mut() = Some(Box::new((device.clone(), ints, tensors.clone())));
        tensors
    })
}

/// [`uploaded`] as int tensors of the backend (`i32` values in its int element).
pub(crate) fn int_tensors<R, F, I, BT, const N: usize>(
    slot: &'static LocalKey<Slot>,
    device: &R::CubeDevice,
    ints: [Vec<i32>; N],
) -> [CubeTensor<R>; N]
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    uploaded(slot, device, ints, |ints| {
        ints.clone().map(|v| {
            let n = v.len();
            Tensor::<CubeBackend<R, F, I, BT>, 1, Int>::from_data(TensorData::new(v, [n]), device)
                .into_primitive()
        })
    })
}

thread_local! {
    /// The paged attention kernel's block tables, last slots and work items.
    pub(crate) static ATTENTION: Slot = const { RefCell::new(None) };
    /// The pool write's slot indices.
    pub(crate) static POOL_WRITE: Slot = const { RefCell::new(None) };
}

#[cfg(all(test, feature = "wgpu"))]
mod tests {
    use super::*;
    use burn::backend::wgpu::{WgpuDevice, WgpuRuntime};
    use proptest::prelude::*;

    type B = burn_cubecl::CubeBackend<WgpuRuntime, f32, i32, u32>;

    thread_local! {
        static UNDER_TEST: Slot = const { RefCell::new(None) };
    }

    fn read(t: CubeTensor<WgpuRuntime>) -> Vec<i32> {
        Tensor::<B, 1, Int>::from_primitive(t)
            .into_data()
            .convert::<i32>()
            .to_vec::<i32>()
            .unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]

        /// Whatever the order of calls, the tensors hold the integers of the call (never a
        /// stale upload), and a call uploads only when its integers differ from the last call's.
        #[test]
        fn a_call_gets_its_own_integers_uploaded_only_when_they_change(
            calls in prop::collection::vec(
                (prop::collection::vec(0i32..4, 0..3), prop::collection::vec(0i32..4, 1..3)),
                1..12,
            ),
        ) {
            let device = WgpuDevice::default();
            UNDER_TEST.with(|c| *c.borrow_mut() = None);
            let mut uploads = 0;
            let mut last: Option<[Vec<i32>; 2]> = None;
            let mut expected_uploads = 0;
            for (a, b) in calls {
                let ints = [a, b];
                if last.as_ref() != Some(&ints) {
                    expected_uploads += 1;
                }
                let got = uploaded::<WgpuRuntime, 2>(&UNDER_TEST, &device, ints.clone(), |ints| {
                    uploads += 1;
                    ints.clone().map(|v| {
                        let n = v.len();
                        Tensor::<B, 1, Int>::from_data(TensorData::new(v, [n]), &device)
                            .into_primitive()
                    })
                });
                let [ga, gb] = got;
                prop_assert_eq!(&read(ga), &ints[0]);
                prop_assert_eq!(&read(gb), &ints[1]);
                last = Some(ints);
            }
            prop_assert_eq!(uploads, expected_uploads);
        }
    }
}
