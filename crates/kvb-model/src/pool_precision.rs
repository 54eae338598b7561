//! [`PoolPrecision`]: the element type the K/V pool holds.
//!
//! A decode step reads the whole K/V of every running sequence; at a few thousand tokens of
//! context that read is the largest part of the step after the weights. Holding K/V in f16 halves
//! it (and the pool's memory), as llama.cpp's default cache does. Every write rounds to f16 and
//! every read widens exactly, and attention always reads the pool (never the f32 values it was
//! written from), so a sequence computes the same whether its K/V was prefilled in one pass, in
//! slices, or copied in from the chunk store: the exactness of reuse holds within one precision.
//! Two precisions give different K/V, so the precision is part of every cache key.
//!
//! On the GPU backends the pool holds the backend's own float type (`--dtype`): f32, f16 or
//! bf16 ([`PoolPrecision::native`]).

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Element};

/// The element type of the K/V pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PoolPrecision {
    /// As computed.
    F32,
    /// IEEE half precision, rounded to nearest even on write.
    F16,
    /// bfloat16: a CUDA backend computing in bf16 (`--dtype bf16`).
    Bf16,
}

impl PoolPrecision {
    /// The names [`PoolPrecision`]'s `FromStr` reads.
    pub const NAMES: [&'static str; 3] = ["f32", "f16", "bf16"];

    /// The precision of `B`'s float tensors: what a pool of plain `B` tensors holds.
    pub fn native<B: Backend>() -> PoolPrecision {
        match <B::FloatElem as Element>::dtype() {
            DType::F16 => PoolPrecision::F16,
            DType::BF16 => PoolPrecision::Bf16,
            _ => PoolPrecision::F32,
        }
    }

    /// Bytes per stored value.
    pub fn bytes(self) -> usize {
        match self {
            PoolPrecision::F32 => 4,
            PoolPrecision::F16 | PoolPrecision::Bf16 => 2,
        }
    }

    /// Its name, as `FromStr` reads it back.
    pub fn as_str(self) -> &'static str {
        match self {
            PoolPrecision::F32 => "f32",
            PoolPrecision::F16 => "f16",
            PoolPrecision::Bf16 => "bf16",
        }
    }
}

impl std::fmt::Display for PoolPrecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for PoolPrecision {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "fp32" => Ok(PoolPrecision::F32),
            "f16" | "fp16" => Ok(PoolPrecision::F16),
            "bf16" => Ok(PoolPrecision::Bf16),
            other => Err(format!(
                "unknown K/V pool precision `{other}` (expected one of {})",
                PoolPrecision::NAMES.join(", ")
            )),
        }
    }
}
