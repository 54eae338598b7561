//! The int8 products against their definition and against the f32 products.

use super::products::{columns, matmul_quantized, Kernel};
use super::{IntDotMatrix, QuantizedRows, BLOCK};
use crate::packed::{CellOrder, PackedMatrix};
use crate::test_values::{packed_matrix, spread};
use crate::tile::Tile;
use proptest::prelude::*;
use std::sync::Arc;

/// The integer formats [`packed_matrix`] builds: 0 Q8_0 quantized here (8-bit, f32 scales, no
/// offsets), 1 Q4_1 (4-bit, f16 scales and offsets), 7 Q8_0 and 8 Q4_0 (f16 scales; Q4_0's
/// offsets `-8 d`), and K-quant cells as loaded: 5 Q4_K, 6 Q5_K (5-bit values), 2 Q6_K (6-bit
/// signed values, 16-row sub-blocks), 11 IQ4_XS (its table's signed values); 9 Q5_1 and 15
/// Q5_0 (5-bit cells re-laid as 8-bit values, f16 scales and Q5_1's offsets), 12 Q3_K (3-bit signed values, 16-row sub-blocks), 13 Q3_K
/// beside Q6_K (in Q6_K cells), 14 IQ4_NL (its table's entries re-laid as 8-bit values) and
/// 10 Q2_K (2-bit values with an offset per 16 rows).
const INTEGER_FORMATS: [usize; 14] = [0, 1, 7, 8, 5, 6, 2, 9, 11, 12, 13, 14, 10, 15];

/// The exact product of `a`'s dequantized rows and `w`'s values, in f64.
fn exact(a: &QuantizedRows, w: &IntDotMatrix) -> Vec<f64> {
    let cols: Vec<Vec<f32>> = (0..w.n()).map(|j| w.column(j)).collect();
    let mut y = Vec::new();
    for r in 0..a.rows() {
        let x = a.dequantized_row(r);
        for col in &cols {
            y.push(x.iter().zip(col).map(|(&x, &c)| x as f64 * c as f64).sum());
        }
    }
    y
}

/// A weight of `INTEGER_FORMATS[format]` re-laid out, `m` input rows for it, and its `k`.
fn operands(
    format: usize,
    blocks_per_row: usize,
    n: usize,
    m: usize,
    seed: u32,
) -> (IntDotMatrix, Vec<f32>, usize) {
    let (packed, k) = packed_matrix(INTEGER_FORMATS[format], blocks_per_row, n, seed);
    let w = IntDotMatrix::from_packed(&Arc::new(packed)).expect("integer cells");
    let x = (0..m * k).map(|i| spread(i, seed, 70.0)).collect();
    (w, x, k)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Q8_0's cells copied byte by byte give the layout that reading and writing each weight
    /// gives (the other integer formats, never copied, run through to guard the choice).
    #[test]
    fn copied_bytes_are_the_decoded_layout(
        format in 0usize..INTEGER_FORMATS.len(), blocks_per_row in 1usize..5, n in 1usize..40,
        seed in 0u32..1000,
    ) {
        let (packed, _) = packed_matrix(INTEGER_FORMATS[format], blocks_per_row, n, seed);
        if IntDotMatrix::takes(&packed) && !packed.cell_values().is_k_quant() {
            let copied = IntDotMatrix::layout_of(&packed, true);
            prop_assert!(copied == IntDotMatrix::layout_of(&packed, false));
        }
    }

    /// Every kernel gives the portable loop's bits, for any row count (tiles of 1 to 8, several
    /// passes), width (a last group partly padding; pairs of groups and a last one alone) and
    /// integer format; and each output is the
    /// exact product of the quantized rows and the weights to within f32 rounding.
    #[test]
    fn kernels_give_the_definitions_bits(
        m in 1usize..80, blocks_per_row in 1usize..12, n in 1usize..70,
        format in 0usize..INTEGER_FORMATS.len(), seed in 0u32..1000,
    ) {
        let (w, x, k) = operands(format, blocks_per_row, n, m, seed);
        let a = QuantizedRows::new(&x, m, k);
        let want = matmul_quantized(&a, &w, Kernel::Portable);
        for kernel in Kernel::supported() {
            let got = matmul_quantized(&a, &w, kernel);
            // All columns as one task too: the split over threads gives a task a group or two
            // at these widths, and a task of many groups runs the two-group tiles.
            let mut one_task = vec![0f32; m * n];
            columns(&a, &w, kernel, 0, n, &mut Tile::whole(&mut one_task, m, n));
            for (i, ((g, o), e)) in got.iter().zip(&one_task).zip(&want).enumerate() {
                prop_assert_eq!(g.to_bits(), e.to_bits(), "{:?}, element {} of [{}, {}]", kernel, i, m, n);
                prop_assert_eq!(o.to_bits(), e.to_bits(), "{:?} in one task, element {} of [{}, {}]", kernel, i, m, n);
            }
        }
        // The largest sum of k products of values up to 1000 / 70 by weights below 1.
        let magnitude = k as f64 * 1000.0 / 70.0;
        for (g, e) in want.iter().zip(exact(&a, &w)) {
            prop_assert!((*g as f64 - e).abs() <= 1e-5 * magnitude, "{} vs exact {}", g, e);
        }
    }

    /// A row's outputs do not depend on the rows computed with it: each row alone gives the
    /// bits it gets among the others.
    #[test]
    fn a_rows_result_does_not_depend_on_its_neighbours(
        m in 2usize..20, blocks_per_row in 1usize..8, n in 1usize..40,
        format in 0usize..INTEGER_FORMATS.len(), seed in 0u32..1000,
    ) {
        let (w, x, k) = operands(format, blocks_per_row, n, m, seed);
        let together = super::matmul(&x, m, &w);
        for r in 0..m {
            let alone = super::matmul(&x[r * k..(r + 1) * k], 1, &w);
            for (j, (a, t)) in alone.iter().zip(&together[r * n..(r + 1) * n]).enumerate() {
                prop_assert_eq!(a.to_bits(), t.to_bits(), "row {} column {}", r, j);
            }
        }
    }

    /// The re-laid-out weight keeps every value of the packed one.
    #[test]
    fn columns_keep_the_packed_values(
        blocks_per_row in 1usize..6, n in 1usize..40, format in 0usize..INTEGER_FORMATS.len(), seed in 0u32..1000,
    ) {
        let (packed, _) = packed_matrix(INTEGER_FORMATS[format], blocks_per_row, n, seed);
        let packed = Arc::new(packed);
        let w = IntDotMatrix::from_packed(&packed).expect("integer cells");
        for j in 0..n {
            let (got, want) = (w.column(j), packed.column(j));
            prop_assert_eq!(got.len(), want.len());
            for (g, e) in got.iter().zip(&want) {
                prop_assert_eq!(g.to_bits(), e.to_bits(), "column {}", j);
            }
        }
    }

    /// Quantized rows stay within half a step of the input, per block.
    #[test]
    fn quantized_rows_are_within_half_a_step(
        m in 1usize..5, blocks in 1usize..6, seed in 0u32..1000, scale in 1f32..1e4,
    ) {
        let k = blocks * BLOCK;
        let x: Vec<f32> = (0..m * k).map(|i| spread(i, seed, scale)).collect();
        let a = QuantizedRows::new(&x, m, k);
        for r in 0..m {
            let back = a.dequantized_row(r);
            for (b, (xb, yb)) in x[r * k..(r + 1) * k].chunks(BLOCK).zip(back.chunks(BLOCK)).enumerate() {
                let step = xb.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
                for (v, q) in xb.iter().zip(yb) {
                    prop_assert!((v - q).abs() <= 0.5 * step * 1.0001 + f32::EPSILON, "block {}: {} -> {}", b, v, q);
                }
            }
        }
    }
}

