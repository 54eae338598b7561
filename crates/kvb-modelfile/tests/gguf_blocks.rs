//! kvb reads every quantized ggml block type as llama.cpp does: random blocks of each type,
//! dequantized by llama.cpp's own Python package (`fixtures/gguf-blocks/make.py`), give the same
//! f32 values through kvb's expansion. (kvb-gemm's `tests/gguf_blocks.rs` holds its packed form
//! to the same values.)

use kvb_modelfile::gguf::dequantize;

#[path = "../../../fixtures/gguf-blocks/cases.rs"]
mod blocks;

#[test]
fn every_block_type_dequantizes_as_llama_cpp_does() {
    for blocks::Case {
        name,
        ggml_type,
        bytes,
        want,
    } in blocks::cases()
    {
        let got = dequantize(ggml_type, &bytes);
        assert_eq!(got.len(), want.len(), "{name}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            // Equal as numbers: a zero's sign may differ ((q - 8) d against q d - 8 d), which
            // no sum starting from +0 can see.
            assert!(g == w, "{name}, value {i}: kvb {g} vs llama.cpp {w}");
        }
    }
}
