use super::*;
use proptest::prelude::*;

/// Random stored blocks of `ggml_type` for a `[rows, cols]` tensor, scales of either sign.
fn blocks(ggml_type: GgmlType, rows: usize, cols: usize, seed: u64) -> BlockTensor {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as u32
    };
    let (_, block_bytes) = ggml_type.block();
    let mut bytes = Vec::new();
    if CellValues::of_float(ggml_type).is_some() {
        // Any finite 16-bit float: an all-ones exponent (infinity, NaN) loses its top bit.
        for _ in 0..rows * cols {
            let bits = next() as u16;
            let finite = match ggml_type {
                GgmlType::F16 => half::f16::from_bits(bits).is_finite(),
                _ => half::bf16::from_bits(bits).is_finite(),
            };
            bytes.extend((if finite { bits } else { bits & !0x4000 }).to_le_bytes());
        }
        return BlockTensor {
            ggml_type,
            rows,
            cols,
            bytes,
        };
    }
    for _ in 0..rows * cols / CELL_ROWS {
        let scale = (next() % 2000) as f32 / 1000.0 - 1.0;
        let start = bytes.len();
        bytes.extend(half::f16::from_f32(scale * 0.05).to_le_bytes());
        if matches!(ggml_type, GgmlType::Q4_1 | GgmlType::Q5_1) {
            bytes.extend(half::f16::from_f32(scale * -0.3).to_le_bytes());
        }
        while bytes.len() - start < block_bytes {
            bytes.push(next() as u8);
        }
    }
    BlockTensor {
        ggml_type,
        rows,
        cols,
        bytes,
    }
}

/// Types of 32-weight blocks kept at the file's bytes.
fn file_sized_type() -> impl Strategy<Value = GgmlType> {
    prop_oneof![
        Just(GgmlType::Q4_0),
        Just(GgmlType::Q4_1),
        Just(GgmlType::Q8_0)
    ]
}

/// Every type of 32-weight blocks: the file-sized ones and those widened to 8-bit cells.
fn any_type() -> impl Strategy<Value = GgmlType> {
    prop_oneof![
        file_sized_type(),
        Just(GgmlType::Q5_0),
        Just(GgmlType::Q5_1),
        Just(GgmlType::IQ4_NL)
    ]
}

/// Types of 32-weight blocks kept in cells of the file's size.
fn held_at_file_size() -> impl Strategy<Value = GgmlType> {
    prop_oneof![
        file_sized_type(),
        Just(GgmlType::IQ4_NL),
        Just(GgmlType::Q5_0),
        Just(GgmlType::Q5_1)
    ]
}

