//! Raw strided views of burn-ndarray tensors, shareable across rayon tasks.

use burn::tensor::{Tensor, TensorPrimitive};
use burn_ndarray::{NdArray, NdArrayTensor};

/// A read-only strided view of a tensor of `N` dimensions of `T` (f32, or f16 for a pool layer).
#[derive(Clone, Copy)]
pub(crate) struct View<const N: usize, T = f32> {
    pub ptr: *const T,
    pub strides: [isize; N],
}

// SAFETY: the pointer refers to tensor memory that the calling function keeps alive (it holds the
// primitives) for the whole parallel section, and it is only read.
unsafe impl<const N: usize, T> Send for View<N, T> {}
unsafe impl<const N: usize, T> Sync for View<N, T> {}

impl<const N: usize> View<N> {
    /// The view of a primitive, or `None` if it is not f32 (then the reference runs).
    pub fn of(t: &NdArrayTensor) -> Option<Self> {
        match t {
            NdArrayTensor::F32(storage) => {
                let view = storage.view();
                let strides: [isize; N] = view.strides().try_into().ok()?;
                Some(View {
                    ptr: view.as_ptr(),
                    strides,
                })
            }
            _ => None,
        }
    }
}

impl<const N: usize, T> View<N, T> {
    /// Pointer to the element at `index`.
    #[inline]
    pub fn at(&self, index: [usize; N]) -> *const T {
        let offset: isize = index
            .iter()
            .zip(&self.strides)
            .map(|(&i, &s)| i as isize * s)
            .sum();
        // SAFETY: callers pass indices within the tensor's dimensions.
        unsafe { self.ptr.offset(offset) }
    }
}

/// The primitive behind a float tensor (an `Arc` clone, no copy of the data).
pub(crate) fn primitive<const D: usize>(t: &Tensor<NdArray<f32>, D>) -> Option<NdArrayTensor> {
    match t.clone().into_primitive() {
        TensorPrimitive::Float(p) => Some(p),
        _ => None,
    }
}

/// A tensor from host values on the CPU device.
pub(crate) fn tensor<const D: usize>(
    values: Vec<f32>,
    shape: [usize; D],
) -> Tensor<NdArray<f32>, D> {
    Tensor::from_data(
        burn::tensor::TensorData::new(values, shape),
        &Default::default(),
    )
}
