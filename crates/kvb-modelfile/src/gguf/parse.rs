//! The GGUF container: header, metadata and tensor infos, parsed with every length bounded by the
//! bytes that remain, so a truncated or hostile file is an error, never a panic or a huge allocation.

use crate::error::{FileError, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    /// Any unsigned integer type.
    U64(u64),
    /// Any signed integer type.
    I64(i64),
    /// f32 or f64.
    F64(f64),
    /// A boolean.
    Bool(bool),
    /// A UTF-8 string.
    Str(String),
    /// An array of values of one type.
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// The value as an unsigned integer, if it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U64(v) => Some(v),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
    /// The value as a float, if numeric.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F64(v) => Some(v),
            GgufValue::U64(v) => Some(v as f64),
            GgufValue::I64(v) => Some(v as f64),
            _ => None,
        }
    }
    /// The value as a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::Str(s) => Some(s),
            _ => None,
        }
    }
    /// The value as an array.
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// ggml tensor types kvb can dequantize.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    /// 32-bit float.
    F32,
    /// 16-bit float.
    F16,
    /// bfloat16.
    Bf16,
    /// 32 weights: f16 scale, 16 bytes of 4-bit values offset by 8.
    Q4_0,
    /// 32 weights: f16 scale, f16 minimum, 16 bytes of 4-bit values.
    Q4_1,
    /// 32 weights: f16 scale, 32 fifth bits, 16 bytes of 4-bit values; 5-bit values offset by 16.
    Q5_0,
    /// 32 weights: f16 scale and min, 32 fifth bits, 16 bytes of 4-bit values.
    Q5_1,
    /// 32 weights: f16 scale, 32 signed bytes.
    Q8_0,
    /// 256 weights: 16 sub-blocks of 16 with 4-bit scales and mins, 2-bit values, f16 scale
    /// and min.
    #[allow(non_camel_case_types)]
    Q2_K,
    /// 256 weights: 16 sub-blocks of 16 with 6-bit scales offset by 32, 3-bit values offset
    /// by 4 (2 low bits and a plane of high bits), f16 scale.
    #[allow(non_camel_case_types)]
    Q3_K,
    /// 256 weights: f16 scale and min, 8 sub-blocks of 32 with 6-bit scales and mins, 4-bit values.
    #[allow(non_camel_case_types)]
    Q4_K,
    /// As Q4_K with a fifth bit per value.
    #[allow(non_camel_case_types)]
    Q5_K,
    /// 256 weights: 16 sub-blocks of 16 with int8 scales, 6-bit values offset by 32, f16 scale.
    #[allow(non_camel_case_types)]
    Q6_K,
    /// 32 weights: f16 scale, 16 bytes of 4-bit indices into a fixed table of 16 integers.
    #[allow(non_camel_case_types)]
    IQ4_NL,
    /// 256 weights: IQ4_NL's table, 8 sub-blocks of 32 with 6-bit scales offset by 32, f16
    /// scale.
    #[allow(non_camel_case_types)]
    IQ4_XS,
}

/// ggml's name of a type id (`ggml.h`'s `enum ggml_type`), for messages about types kvb does
/// not read.
fn ggml_type_name(id: u32) -> &'static str {
    const NAMES: [&str; 40] = [
        "F32",
        "F16",
        "Q4_0",
        "Q4_1",
        "Q4_2",
        "Q4_3",
        "Q5_0",
        "Q5_1",
        "Q8_0",
        "Q8_1",
        "Q2_K",
        "Q3_K",
        "Q4_K",
        "Q5_K",
        "Q6_K",
        "Q8_K",
        "IQ2_XXS",
        "IQ2_XS",
        "IQ3_XXS",
        "IQ1_S",
        "IQ4_NL",
        "IQ3_S",
        "IQ2_S",
        "IQ4_XS",
        "I8",
        "I16",
        "I32",
        "I64",
        "F64",
        "IQ1_M",
        "BF16",
        "Q4_0_4_4",
        "Q4_0_4_8",
        "Q4_0_8_8",
        "TQ1_0",
        "TQ2_0",
        "IQ4_NL_4_4",
        "IQ4_NL_4_8",
        "IQ4_NL_8_8",
        "MXFP4",
    ];
    NAMES.get(id as usize).copied().unwrap_or("an unknown type")
}

