//! Reading float tensors back to the host.

use burn::tensor::{backend::Backend, Tensor};

/// The values of `t` as `f32` on the host, in row-major order.
///
/// `TensorData::to_vec` reinterprets the bytes a backend hands back and fails when they are less
/// aligned than `f32`, which CUDA's staging buffers can be (seen on an H100 reading logits); the
/// bytes are then decoded one value at a time instead.
pub fn to_host_f32<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    let data = t.into_data().convert::<f32>();
    match data.as_slice::<f32>() {
        Ok(values) => values.to_vec(),
        Err(_) => decode_f32(data.as_bytes()),
    }
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
        let t = Tensor::<crate::backends::Cpu, 3>::from_data(
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
    }
}
