//! Reading float tensors back to the host.

use burn::tensor::{backend::Backend, DType, Tensor};

/// The values of `t` as `f32` on the host, in row-major order.
///
/// `TensorData::to_vec` and `convert` reinterpret the bytes a backend hands back and fail (or
/// panic) when they are less aligned than their type, which CUDA's staging buffers can be (seen
/// on an H100 reading f32 logits, and on an H200 reading f16 ones after a 653-token prefill);
/// such bytes are decoded one value at a time instead. Half-precision values always are: that
/// is their widening anyway.
pub fn to_host_f32<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    let data = t.into_data();
    crate::host_work::read(data.as_bytes().len() as u64);
    match data.dtype {
        DType::F16 => decode_half(data.as_bytes(), |b| half::f16::from_ne_bytes(b).to_f32()),
        DType::BF16 => decode_half(data.as_bytes(), |b| half::bf16::from_ne_bytes(b).to_f32()),
        _ => {
            let data = data.convert::<f32>();
            match data.as_slice::<f32>() {
                Ok(values) => values.to_vec(),
                Err(_) => decode_f32(data.as_bytes()),
            }
        }
    }
}

/// Native-endian 16-bit floats from bytes at any alignment, widened by `widen`.
fn decode_half(bytes: &[u8], widen: impl Fn([u8; 2]) -> f32) -> Vec<f32> {
    bytes.chunks_exact(2).map(|b| widen([b[0], b[1]])).collect()
}

/// Native-endian `f32`s from bytes at any alignment.
fn decode_f32(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::TensorData;

    #[test]
    fn values_come_back_in_order() {
        let values: Vec<f32> = (0..24).map(|i| i as f32 * 0.5 - 3.0).collect();
        let t = Tensor::<burn::backend::NdArray<f32>, 3>::from_data(
            TensorData::new(values.clone(), [2, 3, 4]),
            &Default::default(),
        );
        assert_eq!(to_host_f32(t.clone()), values);
        let swapped: Vec<f32> = to_host_f32(t.swap_dims(0, 2));
        assert_eq!(swapped[..3], [values[0], values[12], values[4]]);
    }

    #[test]
    fn misaligned_bytes_decode_to_the_same_values() {
        let values = [1.5f32, -2.25, 1e-30, f32::MAX];
        let mut buf = vec![0u8; 1];
        buf.extend(values.iter().flat_map(|v| v.to_ne_bytes()));
        assert_eq!(decode_f32(&buf[1..]), values);

        let halves = [1.5f32, -2.25, 65504.0, 6.1e-5];
        let mut buf = vec![0u8; 1];
        buf.extend(
            halves
                .iter()
                .flat_map(|&v| half::f16::from_f32(v).to_ne_bytes()),
        );
        let widened = |v: f32| half::f16::from_f32(v).to_f32();
        let got = decode_half(&buf[1..], |b| half::f16::from_ne_bytes(b).to_f32());
        assert_eq!(got, halves.map(widened));
        let mut buf = vec![0u8; 1];
        buf.extend(
            halves
                .iter()
                .flat_map(|&v| half::bf16::from_f32(v).to_ne_bytes()),
        );
        let got = decode_half(&buf[1..], |b| half::bf16::from_ne_bytes(b).to_f32());
        assert_eq!(got, halves.map(|v| half::bf16::from_f32(v).to_f32()));
    }

    #[test]
    fn half_precision_tensors_come_back_widened() {
        let values: Vec<f32> = (0..12).map(|i| i as f32 * 0.25 - 1.0).collect();
        let t = Tensor::<burn::backend::NdArray<f32>, 2>::from_data(
            TensorData::new(values.clone(), [3, 4]).convert::<half::f16>(),
            &Default::default(),
        );
        // NdArray<f32> holds f32 whatever it is given; the data's own dtype is what is read.
        let data = TensorData::new(values.clone(), [3, 4]).convert::<half::f16>();
        assert_eq!(data.dtype, DType::F16);
        assert_eq!(
            decode_half(data.as_bytes(), |b| half::f16::from_ne_bytes(b).to_f32()),
            values
        );
        assert_eq!(to_host_f32(t), values);
    }
}
