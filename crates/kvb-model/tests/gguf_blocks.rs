//! kvb reads every quantized ggml block type as llama.cpp does: random blocks of each type,
//! dequantized by llama.cpp's own Python package (`fixtures/gguf-blocks/make.py`), give the same
//! f32 values through kvb's expansion and through its packed form.

mod common;

use common::{fixtures, read_f32};
use kvb_model::gguf::{dequantize, GgmlType};
use kvb_model::packed::{BlockTensor, PackedMatrix};

const TYPES: [(&str, GgmlType); 6] = [
    ("q4_0", GgmlType::Q4_0),
    ("q4_1", GgmlType::Q4_1),
    ("q8_0", GgmlType::Q8_0),
    ("q4_k", GgmlType::Q4_K),
    ("q5_k", GgmlType::Q5_K),
    ("q6_k", GgmlType::Q6_K),
];

#[test]
fn every_block_type_dequantizes_as_llama_cpp_does() {
    for (name, t) in TYPES {
        let dir = fixtures().join("gguf-blocks");
        let bytes = std::fs::read(dir.join(format!("{name}.blocks"))).unwrap();
        let want = read_f32(&dir.join(format!("{name}.f32")));
        let got = dequantize(t, &bytes);
        assert_eq!(got.len(), want.len(), "{name}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            // Equal as numbers: a zero's sign may differ ((q - 8) d against q d - 8 d), which
            // no sum starting from +0 can see.
            assert!(g == w, "{name}, value {i}: kvb {g} vs llama.cpp {w}");
        }

        // The same values packed: 4 rows of 256 weights, read back column by column.
        let (rows, cols) = (4, want.len() / 4);
        let packed = PackedMatrix::from_blocks(&[BlockTensor {
            ggml_type: t,
            rows,
            cols,
            bytes,
        }])
        .unwrap();
        for r in 0..rows {
            let column = packed.column(r);
            for (i, (g, w)) in column.iter().zip(&want[r * cols..]).enumerate() {
                assert!(g == w, "{name} packed, row {r} value {i}: {g} vs {w}");
            }
        }
        let dense = packed.to_dense();
        for r in 0..rows {
            for i in 0..cols {
                assert!(dense[i * rows + r] == want[r * cols + i], "{name} dense");
            }
        }
    }
}