impl GgmlType {
    fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            10 => GgmlType::Q2_K,
            11 => GgmlType::Q3_K,
            12 => GgmlType::Q4_K,
            13 => GgmlType::Q5_K,
            14 => GgmlType::Q6_K,
            20 => GgmlType::IQ4_NL,
            23 => GgmlType::IQ4_XS,
            30 => GgmlType::Bf16,
            _ => return None,
        })
    }

    /// (elements per block, bytes per block).
    pub fn block(self) -> (usize, usize) {
        match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::Bf16 => (1, 2),
            GgmlType::Q4_0 => (32, 18),
            GgmlType::Q4_1 => (32, 20),
            GgmlType::Q5_0 => (32, 22),
            GgmlType::Q5_1 => (32, 24),
            GgmlType::Q8_0 => (32, 34),
            GgmlType::Q2_K => (256, 84),
            GgmlType::Q3_K => (256, 110),
            GgmlType::Q4_K => (256, 144),
            GgmlType::Q5_K => (256, 176),
            GgmlType::Q6_K => (256, 210),
            GgmlType::IQ4_NL => (32, 18),
            GgmlType::IQ4_XS => (256, 136),
        }
    }
}

/// Where one tensor lies in the file.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// Shape in PyTorch order (outermost first), i.e. ggml's `ne` reversed.
    pub shape: Vec<usize>,
    /// Storage type.
    pub ggml_type: GgmlType,
    /// Absolute byte range of the tensor's data.
    pub range: std::ops::Range<usize>,
}

/// A parsed GGUF header: metadata and tensor locations. Data stays in the caller's buffer.
#[derive(Debug, Clone)]
pub struct GgufHeader {
    /// The file the header was read from (for error messages).
    pub path: PathBuf,
    /// GGUF version (2 or 3).
    pub version: u32,
    /// Metadata by key.
    pub metadata: BTreeMap<String, GgufValue>,
    /// Tensors by their GGUF name.
    pub tensors: BTreeMap<String, TensorInfo>,
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn fail<T>(&self, what: impl std::fmt::Display) -> Result<T> {
        Err(FileError::Gguf {
            path: self.path.to_path_buf(),
            reason: format!("{what} (at byte {})", self.pos),
        })
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return self.fail(format!(
                "truncated: needed {n} bytes, {} remain",
                self.remaining()
            ));
        }
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A count of items each at least `min_item_bytes` long: refuse counts the file cannot hold.
    fn count(&mut self, what: &str, min_item_bytes: usize) -> Result<usize> {
        let n = self.u64()?;
        let limit = (self.remaining() / min_item_bytes.max(1)) as u64;
        if n > limit {
            return self.fail(format!(
                "{what} count {n} exceeds what the remaining {} bytes can hold",
                self.remaining()
            ));
        }
        Ok(n as usize)
    }

    fn string(&mut self) -> Result<String> {
        let n = self.count("string length", 1)?;
        let bytes = self.take(n)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_string()),
            Err(_) => self.fail("string is not UTF-8"),
        }
    }

    fn value(&mut self, type_id: u32, depth: usize) -> Result<GgufValue> {
        Ok(match type_id {
            0 => GgufValue::U64(self.array::<1>()?[0] as u64),
            1 => GgufValue::I64(self.array::<1>()?[0] as i8 as i64),
            2 => GgufValue::U64(u16::from_le_bytes(self.array()?) as u64),
            3 => GgufValue::I64(i16::from_le_bytes(self.array()?) as i64),
            4 => GgufValue::U64(self.u32()? as u64),
            5 => GgufValue::I64(i32::from_le_bytes(self.array()?) as i64),
            6 => GgufValue::F64(f32::from_le_bytes(self.array()?) as f64),
            7 => GgufValue::Bool(self.array::<1>()?[0] != 0),
            8 => GgufValue::Str(self.string()?),
            9 => {
                if depth > 2 {
                    return self.fail("arrays nested too deep");
                }
                let item_type = self.u32()?;
                let min = match item_type {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    9 => 12,
                    other => return self.fail(format!("unknown array item type {other}")),
                };
                let n = self.count("array", min)?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(item_type, depth + 1)?);
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::U64(self.u64()?),
            11 => GgufValue::I64(i64::from_le_bytes(self.array()?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array()?)),
            other => return self.fail(format!("unknown metadata value type {other}")),
        })
    }
}