fn any_float_type() -> impl Strategy<Value = GgmlType> {
    prop_oneof![Just(GgmlType::Bf16), Just(GgmlType::F16)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// 16-bit floats widen exactly: the dense expansion and every column of a stack of f16 or
    /// bf16 tensors are their values, bit for bit.
    #[test]
    fn sixteen_bit_floats_widen_exactly(
        t in any_float_type(),
        rows in proptest::collection::vec(1usize..21, 1..4),
        blocks_per_row in 1usize..5,
        seed in 0u64..1000,
    ) {
        let cols = blocks_per_row * CELL_ROWS;
        let tensors: Vec<BlockTensor> =
            rows.iter().enumerate().map(|(i, &r)| blocks(t, r, cols, seed + i as u64)).collect();
        let packed = PackedMatrix::from_blocks(&tensors).unwrap();
        let n: usize = rows.iter().sum();
        prop_assert_eq!(packed.cell_values(), CellValues::of_float(t).unwrap());
        prop_assert_eq!(packed.bytes(), n.div_ceil(GROUP) * GROUP * cols * 2);
        let dense = packed.to_dense();
        let mut j = 0;
        for tensor in &tensors {
            let want = tensor.to_f32();
            for r in 0..tensor.rows {
                for i in 0..cols {
                    prop_assert_eq!(dense[i * n + j].to_bits(), want[r * cols + i].to_bits());
                }
                let column: Vec<u32> = packed.column(j).iter().map(|v| v.to_bits()).collect();
                let expected: Vec<u32> = want[r * cols..(r + 1) * cols].iter().map(|v| v.to_bits()).collect();
                prop_assert_eq!(column, expected);
                j += 1;
            }
        }
    }

    /// Packing keeps every value: the dense expansion of a packed stack of tensors is the
    /// transpose of each part's GGUF expansion, one after the other (equal as numbers; a Q4_0
    /// zero may change sign, which no sum starting from +0 can see), and so is each column.
    #[test]
    fn dequantized_values_equal_the_gguf_expansion(
        parts in proptest::collection::vec((any_type(), 1usize..21), 1..4),
        blocks_per_row in 1usize..5,
        seed in 0u64..1000,
    ) {
        let cols = blocks_per_row * CELL_ROWS;
        let tensors: Vec<BlockTensor> = parts
            .iter()
            .enumerate()
            .map(|(i, &(t, rows))| blocks(t, rows, cols, seed + i as u64))
            .collect();
        let packed = PackedMatrix::from_blocks(&tensors).unwrap();
        let n: usize = parts.iter().map(|p| p.1).sum();
        prop_assert_eq!((packed.k(), packed.n()), (cols, n));
        let dense = packed.to_dense();
        let mut j = 0;
        for t in &tensors {
            let want = t.to_f32();
            for r in 0..t.rows {
                for i in 0..cols {
                    prop_assert_eq!(dense[i * n + j], want[r * cols + i], "column {} row {}", j, i);
                }
                prop_assert_eq!(&packed.column(j)[..], &want[r * cols..(r + 1) * cols]);
                j += 1;
            }
        }
    }

    /// A window of columns and cells, written with any row stride, holds the same values as the
    /// whole expansion.
    #[test]
    fn a_window_equals_the_same_part_of_the_whole(
        t in prop_oneof![any_type(), any_float_type()], rows in 1usize..40, blocks_per_row in 1usize..4,
        g0 in 0usize..5, width in 1usize..30, c0 in 0usize..3, extra in 0usize..9, seed in 0u64..100,
    ) {
        let cols = blocks_per_row * CELL_ROWS;
        let packed = PackedMatrix::from_blocks(&[blocks(t, rows, cols, seed)]).unwrap();
        let j0 = (g0 * GROUP).min((rows - 1) / GROUP * GROUP);
        let width = width.min(rows - j0);
        let (c0, c1) = (c0.min(blocks_per_row - 1), blocks_per_row);
        let stride = width.div_ceil(GROUP) * GROUP + extra;
        let mut out = vec![f32::NAN; (c1 - c0) * CELL_ROWS * stride];
        packed.dequantize_into((c0, c1), (j0, width), &mut out, stride);
        let dense = packed.to_dense();
        for i in 0..(c1 - c0) * CELL_ROWS {
            for c in 0..width {
                prop_assert_eq!(out[i * stride + c], dense[(c0 * CELL_ROWS + i) * rows + j0 + c]);
            }
        }
    }

    /// Quantizing f32 weights to q8_0 errs by at most half a step of each block's scale.
    #[test]
    fn q8_0_quantization_errs_by_at_most_half_a_step(rows in 1usize..12, blocks_per_row in 1usize..4, seed in 0u32..1000) {
        let cols = blocks_per_row * CELL_ROWS;
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 2001) as f32 - 1000.0) / 300.0)
            .collect();
        let packed = PackedMatrix::quantize_q8_0(&[(&w, rows)], cols).unwrap();
        for r in 0..rows {
            let got = packed.column(r);
            for (b, block) in w[r * cols..(r + 1) * cols].chunks(CELL_ROWS).enumerate() {
                let step = block.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
                for (i, &v) in block.iter().enumerate() {
                    let e = (got[b * CELL_ROWS + i] - v).abs();
                    prop_assert!(e <= step * 0.5 + 1e-6, "{} vs {}", got[b * CELL_ROWS + i], v);
                }
            }
        }
    }
}

