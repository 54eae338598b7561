//! Loading packed weights: a GGUF tensor's blocks re-laid into [`PackedMatrix`] cells, and those
//! into the 8-bit products' layout ([`IntDotMatrix`]; K-quant cells moved into dot order), for
//! a Llama-3.2-1B FFN matrix (2048 x 8192) in each 32-weight block format and the K-quants
//! with nibbles. Prints milliseconds (median of `KVB_REPS`, default 7)
//! and the file's bytes re-laid per second, on all of rayon's threads.
//!
//! `cargo bench -p kvb-gemm --bench load`

use kvb_gemm::int8::IntDotMatrix;
use kvb_gemm::packed::PackedMatrix;
use kvb_modelfile::gguf::GgmlType;
use kvb_modelfile::BlockTensor;
use std::sync::Arc;
use std::time::Instant;

/// Random blocks of `t` for `[rows, cols]`: f16 scales (and Q4_1's minimums) in a model's
/// range, any values.
fn tensor(t: GgmlType, rows: usize, cols: usize) -> BlockTensor {
    let (per_block, block_bytes) = t.block();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
        (state >> 33) as u32
    };
    let mut bytes = Vec::with_capacity(rows * cols / per_block * block_bytes);
    for _ in 0..rows * cols / per_block {
        let start = bytes.len();
        let heads = if t == GgmlType::Q4_1 { 2 } else { 1 };
        for _ in 0..heads {
            let v = (next() % 2000) as f32 / 1e5 - 0.01;
            bytes.extend(half::f16::from_f32(v).to_le_bytes());
        }
        while bytes.len() - start < block_bytes {
            bytes.push(next() as u8);
        }
    }
    BlockTensor {
        ggml_type: t,
        rows,
        cols,
        bytes,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let reps: usize = std::env::var("KVB_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7);
    let (k, n) = (2048, 8192);
    // The 8-bit layout of a matrix held alone (a tied embedding) and of one still shared (a
    // projection: the loaded matrix stays whole until the layout is done).
    println!("| format | packed cells, ms | GB/s | 8-bit layout, ms | GB/s | shared, ms | GB/s |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for t in [
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::IQ4_XS,
    ] {
        let blocks = tensor(t, n, k);
        let file_gb = blocks.bytes.len() as f64 / 1e9;
        let (mut pack, mut layout, mut shared) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..reps {
            let t0 = Instant::now();
            let packed = PackedMatrix::from_blocks(std::slice::from_ref(&blocks)).unwrap();
            pack.push(t0.elapsed().as_secs_f64());
            let packed = Arc::new(packed);
            let t0 = Instant::now();
            let copy = IntDotMatrix::from_packed(&packed).unwrap();
            shared.push(t0.elapsed().as_secs_f64());
            drop(copy);
            let packed = Arc::try_unwrap(packed).unwrap();
            let t0 = Instant::now();
            let int8 = IntDotMatrix::from_packed_consuming(packed).unwrap();
            layout.push(t0.elapsed().as_secs_f64());
            std::hint::black_box(int8);
        }
        let (p, l, s) = (median(pack), median(layout), median(shared));
        println!(
            "| {t:?} | {:.1} | {:.2} | {:.1} | {:.2} | {:.1} | {:.2} |",
            p * 1e3,
            file_gb / p,
            l * 1e3,
            file_gb / l,
            s * 1e3,
            file_gb / s
        );
    }
}
