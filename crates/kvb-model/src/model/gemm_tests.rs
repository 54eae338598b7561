//! The blocked GEMM (kvb-gemm) as the model runs it: against burn-ndarray's product, the
//! few-row kernels and packed weights.

use super::test_values::spread;
use crate::packed::PackedMatrix;
use kvb_gemm::few_rows;
use kvb_gemm::{matmul, DenseWeight};
use proptest::prelude::*;

fn operands(m: usize, k: usize, n: usize, seed: u32) -> (Vec<f32>, Vec<f32>) {
    let val = |i: usize| spread(i, seed, 700.0);
    let x = (0..m * k).map(val).collect();
    let w = (0..k * n).map(|i| val(i + 104729)).collect();
    (x, w)
}

fn assert_same_bits(got: &[f32], want: &[f32], what: &str) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), want.len());
    for (i, (g, e)) in got.iter().zip(want).enumerate() {
        prop_assert_eq!(
            g.to_bits(),
            e.to_bits(),
            "{}: element {}: {} vs {}",
            what,
            i,
            g,
            e
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]
    /// A row's result does not depend on the rows beside it: the few-row kernels (decode and
    /// short suffixes) compute each row of a many-row product bit for bit, on every CPU.
    #[test]
    fn each_row_equals_the_few_row_product(
        m in 20usize..80, k in 1usize..600, n in 1usize..100, seed in 0u32..1000,
    ) {
        let (x, w) = operands(m, k, n, seed);
        let got = matmul(&x, m, k, n, &DenseWeight { w: &w, n });
        for r in (0..m).step_by(7) {
            let alone = few_rows::matmul(&x[r * k..(r + 1) * k], &w, 1, k, n);
            assert_same_bits(&got[r * n..(r + 1) * n], &alone, "row alone")?;
        }
    }

    /// A packed weight expanded straight into the kernel's panels gives the bits of its f32
    /// expansion (8-column groups and 32-row cells against 16-column panels and 256-row blocks).
    #[test]
    fn packed_weights_give_the_bits_of_their_expansion(
        m in 1usize..300, cells in 1usize..20, n in 1usize..100, seed in 0u32..1000,
    ) {
        let k = cells * 32;
        let (x, w) = operands(m, k, n, seed);
        let packed = PackedMatrix::quantize_q8_0(&[(&w, n)], k).unwrap();
        let dense = packed.to_dense();
        let got = matmul(&x, m, k, n, &packed);
        let want = matmul(&x, m, k, n, &DenseWeight { w: &dense, n });
        assert_same_bits(&got, &want, "packed against dense")?;
    }
}