#[test]
fn unpackable_tensors_are_errors_naming_the_problem() {
    let mut odd = blocks(GgmlType::Q4_1, 2, 64, 1);
    odd.bytes.pop();
    let err = PackedMatrix::from_blocks(&[odd]).unwrap_err().to_string();
    assert!(err.contains("q4_1"), "{err}");
    let a = blocks(GgmlType::Q8_0, 2, 64, 1);
    let b = blocks(GgmlType::Q8_0, 2, 32, 1);
    assert!(PackedMatrix::from_blocks(&[a.clone(), b]).is_err());
    assert!(PackedMatrix::from_blocks::<BlockTensor>(&[]).is_err());
    assert!(PackedMatrix::quantize_q8_0(&[(&[0.0; 20], 1)], 20).is_err());
    // 16-bit parts: one float type, whole cells of 32, never mixed with integers.
    let bf16 = blocks(GgmlType::Bf16, 2, 64, 1);
    let f16 = blocks(GgmlType::F16, 2, 64, 1);
    let err = PackedMatrix::from_blocks(&[bf16.clone(), f16])
        .unwrap_err()
        .to_string();
    assert!(err.contains("f16") && err.contains("bf16"), "{err}");
    assert!(PackedMatrix::from_blocks(&[bf16.clone(), a]).is_err());
    assert!(PackedMatrix::from_blocks(&[blocks(GgmlType::Bf16, 2, 48, 1)]).is_err());
    let mut short = bf16;
    short.bytes.pop();
    assert!(PackedMatrix::from_blocks(&[short]).is_err());
}

/// Random K-quant blocks of `ggml_type` for a `[rows, cols]` tensor: finite super-block scales
/// and mins of either sign, every other byte random (scales, mins, values, fifth and top bits).
fn k_blocks(ggml_type: GgmlType, rows: usize, cols: usize, seed: u64) -> BlockTensor {
    let (per_block, block_bytes) = ggml_type.block();
    let mut state = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state as u32
    };
    let mut bytes = Vec::new();
    for _ in 0..rows * cols / per_block {
        let mut block: Vec<u8> = (0..block_bytes).map(|_| next() as u8).collect();
        let scale = |v: u32| half::f16::from_f32((v % 2001) as f32 / 1000.0 - 1.0).to_le_bytes();
        // Where each type keeps its f16 scale, and its min if it has one.
        let (d_at, dmin_at) = match ggml_type {
            GgmlType::Q6_K => (208, None),
            GgmlType::Q3_K => (108, None),
            GgmlType::Q2_K => (80, Some(82)),
            GgmlType::IQ4_XS => (0, None),
            _ => (0, Some(2)),
        };
        block[d_at..d_at + 2].copy_from_slice(&scale(next()));
        if let Some(at) = dmin_at {
            block[at..at + 2].copy_from_slice(&scale(next()));
        }
        bytes.extend(block);
    }
    BlockTensor {
        ggml_type,
        rows,
        cols,
        bytes,
    }
}

/// The dense expansion and every column of `packed`, the stack of `parts`, are each part's
/// GGUF expansion bit for bit.
fn same_bits_as_the_expansion(
    packed: &PackedMatrix,
    parts: &[BlockTensor],
) -> Result<(), TestCaseError> {
    let (cols, n) = (packed.k(), packed.n());
    let dense = packed.to_dense();
    let mut j = 0;
    for tensor in parts {
        let want = tensor.to_f32();
        for r in 0..tensor.rows {
            for i in 0..cols {
                let (got, want) = (dense[i * n + j], want[r * cols + i]);
                prop_assert_eq!(got.to_bits(), want.to_bits(), "column {} row {}", j, i);
            }
            let column: Vec<u32> = packed.column(j).iter().map(|v| v.to_bits()).collect();
            let expected: Vec<u32> = want[r * cols..(r + 1) * cols]
                .iter()
                .map(|v| v.to_bits())
                .collect();
            prop_assert_eq!(column, expected);
            j += 1;
        }
    }
    Ok(())
}

