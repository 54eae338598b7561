//! Weights kept at their GGUF blocks' bits read back as llama.cpp dequantizes them: random blocks
//! of each type, dequantized by llama.cpp's own Python package (`fixtures/gguf-blocks/make.py`),
//! equal the packed matrix's columns and its dense expansion, value for value.

use kvb_gemm::packed::{BlockTensor, PackedMatrix};

#[path = "../../../fixtures/gguf-blocks/cases.rs"]
mod blocks;

#[test]
fn packed_blocks_read_back_as_llama_cpp_dequantizes_them() {
    for blocks::Case {
        name,
        ggml_type,
        bytes,
        want,
    } in blocks::cases()
    {
        // 4 rows of 256 weights, read back column by column.
        let (rows, cols) = (4, want.len() / 4);
        let packed = PackedMatrix::from_blocks(&[BlockTensor {
            ggml_type,
            rows,
            cols,
            bytes,
        }])
        .unwrap();
        for r in 0..rows {
            let column = packed.column(r);
            assert_eq!(column.len(), cols, "{name} row {r}");
            for (i, (g, w)) in column.iter().zip(&want[r * cols..]).enumerate() {
                // Equal as numbers: a zero's sign may differ, which no sum from +0 can see.
                assert!(g == w, "{name} packed, row {r} value {i}: {g} vs {w}");
            }
        }
        let dense = packed.to_dense();
        assert_eq!(dense.len(), want.len(), "{name} dense");
        for r in 0..rows {
            for i in 0..cols {
                assert!(dense[i * rows + r] == want[r * cols + i], "{name} dense");
            }
        }
    }
}
