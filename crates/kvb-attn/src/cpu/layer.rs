//! How the CPU holds one K/V pool layer: the one place that knows its memory.
//!
//! A layer `[kv_heads, slots, head_dim]` is one row-major array: slot `s` of head `h` starts at
//! element `(h * slots + s) * head_dim`. burn-ndarray stores no f16, so an f16 layer is a burn
//! float tensor whose primitive is a `u16` array of the values' IEEE half-precision bits. burn's
//! own ops would read those bits as integers: every read and write of a layer goes through
//! [`CpuLayer`] (the pool's moves in `pool.rs`, the kernels through [`PoolView`]).

use super::pool_view::PoolView;
use super::view::View;
use crate::FloatDtype;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use burn_ndarray::{NdArray, NdArrayTensor};
use half::f16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};

/// A pool layer as a tensor.
pub(crate) type Layer = Tensor<NdArray<f32>, 3>;

/// A pool layer's memory: the primitive behind its tensor (an `Arc` clone, no copy of the
/// values), known to hold f32 values or f16 bits.
pub(crate) struct CpuLayer {
    primitive: NdArrayTensor,
}

impl CpuLayer {
    /// The memory behind `layer`; `None` when it holds neither f32 nor f16 bits.
    pub fn of(layer: &Layer) -> Option<Self> {
        match layer.clone().into_primitive() {
            TensorPrimitive::Float(p @ (NdArrayTensor::F32(_) | NdArrayTensor::U16(_))) => {
                Some(CpuLayer { primitive: p })
            }
            _ => None,
        }
    }

    /// Whether `layer` holds f16 bits (then burn's generic ops must not touch it).
    pub fn is_f16(layer: &Layer) -> bool {
        Self::of(layer).is_some_and(|l| matches!(l.primitive, NdArrayTensor::U16(_)))
    }

    /// A zeroed layer from a zeroed allocation: the pages are mapped lazily, so a large pool
    /// costs memory only as its blocks are first written (burn's `zeros` writes every element).
    pub fn zeros(shape: [usize; 3], precision: FloatDtype) -> Layer {
        let n = shape.iter().product();
        let data = match precision {
            FloatDtype::F32 => TensorData::new(no_huge_pages(vec![0f32; n]), shape),
            FloatDtype::F16 => TensorData::new(no_huge_pages(vec![0u16; n]), shape),
            FloatDtype::Bf16 => {
                unreachable!("KvPool refuses bf16 on the CPU (holds_pool_precision)")
            }
        };
        Tensor::from_primitive(TensorPrimitive::Float(NdArrayTensor::from_data(data)))
    }

    /// The strided view the kernels read. The view borrows this memory: keep `self` alive while
    /// it is read.
    pub fn view(&self) -> Option<PoolView> {
        match &self.primitive {
            NdArrayTensor::F32(storage) => {
                let view = storage.view();
                Some(PoolView::F32(View {
                    ptr: view.as_ptr(),
                    strides: view.strides().try_into().ok()?,
                }))
            }
            NdArrayTensor::U16(storage) => {
                let view = storage.view();
                Some(PoolView::F16(View {
                    // f16 is a `repr(transparent)` u16.
                    ptr: view.as_ptr().cast::<f16>(),
                    strides: view.strides().try_into().ok()?,
                }))
            }
            _ => None,
        }
    }

    /// Runs `f` on the layer's values, read only; `None` when they are not contiguous.
    pub fn read<R>(&self, f: impl FnOnce(ValuesRef) -> R) -> Option<R> {
        match &self.primitive {
            NdArrayTensor::F32(storage) => Some(f(ValuesRef::F32(storage.view().to_slice()?))),
            NdArrayTensor::U16(storage) => Some(f(ValuesRef::F16(
                storage.view().to_slice()?.reinterpret_cast(),
            ))),
            _ => None,
        }
    }

    /// Runs `f` on the layer's values in place; returns the layer and whether `f` ran (not when
    /// the layer is neither contiguous f32 nor f16 bits). The pool is uniquely owned by its
    /// [`crate::KvPool`]; were it shared, `into_owned` would copy it first (correct, only slow).
    pub fn update(layer: Layer, f: impl FnOnce(Values, [usize; 3])) -> (Layer, bool) {
        let dims = layer.dims();
        let Some(CpuLayer { primitive }) = Self::of(&layer) else {
            return (layer, false);
        };
        drop(layer);
        let (primitive, ran) = match primitive {
            NdArrayTensor::F32(storage) => {
                let mut array = storage.into_owned();
                let ran = array.as_slice_mut().map(|v| f(Values::F32(v), dims));
                (NdArrayTensor::from(array), ran.is_some())
            }
            NdArrayTensor::U16(storage) => {
                let mut array = storage.into_owned();
                let ran = array
                    .as_slice_mut()
                    .map(|v| f(Values::F16(v.reinterpret_cast_mut()), dims));
                (NdArrayTensor::from(array), ran.is_some())
            }
            other => (other, false),
        };
        (
            Tensor::from_primitive(TensorPrimitive::Float(primitive)),
            ran,
        )
    }
}

/// Whether a large zeroed allocation costs memory only where it is written: on Linux unless
/// the kernel refuses to overcommit (`vm.overcommit_memory` 2 charges all of it at once), and
/// on macOS.
pub(crate) fn lazily_mapped() -> bool {
    if cfg!(target_os = "linux") {
        std::fs::read_to_string("/proc/sys/vm/overcommit_memory").map_or(true, |m| m.trim() != "2")
    } else {
        cfg!(target_os = "macos")
    }
}

