//! Token ids read back from the device.

use burn::tensor::{backend::Backend, DType, Int, Tensor};

/// Token ids from an int tensor (`i32`, `u32` or `i64`), decoded at any byte alignment as
/// [`to_host_f32`] does; an id that does not fit a `u32` is an error.
pub(crate) fn to_host_ids<B: Backend, const D: usize>(
    t: Tensor<B, D, Int>,
) -> crate::Result<Vec<u32>> {
    let data = t.into_data();
    let bytes = data.as_bytes();
    kvb_attn::host_work::read(bytes.len() as u64);
    let wide: Vec<i64> = match data.dtype {
        DType::I64 | DType::U64 => bytes
            .chunks_exact(8)
            .map(|b| i64::from_ne_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            .collect(),
        DType::I32 => bytes
            .chunks_exact(4)
            .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as i64)
            .collect(),
        DType::U32 => bytes
            .chunks_exact(4)
            .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as i64)
            .collect(),
        other => {
            return Err(crate::ModelError::Forward(format!(
                "token ids came back as {other:?}"
            )))
        }
    };
    wide.into_iter()
        .map(|x| {
            u32::try_from(x).map_err(|_| {
                crate::ModelError::Forward(format!("the device returned token id {x}"))
            })
        })
        .collect()
}

#[cfg(all(test, feature = "ndarray"))]
mod tests {
    use super::*;
    use burn::tensor::TensorData;

    #[test]
    fn token_ids_come_back_and_negative_ones_are_errors() {
        let dev = Default::default();
        let ids = Tensor::<crate::backends::Cpu, 2, Int>::from_data(
            TensorData::new(vec![0i64, 7, 49151, 3], [2, 2]),
            &dev,
        );
        assert_eq!(to_host_ids(ids).unwrap(), [0, 7, 49151, 3]);
        let bad = Tensor::<crate::backends::Cpu, 1, Int>::from_data(
            TensorData::new(vec![5i64, -1], [2]),
            &dev,
        );
        assert!(to_host_ids(bad).is_err());
    }
}