/// Half-precision cells are not taken (they keep the f32 products); integer cells are.
#[test]
fn float_cells_are_declined() {
    for format in [3, 4] {
        let (packed, _) = packed_matrix(format, 8, 24, 1);
        assert!(!IntDotMatrix::takes(&packed), "format {format}");
        assert!(
            IntDotMatrix::from_packed(&Arc::new(packed)).is_none(),
            "format {format}"
        );
    }
    for format in INTEGER_FORMATS {
        let (packed, _) = packed_matrix(format, 8, 24, 1);
        assert!(IntDotMatrix::takes(&packed), "format {format}");
    }
}

/// K-quant cells keep the file's bytes: Q2_K's and Q3_K's are shared as loaded, the types with
/// nibbles are a copy in dot order (as many bytes, moved), and the loaded matrix is let go.
#[test]
fn k_quant_cells_keep_their_bytes_shared_or_in_dot_order() {
    for format in [5, 6, 2, 11, 12, 13, 10] {
        let (packed, _) = packed_matrix(format, 16, 24, 3);
        let packed = Arc::new(packed);
        let w = IntDotMatrix::from_packed(&packed).expect("K-quant cells");
        assert_eq!(w.bytes(), packed.bytes(), "format {format}");
        let cells = w.kcells.as_ref().expect("K-quant cells");
        let values = packed.cell_values();
        assert_eq!(
            cells.order(),
            CellOrder::for_int8(values),
            "format {format}"
        );
        if cells.order() == CellOrder::Rows {
            assert!(Arc::ptr_eq(cells, &packed), "format {format}");
            assert_eq!(Arc::strong_count(&packed), 2, "format {format}");
        } else {
            assert_eq!(packed.order(), CellOrder::Rows, "format {format}");
            assert_eq!(Arc::strong_count(&packed), 1, "format {format}");
            // Every group's head is the loaded one; its values moved.
            let head = crate::packed::kcells::head_bytes(values);
            let (a, b) = (packed.group_cells(1), cells.group_cells(1));
            assert_eq!(a[..head], b[..head], "format {format}");
            assert_ne!(a, b, "format {format}: nothing moved");
            // The one-pass copy re-lays as the loaded matrix re-laid in place does.
            let in_place = PackedMatrix::clone(&packed).in_dot_order();
            for g in 0..packed.n().div_ceil(crate::packed::GROUP) {
                assert_eq!(
                    cells.group_cells(g),
                    in_place.group_cells(g),
                    "format {format}, group {g}"
                );
            }
        }
    }
}