/// K-quants (and IQ4_XS) kept in their own K-quant cells.
fn any_k_type() -> impl Strategy<Value = GgmlType> {
    prop_oneof![
        Just(GgmlType::Q2_K),
        Just(GgmlType::Q3_K),
        Just(GgmlType::Q4_K),
        Just(GgmlType::Q5_K),
        Just(GgmlType::Q6_K),
        Just(GgmlType::IQ4_XS)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// K-quant cells keep every value: the dense expansion, every column and any window of
    /// cells and columns equal the GGUF expansion bit for bit, for a stack of parts of one type.
    #[test]
    fn k_quant_cells_equal_the_gguf_expansion(
        t in any_k_type(),
        rows in proptest::collection::vec(1usize..21, 1..4),
        blocks_per_row in 1usize..4,
        g0 in 0usize..5, c0 in 0usize..3, extra in 0usize..9,
        seed in 0u64..1000,
    ) {
        let cols = blocks_per_row * 256;
        let tensors: Vec<BlockTensor> =
            rows.iter().enumerate().map(|(i, &r)| k_blocks(t, r, cols, seed + i as u64)).collect();
        let packed = PackedMatrix::from_blocks(&tensors).unwrap();
        let n: usize = rows.iter().sum();
        prop_assert!(packed.cell_values().is_k_quant());
        prop_assert_eq!((packed.k(), packed.n()), (cols, n));
        same_bits_as_the_expansion(&packed, &tensors)?;
        let dense = packed.to_dense();
        // A window, through the panels' path (the vector kernels where the CPU has them).
        let j0 = (g0 * GROUP).min((n - 1) / GROUP * GROUP);
        let width = n - j0;
        let (c0, c1) = (c0.min(blocks_per_row - 1), blocks_per_row);
        let stride = width.div_ceil(GROUP) * GROUP + extra;
        let mut out = vec![f32::NAN; (c1 - c0) * 256 * stride];
        packed.dequantize_into((c0, c1), (j0, width), &mut out, stride);
        for i in 0..(c1 - c0) * 256 {
            for c in 0..width {
                prop_assert_eq!(out[i * stride + c].to_bits(), dense[(c0 * 256 + i) * n + j0 + c].to_bits());
            }
        }
    }

    /// K-quant cells hold the file's bytes: Q2_K and Q6_K exactly, Q4_K and Q5_K within 3% (their
    /// 6-bit scales and mins take a byte each), Q3_K within 4% (114 bytes a block against 110)
    /// and IQ4_XS within 2% (138 against 136: their 6-bit scales take a byte each), for whole
    /// groups of 8 columns.
    #[test]
    fn k_quant_cells_take_the_files_bytes(t in any_k_type(), groups in 1usize..6, blocks_per_row in 1usize..4) {
        let (rows, cols) = (groups * GROUP, blocks_per_row * 256);
        let tensor = k_blocks(t, rows, cols, 7);
        let packed = PackedMatrix::from_blocks(std::slice::from_ref(&tensor)).unwrap();
        let ratio = packed.bytes() as f64 / tensor.bytes.len() as f64;
        match t {
            GgmlType::Q2_K | GgmlType::Q6_K => prop_assert_eq!(packed.bytes(), tensor.bytes.len()),
            GgmlType::Q3_K => prop_assert_eq!(packed.bytes(), tensor.bytes.len() / 110 * 114),
            GgmlType::IQ4_XS => prop_assert_eq!(packed.bytes(), tensor.bytes.len() / 136 * 138),
            _ => prop_assert!((1.0..1.03).contains(&ratio), "{:?}: {}", t, ratio),
        }
    }
}

proptest! {
    /// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and IQ4_NL cells keep the file's f16 scales (and Q4_1's and
    /// Q5_1's f16 offsets): for whole groups of 8 columns, exactly the file's bytes.
    #[test]
    fn integer_cells_take_the_files_bytes(t in held_at_file_size(), groups in 1usize..6, blocks_per_row in 1usize..4) {
        let (rows, cols) = (groups * GROUP, blocks_per_row * CELL_ROWS);
        let tensor = blocks(t, rows, cols, 11);
        let packed = PackedMatrix::from_blocks(std::slice::from_ref(&tensor)).unwrap();
        prop_assert_eq!(packed.bytes(), tensor.bytes.len(), "{:?}", t);
    }

    /// Q8_0, Q4_0 and Q4_1 columns copied byte for byte are the cells that decoding every
    /// weight stores.
    #[test]
    fn file_blocks_copy_as_decoded(t in file_sized_type(), rows in 1usize..40, blocks_per_row in 1usize..5, seed in 0u64..1000) {
        let cols = blocks_per_row * CELL_ROWS;
        let tensor = blocks(t, rows, cols, seed);
        let copied = PackedMatrix::from_blocks(std::slice::from_ref(&tensor)).unwrap();
        let values = copied.cell_values();
        prop_assert!(PackedMatrix::copies(t, values), "{:?} in {:?}", t, values);
        let mut decoded = PackedMatrix::zeroed(values, CELL_ROWS, cols, rows, "decoded");
        let block_bytes = t.block().1;
        let columns: Vec<&[u8]> = tensor.bytes.chunks_exact(blocks_per_row * block_bytes).collect();
        decoded.fill_groups(&columns, |column, coded| {
            for b in column.chunks_exact(block_bytes) {
                blocks::decode(t, b, coded);
            }
        });
        prop_assert!(copied.data[..] == decoded.data[..], "{:?}", t);
    }

    /// A head keeps a scale and offset only where it can give them back exactly.
    #[test]
    fn heads_hold_what_they_give_back(scale in -70000f32..70000.0, offset in -70000f32..70000.0, lane in 0usize..GROUP) {
        let d = half::f16::from_f32(scale).to_f32();
        let m = half::f16::from_f32(offset).to_f32();
        let mut cell = [0u8; 64];
        for (scales, s, o, exact) in [
            (Scales::F32, scale, offset, true),
            (Scales::Half, d, m, true),
            (Scales::Half, scale, offset, scale == d && offset == m),
            (Scales::HalfCentred, d, -8.0 * d, true),
            (Scales::HalfOnly, d, -0.0, true),
            (Scales::HalfOnly, d, 0.0, false),
        ] {
            let kept = scales.write(&mut cell, lane, s, o);
            if exact {
                prop_assert!(kept, "{:?} {} {}", scales, s, o);
                let (rs, ro) = scales.read(&cell, lane);
                prop_assert_eq!((rs.to_bits(), ro.to_bits()), (s.to_bits(), o.to_bits()));
            } else {
                prop_assert!(!kept, "{:?} {} {}", scales, s, o);
            }
        }
    }
}

/// Formats mixed in one projection keep their values in cells whose scales are f32.
#[test]
fn mixed_formats_widen_their_scales() {
    let parts = [
        blocks(GgmlType::Q4_0, 8, 64, 1),
        blocks(GgmlType::Q4_1, 8, 64, 2),
    ];
    let packed = PackedMatrix::from_blocks(&parts).unwrap();
    assert_eq!(packed.cell_values(), CellValues::Nibbles(Scales::F32));
    for (i, p) in parts.iter().enumerate() {
        let one = PackedMatrix::from_blocks(std::slice::from_ref(p)).unwrap();
        assert_ne!(one.cell_values(), packed.cell_values());
        for j in 0..8 {
            assert_eq!(one.column(j), packed.column(i * 8 + j));
        }
    }
}

/// A bad K-quant tensor is an error naming its type and shape; parts of two K-quant types are
/// kept together in a common cell type (no error).
#[test]
fn k_quant_tensors_that_cannot_be_kept_are_errors() {
    let mut short = k_blocks(GgmlType::Q4_K, 3, 512, 1);
    short.bytes.truncate(short.bytes.len() - 5);
    let err = PackedMatrix::from_blocks(&[short]).unwrap_err().to_string();
    assert!(err.contains("q4_k") && err.contains("[3, 512]"), "{err}");
    let a = k_blocks(GgmlType::Q4_K, 8, 256, 1);
    let b = k_blocks(GgmlType::Q6_K, 8, 256, 2);
    let mixed = PackedMatrix::from_blocks(&[a.clone(), b.clone()]).unwrap();
    let dense = mixed.to_dense();
    let (wa, wb) = (a.to_f32(), b.to_f32());
    for i in 0..256 {
        assert_eq!(dense[i * 16], wa[i]);
        assert_eq!(dense[i * 16 + 8], wb[i]);
    }
    // Q3_K beside Q6_K (a Q3_K_M file's attention) shares Q6_K's cells, bits and all.
    let c = k_blocks(GgmlType::Q3_K, 8, 256, 3);
    let both = PackedMatrix::from_blocks(&[c.clone(), b]).unwrap();
    assert_eq!(both.cell_values(), CellValues::Q6K);
    let (dense, wc) = (both.to_dense(), c.to_f32());
    for i in 0..256 {
        assert_eq!(dense[i * 16].to_bits(), wc[i].to_bits());
        assert_eq!(dense[i * 16 + 8].to_bits(), wb[i].to_bits());
    }
}
