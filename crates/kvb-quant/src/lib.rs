//! # kvb-quant: KIVI quantization of cached K/V
//!
//! True KIVI (Liu et al., *KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache*, ICML
//! 2024): **keys are quantized per channel** (each channel's statistics taken along the token axis,
//! because key outliers live in fixed channels) and **values per token** (statistics along the
//! channel axis). Quantization is asymmetric (a scale and a zero point per group), in groups of
//! `group_size` elements along the axis the statistics run over (default 32), at 8, 4 or 2 bits,
//! with codes packed tightly (one, two or four per byte).
//!
//! The K/V of one layer is a block `[heads, tokens, head_dim]` (f32). [`quantize`] and
//! [`QuantizedKv::dequantize`] work on host slices (for the store); with the `burn` feature,
//! `tensor::quantize_tensor` runs the same quantization over burn tensors on any backend
//! (statistics and codes on the device), and gives the same result. Without it the crate needs no
//! tensor library.
//!
//! Promises (proved by `tests/quant_properties.rs`):
//! - every element round-trips within half a quantization step of its group (constant groups
//!   exactly, groups with outliers included);
//! - packing round-trips exactly;
//! - host and tensor versions agree;
//! - [`QuantizedKv::memory_bytes`] is exactly the bytes held, and [`QuantizedKv::compression_ratio`]
//!   is f32 bytes over those bytes.
//!
//! Scales and zero points are stored as f16 (as in KIVI), rounded outward (zero down, scale up) so
//! that the group's range is always covered and the half-step bound holds for the stored values.
//!
//! ```
//! use kvb_quant::{quantize, Bits, QuantAxis, QuantConfig};
//! let k: Vec<f32> = (0..2 * 64 * 8).map(|i| (i as f32 * 0.37).sin()).collect();
//! let cfg = QuantConfig { bits: Bits::Four, group_size: 32 };
//! let q = quantize(&k, [2, 64, 8], QuantAxis::PerChannel, cfg).unwrap();
//! let back = q.dequantize();
//! assert!(k.iter().zip(&back).all(|(a, b)| (a - b).abs() <= 0.07));
//! assert!(q.compression_ratio() > 5.0);
//! ```
#![warn(missing_docs)]

/// The README's example, run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

mod groups;
mod host;
pub mod packing;
#[cfg(feature = "burn")]
pub mod tensor;

pub use groups::{GroupParams, QuantAxis};
pub use host::{quantize, QuantizedKv};

/// Code width.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bits {
    /// 256 levels, one code per byte.
    Eight,
    /// 16 levels, two codes per byte.
    Four,
    /// 4 levels, four codes per byte.
    Two,
}

impl Bits {
    /// Bits per code.
    pub fn count(self) -> u32 {
        match self {
            Bits::Eight => 8,
            Bits::Four => 4,
            Bits::Two => 2,
        }
    }

    /// The largest code, `2^bits - 1`.
    pub fn max_code(self) -> u32 {
        (1 << self.count()) - 1
    }

    /// From a bit count (8, 4 or 2).
    pub fn from_count(bits: u32) -> Option<Bits> {
        match bits {
            8 => Some(Bits::Eight),
            4 => Some(Bits::Four),
            2 => Some(Bits::Two),
            _ => None,
        }
    }
}

/// Quantization settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QuantConfig {
    /// Code width.
    pub bits: Bits,
    /// Elements per group along the statistics axis (the last group of an axis may be shorter).
    pub group_size: usize,
}

impl Default for QuantConfig {
    fn default() -> Self {
        QuantConfig {
            bits: Bits::Eight,
            group_size: 32,
        }
    }
}

/// Why a block cannot be quantized.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum QuantError {
    /// The data length does not match the shape, or a size is zero.
    #[error("quantization shape: {0}")]
    Shape(String),
    /// A value cannot be represented by f16 group parameters (|x| > 65000) or is not finite.
    #[error(
        "value {value} at element {index} is outside the range KIVI's f16 parameters can hold"
    )]
    OutOfRange {
        /// The value.
        value: f32,
        /// Its index in the block.
        index: usize,
    },
}
