//! The float type kvb creates tensors in.

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Element};

/// `device` and `B`'s own float type, as a tensor's creation options:
/// `Tensor::from_data(data, float_on::<B>(&device))`.
///
/// burn 0.21 gives a float tensor created without a dtype its device's default type, and the
/// first backend to touch a device in a process fixes that default for every backend on the same
/// device type: `Wgpu<f16>` after `Wgpu<f32>` on one adapter would silently hold and compute f32
/// (kvb-model's `wgpu_backend` test runs both in one process). kvb names the type at every
/// creation, so a backend computes in its own float type whatever ran before it.
pub fn float_on<B: Backend>(device: &B::Device) -> (&B::Device, DType) {
    (device, <B::FloatElem as Element>::dtype())
}
