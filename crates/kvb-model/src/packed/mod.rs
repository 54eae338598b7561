//! Weights kept in their stored precision: a `[k, n]` projection of 4- or 8-bit integers with
//! a scale and an offset per 32 weights, laid out for products that dequantize as they go.
//!
//! A decode step or a warm request multiplies a few rows by every weight of the model, so its
//! cost is the bytes of weights streamed: f32 weights stream 32 bits per weight, a GGUF's Q4_1
//! 5. [`PackedMatrix`] keeps a GGUF's Q4_0, Q4_1 and Q8_0 blocks at 6 and 10 bits per weight
//! (the scale and offset widened to f32) and can quantize f32 weights to 8 bits
//! ([`PackedMatrix::quantize_q8_0`]).
//!
//! **The same values as the f32 path.** Every stored weight is `scale * q + offset` with the
//! product exact (an f16 scale times an integer of at most 8 bits fits in f32's 24-bit
//! mantissa), so dequantizing with a fused multiply-add or with a multiply and an add gives the
//! one f32 that [`crate::gguf::dequantize`] gives. A product over packed weights therefore
//! computes, bit for bit, what the same product computes over the weights expanded to f32
//! (`tests::dequantized_values_equal_the_gguf_expansion`, and the model-level test in
//! `tests/packed_weights.rs`): the precision saves memory and bandwidth, never changes an output.
//!
//! Layout: output columns in groups of 8 (the last padded), each group's reduction in cells of
//! 32 rows. A cell holds the 8 columns' scales (f32), their offsets (f32) and the 32 x 8 values,
//! 8 bytes per row of the cell so one 8-byte load feeds one 8-lane vector: for 4-bit values a
//! byte holds rows `2r` (low nibble) and `2r + 1` (high nibble); for 8-bit values a signed byte
//! holds one row. A group's cells are consecutive, so a product reads each group as one stream.

mod dequant;

use crate::error::{ModelError, Result};
use crate::gguf::GgmlType;

/// Rows of the reduction per cell (ggml's block of 32).
pub const CELL_ROWS: usize = 32;
/// Output columns per group (one 8-lane f32 vector).
pub const GROUP: usize = 8;
/// Bytes of a cell's scales and offsets.
pub const HEAD_BYTES: usize = 2 * GROUP * 4;

/// How a cell stores its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CellValues {
    /// Unsigned 4-bit values, two rows per byte.
    Nibbles,
    /// Signed 8-bit values.
    Bytes,
}

impl CellValues {
    /// Bytes of the values of one cell.
    pub fn value_bytes(self) -> usize {
        match self {
            CellValues::Nibbles => CELL_ROWS * GROUP / 2,
            CellValues::Bytes => CELL_ROWS * GROUP,
        }
    }

    /// Bytes of one cell: scales, offsets, values.
    pub fn cell_bytes(self) -> usize {
        HEAD_BYTES + self.value_bytes()
    }
}

/// A GGUF tensor as stored: `rows` output features of `cols` inputs, each row a run of ggml
/// blocks of 32 weights (PyTorch's `[out, in]` layout, blockwise).
#[derive(Debug, Clone, PartialEq)]
pub struct BlockTensor {
    /// The block format.
    pub ggml_type: GgmlType,
    /// Output features.
    pub rows: usize,
    /// Input features (a multiple of 32).
    pub cols: usize,
    /// `rows * cols / 32` blocks.
    pub bytes: Vec<u8>,
}

impl BlockTensor {
    /// Whether [`PackedMatrix`] keeps this format as stored.
    pub fn packable(ggml_type: GgmlType) -> bool {
        matches!(ggml_type, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0)
    }

    /// The values as f32, row-major `[rows, cols]`.
    pub fn to_f32(&self) -> Vec<f32> {
        crate::gguf::dequantize(self.ggml_type, &self.bytes)
    }
}

/// One ggml block read apart: `value = scale * q + offset` for each of its 32 `q`.
struct Block {
    scale: f32,
    offset: f32,
    q: [i8; CELL_ROWS],
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Reads one stored block (`bytes` is exactly one block of a packable type).
fn read_block(ggml_type: GgmlType, bytes: &[u8]) -> Block {
    let mut q = [0i8; CELL_ROWS];
    match ggml_type {
        GgmlType::Q4_0 | GgmlType::Q4_1 => {
            let (scale, offset, qs) = if ggml_type == GgmlType::Q4_0 {
                // (q - 8) * d = d * q + (-8 d): -8 d is exact, and so is the sum's rounding.
                let d = f16_at(bytes, 0);
                (d, -8.0 * d, &bytes[2..18])
            } else {
                (f16_at(bytes, 0), f16_at(bytes, 2), &bytes[4..20])
            };
            for (i, &b) in qs.iter().enumerate() {
                q[i] = (b & 0x0f) as i8;
                q[i + 16] = (b >> 4) as i8;
            }
            Block { scale, offset, q }
        }
        _ => {
            // Q8_0: `d * q` exactly; adding -0.0 keeps every value, signed zeros included.
            for (dst, &b) in q.iter_mut().zip(&bytes[2..34]) {
                *dst = b as i8;
            }
            Block {
                scale: f16_at(bytes, 0),
                offset: -0.0,
                q,
            }
        }
    }
}

/// A `[k, n]` projection weight in 4- or 8-bit cells (see the module doc).
#[derive(Clone)]
pub struct PackedMatrix {
    values: CellValues,
    k: usize,
    n: usize,
    /// `n.div_ceil(GROUP)` groups of `k / CELL_ROWS` cells.
    data: Vec<u8>,
    /// What the values came from, for messages (`q4_1`, `q8_0` ...).
    source: &'static str,
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PackedMatrix({} [{}, {}], {} bytes)",
            self.source,
            self.k,
            self.n,
            self.data.len()
        )
    }
}