impl GgufHeader {
    /// Parses the header of a GGUF file held in `bytes`.
    pub fn parse(bytes: &[u8], path: &Path) -> Result<Self> {
        let mut c = Cursor {
            bytes,
            pos: 0,
            path,
        };
        if c.take(4)? != b"GGUF" {
            return c.fail("not a GGUF file (bad magic)");
        }
        let version = c.u32()?;
        if !(2..=3).contains(&version) {
            return c.fail(format!("GGUF version {version} is not supported (2 or 3)"));
        }
        // A tensor info is at least 8 (name length) + 4 + 4 + 8 bytes; a metadata entry at least 13.
        let n_tensors = c.count("tensor", 24)?;
        let n_meta = c.count("metadata", 13)?;
        let mut metadata = BTreeMap::new();
        for _ in 0..n_meta {
            let key = c.string()?;
            let t = c.u32()?;
            let v = c.value(t, 0)?;
            metadata.insert(key, v);
        }
        let mut raw = Vec::with_capacity(n_tensors);
        for _ in 0..n_tensors {
            let name = c.string()?;
            let n_dims = c.u32()? as usize;
            if n_dims == 0 || n_dims > 4 {
                return c.fail(format!(
                    "tensor `{name}` has {n_dims} dimensions (1 to 4 allowed)"
                ));
            }
            let mut ne = Vec::with_capacity(n_dims);
            for _ in 0..n_dims {
                ne.push(c.u64()?);
            }
            let type_id = c.u32()?;
            let offset = c.u64()?;
            raw.push((name, ne, type_id, offset));
        }
        let alignment = metadata
            .get("general.alignment")
            .and_then(GgufValue::as_u64)
            .unwrap_or(32) as usize;
        if alignment == 0 || !alignment.is_power_of_two() {
            return c.fail(format!(
                "general.alignment {alignment} is not a power of two"
            ));
        }
        let data_start = c.pos.div_ceil(alignment) * alignment;
        let mut tensors = BTreeMap::new();
        for (name, ne, type_id, offset) in raw {
            let Some(ggml_type) = GgmlType::from_id(type_id) else {
                return c.fail(format!(
                    "tensor `{name}` is stored as {} (ggml type {type_id}), which kvb does not read; \
                     it reads F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, \
                     Q5_K, Q6_K, IQ4_NL and IQ4_XS (files such as Q4_K_M, Q5_K_M, Q6_K, Q8_0, \
                     Q3_K_M, Q2_K and IQ4_XS)",
                    ggml_type_name(type_id)
                ));
            };
            let count = ne
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .filter(|&n| n > 0);
            let (per_block, block_bytes) = ggml_type.block();
            let Some(count) = count else {
                return c.fail(format!("tensor `{name}` has dimensions {ne:?}"));
            };
            if ne[0] % per_block as u64 != 0 {
                return c.fail(format!(
                    "tensor `{name}` rows of {} do not fill {per_block}-element blocks",
                    ne[0]
                ));
            }
            let size = (count / per_block as u64).checked_mul(block_bytes as u64);
            let start = (data_start as u64).checked_add(offset);
            let end = match (start, size) {
                (Some(s), Some(z)) => s.checked_add(z),
                _ => None,
            };
            match (start, end) {
                (Some(s), Some(e)) if e <= bytes.len() as u64 => {
                    tensors.insert(
                        name,
                        TensorInfo {
                            shape: ne.iter().rev().map(|&d| d as usize).collect(),
                            ggml_type,
                            range: s as usize..e as usize,
                        },
                    );
                }
                _ => {
                    return c.fail(format!(
                        "tensor `{name}` data (offset {offset}) lies beyond the end of the {}-byte file",
                        bytes.len()
                    ))
                }
            }
        }
        Ok(GgufHeader {
            path: path.to_path_buf(),
            version,
            metadata,
            tensors,
        })
    }

    /// A metadata value, or an error naming the missing key.
    pub fn get(&self, key: &str) -> Result<&GgufValue> {
        self.metadata.get(key).ok_or_else(|| FileError::Gguf {
            path: self.path.clone(),
            reason: format!("metadata key `{key}` is missing"),
        })
    }
}
