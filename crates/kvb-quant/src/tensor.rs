//! The same KIVI quantization over burn tensors, on any backend.
//!
//! Group statistics and codes are computed on the device, so a GPU quantizes K/V where it lives;
//! only the small per-group min/max and the codes come back to the host, where the codes are packed.
//! The result equals [`crate::quantize`] of the same values (same f16 parameters, same codes).

use crate::groups::{GroupParams, Layout, F16_SAFE};
use crate::host::QuantizedKv;
use crate::packing::pack;
use crate::{QuantAxis, QuantConfig, QuantError};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

/// The values on the host. `to_vec` reinterprets the backend's bytes and rejects them when they
/// are less aligned than `f32` (CUDA's staging buffers can be); then they are decoded one by one.
fn to_f32(t: Tensor<impl Backend, 1>) -> Vec<f32> {
    let data = t.into_data().convert::<f32>();
    match data.as_slice::<f32>() {
        Ok(values) => values.to_vec(),
        Err(_) => data
            .as_bytes()
            .chunks_exact(4)
            .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
    }
}

/// Pads `x` along `dim` to a multiple of `g` by repeating its last slice (min and max unchanged).
fn pad_to_groups<B: Backend>(x: Tensor<B, 3>, dim: usize, g: usize) -> Tensor<B, 3> {
    let len = x.dims()[dim];
    let padded = len.div_ceil(g) * g;
    if padded == len {
        return x;
    }
    let last = x.clone().narrow(dim, len - 1, 1);
    let filler = last.repeat_dim(dim, padded - len);
    Tensor::cat(vec![x, filler], dim)
}

/// Quantizes `x` (`[heads, tokens, dim]`) along `axis` on its device.
pub fn quantize_tensor<B: Backend>(
    x: Tensor<B, 3>,
    axis: QuantAxis,
    config: QuantConfig,
) -> Result<QuantizedKv, QuantError> {
    let [h, t, d] = x.dims();
    let layout = Layout::new([h, t, d], axis, config.group_size)?;
    let g = config.group_size;
    let device = x.device();
    // Grouped view: [h, t/g, g, d] per channel (reduce dim 2); [h, t, d/g, g] per token (dim 3).
    let (grouped, reduce_dim) = match axis {
        QuantAxis::PerChannel => {
            let p = pad_to_groups(x.clone(), 1, g);
            let tp = p.dims()[1];
            (p.reshape([h, tp / g, g, d]), 2)
        }
        QuantAxis::PerToken => {
            let p = pad_to_groups(x.clone(), 2, g);
            let dp = p.dims()[2];
            (p.reshape([h, t, dp / g, g]), 3)
        }
    };
    let stats_shape = {
        let mut s = grouped.dims();
        s[reduce_dim] = 1;
        s
    };
    let n = layout.group_count();
    let mins = to_f32(grouped.clone().min_dim(reduce_dim).reshape([n]));
    let maxs = to_f32(grouped.clone().max_dim(reduce_dim).reshape([n]));
    if let Some(i) = (0..n).find(|&i| {
        !(mins[i].is_finite() && maxs[i].is_finite() && mins[i] >= -F16_SAFE && maxs[i] <= F16_SAFE)
    }) {
        let value = if mins[i].abs() > maxs[i].abs() || !mins[i].is_finite() {
            mins[i]
        } else {
            maxs[i]
        };
        return Err(QuantError::OutOfRange { value, index: i });
    }
    let params: Vec<GroupParams> = mins
        .iter()
        .zip(&maxs)
        .map(|(&lo, &hi)| GroupParams::covering(lo, hi, config.bits))
        .collect();
    // In the block's own float type: burn 0.21 would give the device's default otherwise.
    let dtype = grouped.dtype();
    let upload =
        |v: Vec<f32>| Tensor::<B, 4>::from_data(TensorData::new(v, stats_shape), (&device, dtype));
    let zeros = upload(params.iter().map(|p| p.zero.to_f32()).collect());
    let inv_scales = upload(params.iter().map(|p| p.inv_scale()).collect());
    let codes = ((grouped - zeros) * inv_scales + 0.5)
        .floor()
        .clamp(0.0, config.bits.max_code() as f32);
    let codes = match axis {
        QuantAxis::PerChannel => {
            let tp = codes.dims()[1] * g;
            codes.reshape([h, tp, d]).slice([0..h, 0..t, 0..d])
        }
        QuantAxis::PerToken => {
            let dp = codes.dims()[2] * g;
            codes.reshape([h, t, dp]).slice([0..h, 0..t, 0..d])
        }
    };
    let codes: Vec<u8> = to_f32(codes.reshape([h * t * d]))
        .into_iter()
        .map(|c| c as u8)
        .collect();
    Ok(QuantizedKv::from_parts(
        [h, t, d],
        axis,
        config,
        pack(&codes, config.bits),
        params,
    ))
}

/// The dequantized block as a tensor on `device` (dequantized on the host, then uploaded).
pub fn dequantize_tensor<B: Backend>(q: &QuantizedKv, device: &B::Device) -> Tensor<B, 3> {
    // `B`'s float type named: burn 0.21 would give the device's default, which another backend
    // on the same device may have fixed.
    let dtype = <B::FloatElem as burn::tensor::Element>::dtype();
    Tensor::from_data(TensorData::new(q.dequantize(), q.shape()), (device, dtype))
}