fn type_name(t: GgmlType) -> &'static str {
    match t {
        GgmlType::Q4_0 => "q4_0",
        GgmlType::Q4_1 => "q4_1",
        GgmlType::Q8_0 => "q8_0",
        GgmlType::F32 => "f32",
        GgmlType::F16 => "f16",
        GgmlType::Bf16 => "bf16",
    }
}

impl PackedMatrix {
    /// Packs stored tensors stacked along their rows (fused projections: q, k and v one after
    /// the other) into one `[cols, sum of rows]` weight, as stored: 4-bit cells if every part
    /// is 4-bit, else 8-bit cells (4-bit values fit).
    pub fn from_blocks(parts: &[BlockTensor]) -> Result<Self> {
        let Some(first) = parts.first() else {
            return Err(ModelError::Weights("a projection with no weights".into()));
        };
        let k = first.cols;
        for p in parts {
            let (per_block, block_bytes) = p.ggml_type.block();
            if !BlockTensor::packable(p.ggml_type)
                || p.cols != k
                || k % CELL_ROWS != 0
                || per_block != CELL_ROWS
                || p.bytes.len() != p.rows * k / CELL_ROWS * block_bytes
            {
                return Err(ModelError::Weights(format!(
                    "cannot keep a {} tensor of [{}, {}] packed (parts must share their input \
                     width, a multiple of 32, in Q4_0, Q4_1 or Q8_0)",
                    type_name(p.ggml_type),
                    p.rows,
                    p.cols
                )));
            }
        }
        let values = if parts.iter().all(|p| p.ggml_type != GgmlType::Q8_0) {
            CellValues::Nibbles
        } else {
            CellValues::Bytes
        };
        let n: usize = parts.iter().map(|p| p.rows).sum();
        let source = if parts.iter().all(|p| p.ggml_type == first.ggml_type) {
            type_name(first.ggml_type)
        } else {
            "mixed"
        };
        let mut out = PackedMatrix::zeroed(values, k, n, source);
        let blocks_per_row = k / CELL_ROWS;
        let mut j = 0;
        for p in parts {
            let block_bytes = p.ggml_type.block().1;
            for row in p.bytes.chunks_exact(blocks_per_row * block_bytes) {
                for (c, b) in row.chunks_exact(block_bytes).enumerate() {
                    out.put(j, c, &read_block(p.ggml_type, b));
                }
                j += 1;
            }
        }
        Ok(out)
    }

    /// Quantizes f32 weights (PyTorch layout `[rows, cols]`, stacked along rows like
    /// [`PackedMatrix::from_blocks`]) to 8 bits per weight with an f32 scale per 32, as
    /// llama.cpp's Q8_0 does (`d = max |w| / 127`, `q = round(w / d)`). Lossy, unlike packing.
    pub fn quantize_q8_0(parts: &[(&[f32], usize)], cols: usize) -> Result<Self> {
        if cols == 0 || cols % CELL_ROWS != 0 {
            return Err(ModelError::Weights(format!(
                "cannot quantize a projection of {cols} inputs to q8_0 (needs a multiple of 32)"
            )));
        }
        let n: usize = parts.iter().map(|(_, rows)| rows).sum();
        let mut out = PackedMatrix::zeroed(CellValues::Bytes, cols, n, "q8_0 (from f32)");
        let mut j = 0;
        for (data, rows) in parts {
            for row in data.chunks_exact(cols).take(*rows) {
                for (c, w) in row.chunks_exact(CELL_ROWS).enumerate() {
                    let amax = w.iter().fold(0f32, |a, v| a.max(v.abs()));
                    let d = amax / 127.0;
                    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
                    let mut q = [0i8; CELL_ROWS];
                    for (dst, v) in q.iter_mut().zip(w) {
                        *dst = (v * inv).round().clamp(-127.0, 127.0) as i8;
                    }
                    out.put(
                        j,
                        c,
                        &Block {
                            scale: d,
                            offset: -0.0,
                            q,
                        },
                    );
                }
                j += 1;
            }
        }
        Ok(out)
    }

    fn zeroed(values: CellValues, k: usize, n: usize, source: &'static str) -> Self {
        let cells = n.div_ceil(GROUP) * (k / CELL_ROWS);
        PackedMatrix {
            values,
            k,
            n,
            data: vec![0u8; cells * values.cell_bytes()],
            source,
        }
    }