/// The f32 products and expansions refuse cells in dot order (they read row order), rather
/// than give other numbers.
#[test]
fn f32_products_refuse_cells_in_dot_order() {
    let (packed, k) = packed_matrix(5, 4, 16, 2);
    let w = IntDotMatrix::from_packed(&Arc::new(packed)).expect("Q4_K cells");
    let cells = w.kcells.clone().expect("K-quant cells");
    let x = vec![0.5f32; k];
    for (what, product) in [
        (
            "f32 products",
            Box::new(|| drop(crate::packed_rows::matmul(&x, 1, &cells))) as Box<dyn Fn()>,
        ),
        ("dequantize_into", Box::new(|| drop(cells.to_dense()))),
    ] {
        let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(product));
        let message = refused.expect_err(what);
        let message = message
            .downcast_ref::<String>()
            .expect("a formatted message");
        assert!(
            message.contains("8-bit products' order"),
            "{what}: {message}"
        );
    }
}

/// A matrix consumed as it is re-laid out (its pages given back step by step) gives what a
/// shared one gives, for every integer format; one that is not taken comes back whole.
#[test]
fn a_consumed_matrix_gives_the_shared_ones_layout() {
    for format in INTEGER_FORMATS {
        // Over 2 MiB of 8-bit cells, so the cells live in a map whose pages are given back.
        let (n, blocks_per_row) = (4104, 16);
        let (packed, _) = packed_matrix(format, blocks_per_row, n, 5);
        let shared = IntDotMatrix::from_packed(&Arc::new(packed.clone())).expect("taken");
        let consumed = IntDotMatrix::consuming(packed, 64 << 10).expect("taken");
        assert_eq!(consumed.has_offsets, shared.has_offsets, "format {format}");
        assert_eq!(consumed.bytes(), shared.bytes(), "format {format}");
        for j in (0..n).step_by(7).chain([n - 1]) {
            let (c, s) = (consumed.column(j), shared.column(j));
            assert!(
                c.iter().zip(&s).all(|(c, s)| c.to_bits() == s.to_bits()),
                "format {format}, column {j}"
            );
        }
    }
    let (floats, _) = packed_matrix(4, 8, 24, 1);
    let back = IntDotMatrix::from_packed_consuming(floats.clone()).expect_err("f16 not taken");
    assert_eq!(back.column(5), floats.column(5));
}

/// Q4_0, Q4_1 and Q8_0 blocks re-laid out keep the file's f16 scales: as many bytes as the
/// file's blocks (for whole groups of 16 columns).
#[test]
fn file_blocks_keep_the_files_size() {
    for (format, file_block_bytes) in [(8, 18), (1, 20), (7, 34)] {
        let (n, blocks_per_row) = (48, 8);
        let (packed, k) = packed_matrix(format, blocks_per_row, n, 1);
        let w = IntDotMatrix::from_packed(&Arc::new(packed)).expect("integer cells");
        assert_eq!(
            w.bytes(),
            n * k / BLOCK * file_block_bytes,
            "format {format}"
        );
    }
}

proptest! {
    /// The vector quantizers give the portable one's integers and scales, non-finite values
    /// included.
    #[test]
    fn quantizers_agree(
        mut values in proptest::collection::vec(
            prop_oneof![8 => -1e6f32..1e6, 1 => -1e-30f32..1e-30, 1 => Just(-0.0f32)],
            BLOCK..=BLOCK,
        ),
        // At most one non-finite value: one zeroes the block's scale, so more would hide the
        // rest of it.
        special in proptest::option::of((0..BLOCK, prop_oneof![Just(f32::NAN), Just(f32::INFINITY), Just(f32::NEG_INFINITY)])),
    ) {
        if let Some((at, v)) = special {
            values[at] = v;
        }
        let mut q = [0i8; BLOCK];
        let portable = super::rows::quantize_block_portable(&values, &mut q);
        #[cfg(target_arch = "x86_64")]
        for kernel in Kernel::supported() {
            let mut qv = [0i8; BLOCK];
            // SAFETY: each runs only where `supported` found its kernel's instructions (AVX2;
            // AVX-512F for VNNI); both slices hold one block.
            let vector = match kernel.vector() {
                Kernel::Portable => continue,
                Kernel::Avx2 => unsafe { super::rows::quantize_block_avx2(&values, &mut qv) },
                Kernel::Vnni512 => unsafe { super::rows::quantize_block_avx512(&values, &mut qv) },
                Kernel::Amx => unreachable!("`vector` takes the tiles off"),
            };
            prop_assert_eq!(portable.0.to_bits(), vector.0.to_bits(), "{:?}", kernel);
            prop_assert_eq!(portable.1, vector.1, "{:?}", kernel);
            prop_assert_eq!(q, qv, "{:?}", kernel);
        }
    }
}