/// `values` with transparent huge pages kept off its memory: a layer holds each head's slots
/// apart, so a sequence's first blocks touch a page in every head's range, and where THP is
/// `always` each such touch would take 2 MiB instead of 4 KiB.
fn no_huge_pages<T>(values: Vec<T>) -> Vec<T> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: sysconf reads a constant.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let first = values.as_ptr() as usize;
        let (start, end) = (
            first.next_multiple_of(page),
            (first + std::mem::size_of_val(values.as_slice())) / page * page,
        );
        if end > start {
            // SAFETY: whole pages inside `values`' allocation; the advice changes how the
            // kernel backs them, not what they hold.
            unsafe {
                libc::madvise(
                    start as *mut libc::c_void,
                    end - start,
                    libc::MADV_NOHUGEPAGE,
                )
            };
        }
    }
    values
}

/// A layer's values `[h, slots, d]` contiguous, borrowed for an in-place update.
pub(crate) enum Values<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [f16]),
}

impl Values<'_> {
    /// Writes `src` at element `at`, rounding to nearest even for an f16 layer ([`half`]'s
    /// conversions, F16C where the CPU has it: the same bits either way).
    pub fn put(&mut self, at: usize, src: &[f32]) {
        match self {
            Values::F32(v) => v[at..at + src.len()].copy_from_slice(src),
            Values::F16(v) => v[at..at + src.len()].convert_from_f32_slice(src),
        }
    }

    /// Copies `len` values from element `from` to element `to` (ranges apart).
    pub fn copy_within(&mut self, from: usize, to: usize, len: usize) {
        match self {
            Values::F32(v) => v.copy_within(from..from + len, to),
            Values::F16(v) => v.copy_within(from..from + len, to),
        }
    }

    /// Zeroes `len` values from element `at` (clamped to the layer).
    pub fn zero(&mut self, at: usize, len: usize) {
        match self {
            Values::F32(v) => {
                let end = (at + len).min(v.len());
                v[at.min(end)..end].fill(0.0)
            }
            Values::F16(v) => {
                let end = (at + len).min(v.len());
                v[at.min(end)..end].fill(f16::ZERO)
            }
        }
    }
}

/// A layer's values, borrowed to read.
pub(crate) enum ValuesRef<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
}

impl ValuesRef<'_> {
    /// Reads `dst.len()` values from element `at` into `dst`, widened (exactly) for an f16 layer.
    pub fn get(&self, at: usize, dst: &mut [f32]) {
        match self {
            ValuesRef::F32(v) => dst.copy_from_slice(&v[at..at + dst.len()]),
            ValuesRef::F16(v) => v[at..at + dst.len()].convert_to_f32_slice(dst),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout the module documents: an f16 layer is `u16` bits, slot `s` of head `h` at
    /// element `(h * slots + s) * head_dim`, rounded to nearest; reads widen them back.
    #[test]
    fn an_f16_layer_holds_the_bits_where_the_layout_says() {
        let [h, slots, d] = [2, 3, 4];
        let layer = CpuLayer::zeros([h, slots, d], FloatDtype::F16);
        assert!(CpuLayer::is_f16(&layer));
        let written = [1.5f32, -2.0, 0.1, 65504.0];
        let at = (slots + 2) * d; // head 1, slot 2
        let (layer, ran) = CpuLayer::update(layer, |mut v, dims| {
            assert_eq!(dims, [h, slots, d]);
            v.put(at, &written);
        });
        assert!(ran);
        let bits = layer.clone().into_data().to_vec::<u16>().unwrap();
        for (i, &b) in bits.iter().enumerate() {
            let want = match i.checked_sub(at) {
                Some(j) if j < d => f16::from_f32(written[j]).to_bits(),
                _ => 0,
            };
            assert_eq!(b, want, "element {i}");
        }
        let memory = CpuLayer::of(&layer).unwrap();
        let mut back = [0f32; 4];
        memory.read(|v| v.get(at, &mut back)).unwrap();
        assert_eq!(back, written.map(|x| f16::from_f32(x).to_f32()));
        let view = memory.view().unwrap();
        assert!(matches!(view, PoolView::F16(_)));
        assert_eq!(view.strides(), [(slots * d) as isize, d as isize, 1]);
    }

    /// An f32 layer is plain burn values, and any other primitive is not a layer.
    #[test]
    fn an_f32_layer_is_plain_values_and_others_are_refused() {
        let layer = CpuLayer::zeros([1, 2, 2], FloatDtype::F32);
        assert!(!CpuLayer::is_f16(&layer));
        let (layer, ran) = CpuLayer::update(layer, |mut v, _| v.put(1, &[7.0]));
        assert!(ran);
        assert_eq!(
            layer.into_data().to_vec::<f32>().unwrap(),
            vec![0.0, 7.0, 0.0, 0.0]
        );
        let ints: Layer = Tensor::from_primitive(TensorPrimitive::Float(NdArrayTensor::from_data(
            TensorData::new(vec![0i32; 4], [1, 2, 2]),
        )));
        assert!(CpuLayer::of(&ints).is_none());
        assert!(!CpuLayer::update(ints, |_, _| {}).1);
    }
}
