//! KIVI's promises as properties.

use burn::backend::NdArray;
use burn::tensor::{Tensor, TensorData};
use half::f16;
use kvb_quant::packing::{pack, packed_len, unpack};
use kvb_quant::tensor::{dequantize_tensor, quantize_tensor};
use kvb_quant::{quantize, Bits, QuantAxis, QuantConfig, QuantError, QuantizedKv};
use proptest::prelude::*;

fn bits() -> impl Strategy<Value = Bits> {
    prop_oneof![Just(Bits::Eight), Just(Bits::Four), Just(Bits::Two)]
}

fn axis() -> impl Strategy<Value = QuantAxis> {
    prop_oneof![Just(QuantAxis::PerChannel), Just(QuantAxis::PerToken)]
}

/// A block with a mix of ordinary values, outliers and constant stretches.
fn block() -> impl Strategy<Value = ([usize; 3], Vec<f32>)> {
    (1usize..4, 1usize..70, 1usize..40).prop_flat_map(|(h, t, d)| {
        let n = h * t * d;
        (
            Just([h, t, d]),
            proptest::collection::vec(
                prop_oneof![
                    6 => -4.0f32..4.0,
                    1 => -3000.0f32..3000.0,
                    2 => Just(1.5f32),
                ],
                n,
            ),
        )
    })
}

fn check_half_step(q: &QuantizedKv, data: &[f32]) -> Result<(), TestCaseError> {
    let [h, t, d] = q.shape();
    let back = q.dequantize();
    for head in 0..h {
        for tok in 0..t {
            for ch in 0..d {
                let i = (head * t + tok) * d + ch;
                let step = q.step_at(head, tok, ch);
                let err = (back[i] - data[i]).abs();
                // Half a step, plus f32 rounding of the arithmetic itself.
                let bound = 0.5 * step * (1.0 + 1e-4) + 1e-6 * data[i].abs().max(1.0);
                prop_assert!(
                    err <= bound,
                    "element {i}: {} -> {}, step {step}",
                    data[i],
                    back[i]
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #[test]
    fn every_element_round_trips_within_half_a_step((shape, data) in block(), bits in bits(), axis in axis(), g in 1usize..48) {
        let q = quantize(&data, shape, axis, QuantConfig { bits, group_size: g }).unwrap();
        check_half_step(&q, &data)?;
    }

    #[test]
    fn packing_round_trips_exactly(codes in proptest::collection::vec(any::<u8>(), 0..300), bits in bits()) {
        let codes: Vec<u8> = codes.iter().map(|c| c & bits.max_code() as u8).collect();
        let packed = pack(&codes, bits);
        prop_assert_eq!(packed.len(), packed_len(codes.len(), bits));
        prop_assert_eq!(unpack(&packed, bits, codes.len()), codes);
    }

    #[test]
    fn host_and_tensor_versions_agree((shape, data) in block(), bits in bits(), axis in axis(), g in 1usize..48) {
        let cfg = QuantConfig { bits, group_size: g };
        let host = quantize(&data, shape, axis, cfg).unwrap();
        let x = Tensor::<NdArray, 3>::from_data(TensorData::new(data.clone(), shape), &Default::default());
        let dev = quantize_tensor(x, axis, cfg).unwrap();
        prop_assert_eq!(&host, &dev);
        let back: Vec<f32> = dequantize_tensor::<NdArray>(&dev, &Default::default()).into_data().to_vec().unwrap();
        prop_assert_eq!(back, host.dequantize());
    }

    #[test]
    fn memory_accounting_is_exact((shape, data) in block(), bits in bits(), axis in axis(), g in 1usize..48) {
        let q = quantize(&data, shape, axis, QuantConfig { bits, group_size: g }).unwrap();
        let elems: usize = shape.iter().product();
        let [h, t, d] = shape;
        let groups = match axis {
            QuantAxis::PerChannel => h * d * t.div_ceil(g),
            QuantAxis::PerToken => h * t * d.div_ceil(g),
        };
        prop_assert_eq!(q.codes().len(), (elems * bits.count() as usize).div_ceil(8));
        prop_assert_eq!(q.memory_bytes(), q.codes().len() + 4 * groups);
        prop_assert!((q.compression_ratio() - (elems * 4) as f64 / q.memory_bytes() as f64).abs() < 1e-12);
        let rebuilt = QuantizedKv::from_raw(shape, axis, q.config(), q.codes().to_vec(), q.scales().to_vec(), q.zeros().to_vec()).unwrap();
        prop_assert_eq!(rebuilt, q);
    }
}

#[test]
fn constant_groups_of_an_f16_value_round_trip_exactly() {
    let data = vec![0.375f32; 2 * 40 * 8];
    for bits in [Bits::Eight, Bits::Four, Bits::Two] {
        let q = quantize(
            &data,
            [2, 40, 8],
            QuantAxis::PerToken,
            QuantConfig {
                bits,
                group_size: 32,
            },
        )
        .unwrap();
        assert_eq!(q.dequantize(), data, "{bits:?}");
    }
}

#[test]
fn constant_groups_of_other_values_round_trip_within_f16_rounding() {
    let data = vec![0.3f32; 2 * 40 * 8];
    for bits in [Bits::Eight, Bits::Four, Bits::Two] {
        let q = quantize(
            &data,
            [2, 40, 8],
            QuantAxis::PerChannel,
            QuantConfig {
                bits,
                group_size: 32,
            },
        )
        .unwrap();
        let back = q.dequantize();
        let f16_of = f16::from_f32(0.3).to_f32();
        // 0.3 is not an f16: zero is the f16 below it, and one step above reaches it.
        assert!(
            back.iter()
                .all(|&b| (b - 0.3).abs() <= (0.3 - f16_of).abs().max(1e-4)),
            "{bits:?}"
        );
    }
}

#[test]
fn an_outlier_channel_does_not_hurt_other_channels_of_keys() {
    // KIVI's reason for per-channel keys: channel 0 holds outliers, channel 1 small values.
    let (t, d) = (64usize, 2usize);
    let data: Vec<f32> = (0..t)
        .flat_map(|i| [100.0 + i as f32, (i as f32 * 0.1).sin() * 0.01])
        .collect();
    let q = quantize(
        &data,
        [1, t, d],
        QuantAxis::PerChannel,
        QuantConfig {
            bits: Bits::Four,
            group_size: 32,
        },
    )
    .unwrap();
    let back = q.dequantize();
    let small_err = (0..t)
        .map(|i| (back[i * d + 1] - data[i * d + 1]).abs())
        .fold(0f32, f32::max);
    assert!(small_err < 0.002, "{small_err}");
}

#[test]
fn bad_input_is_an_error() {
    let cfg = QuantConfig::default();
    assert!(matches!(
        quantize(&[1.0; 5], [1, 2, 3], QuantAxis::PerToken, cfg),
        Err(QuantError::Shape(_))
    ));
    let err = quantize(&[1.0, f32::NAN], [1, 1, 2], QuantAxis::PerToken, cfg).unwrap_err();
    assert!(
        matches!(err, QuantError::OutOfRange { index: 1, .. }),
        "{err}"
    );
    assert!(matches!(
        quantize(&[1e6], [1, 1, 1], QuantAxis::PerToken, cfg),
        Err(QuantError::OutOfRange { .. })
    ));
    assert!(QuantizedKv::from_raw(
        [1, 2, 3],
        QuantAxis::PerToken,
        cfg,
        vec![0; 5],
        vec![],
        vec![]
    )
    .is_err());
}