    /// Byte offset of cell `c` (reduction rows `32 c..32 c + 32`) of group `g`.
    fn cell_at(&self, g: usize, c: usize) -> usize {
        (g * (self.k / CELL_ROWS) + c) * self.values.cell_bytes()
    }

    /// Stores block `b` as column `j`'s cell `c`.
    fn put(&mut self, j: usize, c: usize, b: &Block) {
        let (g, lane) = (j / GROUP, j % GROUP);
        let at = self.cell_at(g, c);
        let cell = &mut self.data[at..at + self.values.cell_bytes()];
        cell[lane * 4..lane * 4 + 4].copy_from_slice(&b.scale.to_le_bytes());
        let o = GROUP * 4 + lane * 4;
        cell[o..o + 4].copy_from_slice(&b.offset.to_le_bytes());
        let values = &mut cell[HEAD_BYTES..];
        match self.values {
            CellValues::Nibbles => {
                for r in 0..CELL_ROWS / 2 {
                    values[r * GROUP + lane] =
                        (b.q[2 * r] as u8 & 0x0f) | ((b.q[2 * r + 1] as u8) << 4);
                }
            }
            CellValues::Bytes => {
                for (r, &q) in b.q.iter().enumerate() {
                    values[r * GROUP + lane] = q as u8;
                }
            }
        }
    }

    /// How the cells store their values.
    pub fn cell_values(&self) -> CellValues {
        self.values
    }

    /// The cells of column group `g` (columns `8 g..8 g + 8`), consecutive over the reduction.
    pub fn group_cells(&self, g: usize) -> &[u8] {
        let per_group = self.k / CELL_ROWS * self.values.cell_bytes();
        &self.data[g * per_group..(g + 1) * per_group]
    }

    /// The reduction length (input features).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Output features.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// What the values were packed from (`q4_1`, `q8_0`, `mixed` ...).
    pub fn source(&self) -> &'static str {
        self.source
    }

    /// Column `j` (one output feature: a row of the PyTorch weight, a token's embedding) as
    /// f32, all `k` values.
    pub fn column(&self, j: usize) -> Vec<f32> {
        let (g, lane) = (j / GROUP, j % GROUP);
        let mut out = Vec::with_capacity(self.k);
        for c in 0..self.k / CELL_ROWS {
            let at = self.cell_at(g, c);
            let cell = &self.data[at..at + self.values.cell_bytes()];
            let f = |o: usize| f32::from_le_bytes([cell[o], cell[o + 1], cell[o + 2], cell[o + 3]]);
            let (scale, offset) = (f(lane * 4), f(GROUP * 4 + lane * 4));
            let values = &cell[HEAD_BYTES..];
            for r in 0..CELL_ROWS {
                let q = match self.values {
                    CellValues::Nibbles => (values[r / 2 * GROUP + lane] >> (4 * (r % 2))) & 0x0f,
                    CellValues::Bytes => values[r * GROUP + lane],
                };
                let q = if self.values == CellValues::Bytes {
                    q as i8 as f32
                } else {
                    q as f32
                };
                out.push(q * scale + offset);
            }
        }
        out
    }

    /// Writes columns `j0..j0 + cols` (`j0` a multiple of [`GROUP`]) of reduction rows
    /// `32 c0..32 c1` as f32 into `out`, row-major with row stride `stride` (at least `cols`
    /// rounded up to [`GROUP`]; the lanes past `cols` receive padding values).
    pub fn dequantize_into(
        &self,
        (c0, c1): (usize, usize),
        (j0, cols): (usize, usize),
        out: &mut [f32],
        stride: usize,
    ) {
        assert!(
            j0 % GROUP == 0
                && j0 + cols <= self.n.div_ceil(GROUP) * GROUP
                && stride >= cols.div_ceil(GROUP) * GROUP
                && c1 <= self.k / CELL_ROWS
                && out.len() >= (c1 - c0) * CELL_ROWS * stride,
            "dequantize_into: bounds"
        );
        let cell_bytes = self.values.cell_bytes();
        for (i, g) in (j0 / GROUP..(j0 + cols).div_ceil(GROUP)).enumerate() {
            let from = self.cell_at(g, c0);
            let cells = &self.data[from..from + (c1 - c0) * cell_bytes];
            dequant::group(self.values, cells, &mut out[i * GROUP..], stride);
        }
    }

    /// Every weight as f32, row-major `[k, n]` (for backends that do not run packed products).
    pub fn to_dense(&self) -> Vec<f32> {
        let n8 = self.n.div_ceil(GROUP) * GROUP;
        let mut padded = vec![0f32; self.k * n8];
        self.dequantize_into((0, self.k / CELL_ROWS), (0, self.n), &mut padded, n8);
        if n8 == self.n {
            return padded;
        }
        padded
            .chunks_exact(n8)
            .flat_map(|row| row[..self.n].iter().copied())
            .collect()
    }
}

#[cfg(test)]
mod tests;
