//! [`FloatDtype`]: a float element type (f32, f16, bf16), for what a backend computes in
//! (`--dtype`) and for what the K/V pool holds (`--pool-dtype`).
//!
//! The two choices are separate because the CPU computes in f32 but may hold its K/V in f16: a
//! decode step reads the whole K/V of every running sequence, and at a few thousand tokens of
//! context that read is the largest part of the step after the weights. Holding K/V in f16 halves
//! it (and the pool's memory), as llama.cpp's default cache does. Every write rounds to f16 and
//! every read widens exactly, and attention always reads the pool (never the f32 values it was
//! written from), so a sequence computes the same whether its K/V was prefilled in one pass, in
//! slices, or copied in from the chunk store: the exactness of reuse holds within one precision.
//! Two precisions give different K/V, so the pool's precision is part of every cache key.
//!
//! A GPU backend holds weights, activations and its pool in its own float type
//! ([`FloatDtype::native`]); which backend takes which type is kvb-model's
//! `BackendKind::check_dtype`.

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Element};

/// A float element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FloatDtype {
    /// 32-bit floats: every backend computes in them; the CPU's default pool.
    #[default]
    F32,
    /// IEEE half precision, rounded to nearest even on write: wgpu (where the adapter has
    /// `shader-f16`) and CUDA compute in it; the CPU can hold its pool in it.
    F16,
    /// bfloat16: CUDA only (WGSL has no bf16 type, and the CPU pool holds f32 or f16).
    Bf16,
}

impl FloatDtype {
    /// The names `FromStr` reads (besides the aliases it also takes).
    pub const NAMES: [&'static str; 3] = ["f32", "f16", "bf16"];

    /// The float type of `B`'s tensors: what `B` computes in, and what a pool of plain `B`
    /// tensors holds.
    pub fn native<B: Backend>() -> FloatDtype {
        match <B::FloatElem as Element>::dtype() {
            DType::F16 => FloatDtype::F16,
            DType::BF16 => FloatDtype::Bf16,
            _ => FloatDtype::F32,
        }
    }

    /// Bytes per value.
    pub fn bytes(self) -> usize {
        match self {
            FloatDtype::F32 => 4,
            FloatDtype::F16 | FloatDtype::Bf16 => 2,
        }
    }

    /// Its name, as `FromStr` reads it back.
    pub fn as_str(self) -> &'static str {
        match self {
            FloatDtype::F32 => "f32",
            FloatDtype::F16 => "f16",
            FloatDtype::Bf16 => "bf16",
        }
    }
}

impl std::fmt::Display for FloatDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for FloatDtype {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "fp32" | "float32" => Ok(FloatDtype::F32),
            "f16" | "fp16" | "float16" | "half" => Ok(FloatDtype::F16),
            "bf16" | "bfloat16" => Ok(FloatDtype::Bf16),
            other => Err(format!(
                "unknown float type `{other}` (expected one of {})",
                FloatDtype::NAMES.join(", ")
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_reads_back_and_sizes_are_right() {
        for dtype in [FloatDtype::F32, FloatDtype::F16, FloatDtype::Bf16] {
            assert_eq!(dtype.as_str().parse::<FloatDtype>(), Ok(dtype));
            assert_eq!(dtype.to_string(), dtype.as_str());
        }
        assert_eq!("HALF".parse::<FloatDtype>(), Ok(FloatDtype::F16));
        let err = "f8".parse::<FloatDtype>().unwrap_err();
        assert!(err.contains("f8") && err.contains("bf16"), "{err}");
        assert_eq!(
            [FloatDtype::F32, FloatDtype::F16, FloatDtype::Bf16].map(FloatDtype::bytes),
            [4, 2, 2]
        );
        assert_eq!(
            FloatDtype::native::<burn::backend::NdArray<f32>>(),
            FloatDtype::F32
        );
    }
}
