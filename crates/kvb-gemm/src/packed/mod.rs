//! Weights kept in their stored precision: a `[k, n]` projection of 4- to 8-bit integers with
//! scales, or of 16-bit floats (f16, bf16), laid out for products that dequantize as they go.
//!
//! A decode step or a warm request multiplies a few rows by every weight of the model, so its
//! cost is the bytes of weights streamed: f32 weights stream 32 bits per weight, a GGUF's Q4_K
//! 4.5. [`PackedMatrix`] keeps a GGUF's K-quant blocks (Q2_K to Q6_K) and IQ4_XS blocks at the
//! file's bits per weight (within 4%: [`kcells`]), its Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and IQ4_NL
//! blocks at the file's bits too (4.5, 5, 5.5, 6, 8.5 and 4.5: their f16 scales kept,
//! [`Scales`]; 5-bit values in [`five_bits`]' cells; a fused
//! projection mixing such formats widens its scales to f32), f16 and bf16 tensors (a GGUF's or
//! a safetensors folder's) at 16 bits, and can round f32 weights to 8 bits
//! ([`PackedMatrix::quantize_q8_0`]) or to bf16 ([`PackedMatrix::round_to_bf16`]).
//! Block types with no cells of their own are widened, exactly, into cells that hold their
//! values: Q3_K beside Q6_K in one projection into Q6_K's. One projection of two K-quant types
//! (given to [`PackedMatrix::from_blocks`] together) takes Q6_K's cells for Q3_K beside Q6_K,
//! else 4- or 8-bit cells with f32 scales.
//!
//! **The same values as the f32 path.** Every stored weight is `q * scale + offset` with the
//! product exact ([`kvb_modelfile::gguf::blocks`]), so dequantizing with a fused multiply-add or with a
//! multiply and an add gives the one f32 that [`kvb_modelfile::gguf::dequantize`] gives. A product over packed weights therefore
//! computes, bit for bit, what the same product computes over the weights expanded to f32
//! (`tests::dequantized_values_equal_the_gguf_expansion`,
//! `tests::k_quant_cells_equal_the_gguf_expansion`, and the model-level tests in
//! `tests/packed_weights.rs` and `tests/llama_cpp_files.rs`): the precision saves memory and
//! bandwidth, never changes an output.
//!
//! A 16-bit float widens to f32 exactly, so the same holds for f16 and bf16 cells.
//!
//! Layout: output columns in groups of 8 (the last padded), each group's reduction in cells of
//! 32 rows (16 where a part has 16-weight sub-blocks; 256, one block, for K-quant cells). A cell
//! of Q4_0/Q4_1/Q8_0 integers holds the 8 columns' scales and offsets ([`Scales`]: the file's
//! f16 numbers, or f32), then the rows x 8 values, 8 bytes per row of the cell so one 8-byte load
//! feeds one 8-lane vector: for 4-bit values a byte holds rows `2r` (low nibble) and `2r + 1`
//! (high nibble); for 8-bit values a signed byte holds one row. A cell of 16-bit floats holds
//! only its rows x 8 values (16 bytes per row).
//! K-quant cells are laid out in [`kcells`].
//! A group's cells are consecutive, so a product reads each group as one stream.
//!
//! Parts of one fused projection stored in different formats are kept apart, each as stored,
//! by the model (kvb-model's `Stacked` weight); [`PackedMatrix::from_blocks`] given such a mix
//! widens them to one cell type that holds them all.

mod dequant;
pub(crate) mod five_bits;
pub(crate) mod kcells;
#[cfg(target_arch = "x86_64")]
pub(crate) mod kcells_bytes;
pub(crate) mod kcells_order;
mod pages;
pub(crate) use pages::Pages;
pub use pages::{mapped_bytes, reset_mapped_peak};

#[cfg(target_arch = "x86_64")]
pub(crate) use dequant::avx2::{head, head_lanes, iq4_rows, widen_floats};
#[cfg(target_arch = "x86_64")]
pub(crate) use dequant::avx512::{bytes16, head_pair, widen16, widen_pair};
#[cfg(target_arch = "x86_64")]
pub(crate) use dequant::{prefetch_cell, AHEAD};

use kvb_modelfile::gguf::blocks::{self, Coded, IQ4_VALUES};
use kvb_modelfile::gguf::GgmlType;
use kvb_modelfile::{FileError, Result};
use rayon::prelude::*;
use std::borrow::Borrow;

pub use kcells_order::CellOrder;

/// Rows of the reduction per cell at most (ggml's block of 32; Q6_K's sub-blocks take 16).
pub const CELL_ROWS: usize = 32;
/// Output columns per group (one 8-lane f32 vector).
pub const GROUP: usize = 8;
/// How an integer cell of 32 rows (not a K-quant's) stores its 8 columns' scales and offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scales {
    /// f32 scales, then f32 offsets (64 bytes): any values, such as a mix of formats widened
    /// together or `--weights q8_0`'s.
    F32,
    /// The file's f16 scales, then its f16 offsets (32 bytes): Q4_1's `d` and `m`.
    Half,
    /// The file's f16 scales, the offsets `-8 * scale` (16 bytes): Q4_0.
    HalfCentred,
    /// The file's f16 scales, no offsets (16 bytes): Q8_0.
    HalfOnly,
}

impl Scales {
    /// Bytes before the values.
    pub const fn head_bytes(self) -> usize {
        self.head_bytes_of(GROUP)
    }

    /// Bytes of a head of `lanes` columns (the 8-bit products' blocks have 16).
    pub(crate) const fn head_bytes_of(self, lanes: usize) -> usize {
        match self {
            Scales::F32 => 2 * lanes * 4,
            Scales::Half => 2 * lanes * 2,
            Scales::HalfCentred | Scales::HalfOnly => lanes * 2,
        }
    }

    /// The scales the cells of tensors of `t` keep as the file holds them, if every value's
    /// scale and offset are the block's f16 numbers (or derived from them exactly).
    fn of_file(t: GgmlType) -> Option<Scales> {
        match t {
            GgmlType::Q4_0 => Some(Scales::HalfCentred),
            GgmlType::Q4_1 | GgmlType::Q5_1 => Some(Scales::Half),
            GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::IQ4_NL => Some(Scales::HalfOnly),
            _ => None,
        }
    }

    /// Lane `lane`'s scale and offset in `cell` (the offset exactly as the file's block
    /// defines it: `-8 * d` for Q4_0, `-0.0` for Q8_0).
    pub(crate) fn read(self, cell: &[u8], lane: usize) -> (f32, f32) {
        self.read_of(GROUP, cell, lane)
    }

    /// [`Scales::read`] from a head of `lanes` columns.
    pub(crate) fn read_of(self, lanes: usize, cell: &[u8], lane: usize) -> (f32, f32) {
        let f32_at =
            |o: usize| f32::from_le_bytes([cell[o], cell[o + 1], cell[o + 2], cell[o + 3]]);
        let f16_at = |o: usize| half::f16::from_le_bytes([cell[o], cell[o + 1]]).to_f32();
        match self {
            Scales::F32 => (f32_at(lane * 4), f32_at(lanes * 4 + lane * 4)),
            Scales::Half => (f16_at(lane * 2), f16_at(lanes * 2 + lane * 2)),
            Scales::HalfCentred => {
                let d = f16_at(lane * 2);
                (d, -8.0 * d)
            }
            Scales::HalfOnly => (f16_at(lane * 2), -0.0),
        }
    }

    /// Stores lane `lane`'s scale and offset; `false` where this head cannot hold them
    /// exactly.
    fn write(self, cell: &mut [u8], lane: usize, scale: f32, offset: f32) -> bool {
        self.write_of(GROUP, cell, lane, scale, offset)
    }

    /// [`Scales::write`] into a head of `lanes` columns.
    pub(crate) fn write_of(
        self,
        lanes: usize,
        cell: &mut [u8],
        lane: usize,
        scale: f32,
        offset: f32,
    ) -> bool {
        let half = |v: f32| half::f16::from_f32(v);
        match self {
            Scales::F32 => {
                cell[lane * 4..lane * 4 + 4].copy_from_slice(&scale.to_le_bytes());
                let o = lanes * 4 + lane * 4;
                cell[o..o + 4].copy_from_slice(&offset.to_le_bytes());
            }
            _ => {
                cell[lane * 2..lane * 2 + 2].copy_from_slice(&half(scale).to_le_bytes());
                if self == Scales::Half {
                    let o = lanes * 2 + lane * 2;
                    cell[o..o + 2].copy_from_slice(&half(offset).to_le_bytes());
                }
            }
        }
        let (s, o) = self.read_of(lanes, cell, lane);
        s.to_bits() == scale.to_bits() && o.to_bits() == offset.to_bits()
    }
}

/// How a cell stores its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CellValues {
    /// Unsigned 4-bit values, two rows per byte.
    Nibbles(Scales),
    /// IQ4_NL blocks at the file's bits: [`CellValues::Nibbles`] with the file's f16 scales,
    /// each nibble an index into IQ4's table (`d * table[q]`).
    Iq4Nl,
    /// Q5_0 and Q5_1 blocks at the file's bits: [`CellValues::Nibbles`] with a plane of fifth
    /// bits ([`five_bits`]); Q5_0's (with [`Scales::HalfOnly`]) are `q - 16`.
    FiveBits(Scales),
    /// Signed 8-bit values.
    Bytes(Scales),
    /// bf16 values (the top half of an f32), no scale.
    Bf16,
    /// IEEE half-precision values, no scale.
    F16,
    /// Q4_K blocks at the file's bits: 256-row cells ([`kcells`]).
    Q4K,
    /// Q5_K blocks: 256-row cells with a plane of fifth bits ([`kcells`]).
    Q5K,
    /// Q6_K blocks: 256-row cells with a plane of top bit pairs, signed values ([`kcells`]).
    Q6K,
    /// Q3_K blocks: 256-row cells of bit pairs with a plane of third bits, signed values
    /// ([`kcells`]).
    Q3K,
    /// Q2_K blocks: 256-row cells of bit pairs, a 4-bit scale and min per 16 rows
    /// ([`kcells`]).
    Q2K,
    /// IQ4_XS blocks: 256-row cells of nibbles indexing IQ4's table, a signed scale per 32 rows
    /// ([`kcells`]).
    IQ4XS,
}

impl CellValues {
    /// The 16-bit float cells that keep tensors of `t`, if `t` is a 16-bit float type.
    fn of_float(t: GgmlType) -> Option<CellValues> {
        match t {
            GgmlType::Bf16 => Some(CellValues::Bf16),
            GgmlType::F16 => Some(CellValues::F16),
            _ => None,
        }
    }

    /// The K-quant cells that keep tensors of `t` at the file's bits, if `t` is a K-quant.
    fn of_k_quant(t: GgmlType) -> Option<CellValues> {
        match t {
            GgmlType::Q2_K => Some(CellValues::Q2K),
            GgmlType::Q3_K => Some(CellValues::Q3K),
            GgmlType::Q4_K => Some(CellValues::Q4K),
            GgmlType::Q5_K => Some(CellValues::Q5K),
            GgmlType::Q6_K => Some(CellValues::Q6K),
            GgmlType::IQ4_XS => Some(CellValues::IQ4XS),
            _ => None,
        }
    }

    /// The K-quant cells that keep every one of `types` exactly: their own where they share
    /// one, else Q6_K's for Q3_K beside Q6_K (a Q3_K_M file's fused attention: Q6_K's 6-bit
    /// cells hold Q3_K's values, and its sub-blocks are Q3_K's 16 rows).
    fn of_k_quants(types: impl IntoIterator<Item = GgmlType>) -> Option<CellValues> {
        let mut kinds = types.into_iter().map(CellValues::of_k_quant);
        let first = kinds.next()??;
        kinds.try_fold(first, |held, next| match (held, next?) {
            (a, b) if a == b => Some(a),
            (CellValues::Q3K | CellValues::Q6K, CellValues::Q3K | CellValues::Q6K) => {
                Some(CellValues::Q6K)
            }
            _ => None,
        })
    }

    /// Whether cells of this type are blocks of [`kcells::ROWS`] rows: a K-quant's, or
    /// IQ4_XS's (laid out as theirs).
    pub fn is_k_quant(self) -> bool {
        matches!(
            self,
            CellValues::Q2K
                | CellValues::Q3K
                | CellValues::Q4K
                | CellValues::Q5K
                | CellValues::Q6K
                | CellValues::IQ4XS
        )
    }

    /// Whether the values are integers with scales (not 16-bit floats).
    pub fn is_integer(self) -> bool {
        !matches!(self, CellValues::Bf16 | CellValues::F16)
    }

    /// Bytes before a cell's values: the scales and offsets of integer cells.
    pub fn head_bytes(self) -> usize {
        match self {
            CellValues::Nibbles(s) | CellValues::FiveBits(s) | CellValues::Bytes(s) => {
                s.head_bytes()
            }
            CellValues::Iq4Nl => Scales::HalfOnly.head_bytes(),
            CellValues::Bf16 | CellValues::F16 => 0,
            CellValues::Q2K
            | CellValues::Q3K
            | CellValues::Q4K
            | CellValues::Q5K
            | CellValues::Q6K
            | CellValues::IQ4XS => kcells::head_bytes(self),
        }
    }

    /// Bytes of the values of a cell of `rows` rows (K-quant cells: always 256).
    pub fn value_bytes(self, rows: usize) -> usize {
        match self {
            CellValues::Nibbles(_) | CellValues::Iq4Nl => rows * GROUP / 2,
            CellValues::FiveBits(_) => rows * GROUP / 2 + rows * GROUP / 8,
            CellValues::Bytes(_) => rows * GROUP,
            CellValues::Bf16 | CellValues::F16 => rows * GROUP * 2,
            CellValues::Q2K
            | CellValues::Q3K
            | CellValues::Q4K
            | CellValues::Q5K
            | CellValues::Q6K
            | CellValues::IQ4XS => kcells::value_bytes(self),
        }
    }

    /// Rows sharing one scale and offset: a K-quant's sub-block (32, or 16 for Q2_K, Q3_K and
    /// Q6_K), else
    /// the whole cell.
    pub fn sub_rows(self, cell_rows: usize) -> usize {
        if self.is_k_quant() {
            kcells::Layout::of(self).sub_rows
        } else {
            cell_rows
        }
    }

    /// Bytes of a cell of `rows` rows: scales and offsets where it has them, values.
    pub fn cell_bytes(self, rows: usize) -> usize {
        self.head_bytes() + self.value_bytes(rows)
    }

    /// Whether the vector kernels (AVX2 and FMA, and F16C for f16 cells) run on this CPU; where
    /// they do not, the portable loops compute the same values.
    pub fn vectorised(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            // f16 cells, the K-quants' f16 scales and the file's f16 scales widen with F16C.
            let halves = match self {
                CellValues::Nibbles(s) | CellValues::FiveBits(s) | CellValues::Bytes(s) => {
                    s != Scales::F32
                }
                _ => matches!(self, CellValues::F16 | CellValues::Iq4Nl) || self.is_k_quant(),
            };
            crate::has_fma() && (!halves || crate::cpu().f16c)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }
}

pub use kvb_modelfile::BlockTensor;

/// A `[k, n]` projection weight in 4-, 8- or 16-bit cells (see the module doc).
#[derive(Clone)]
pub struct PackedMatrix {
    values: CellValues,
    /// Reduction rows per cell: 32, or 16; 256 for K-quant cells.
    cell_rows: usize,
    k: usize,
    n: usize,
    /// `n.div_ceil(GROUP)` groups of `k / cell_rows` cells.
    data: pages::Pages,
    /// What the values came from, for messages (`q4_1`, `q8_0` ...).
    source: &'static str,
    /// Where K-quant cells keep their rows' bits: [`CellOrder::Dot`] only in a matrix the
    /// 8-bit products hold ([`PackedMatrix::in_dot_order`]), which the f32 products refuse.
    order: CellOrder,
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
        GgmlType::Q5_0 => "q5_0",
        GgmlType::Q5_1 => "q5_1",
        GgmlType::Q8_0 => "q8_0",
        GgmlType::Q2_K => "q2_k",
        GgmlType::Q3_K => "q3_k",
        GgmlType::Q4_K => "q4_k",
        GgmlType::Q5_K => "q5_k",
        GgmlType::Q6_K => "q6_k",
        GgmlType::IQ4_NL => "iq4_nl",
        GgmlType::IQ4_XS => "iq4_xs",
        GgmlType::F32 => "f32",
        GgmlType::F16 => "f16",
        GgmlType::Bf16 => "bf16",
    }
}

impl PackedMatrix {
    /// Packs stored tensors stacked along their rows (fused projections: q, k and v one after
    /// the other) into one `[cols, sum of rows]` weight, as stored: 4-bit cells if every part
    /// holds 4-bit integers, else 8-bit cells; 16-row cells if a part's sub-blocks are 16 long;
    /// 16-bit float cells if every part holds the same 16-bit float type.
    pub fn from_blocks<T: Borrow<BlockTensor>>(parts: &[T]) -> Result<Self> {
        let parts: Vec<&BlockTensor> = parts.iter().map(Borrow::borrow).collect();
        let Some(first) = parts.first().copied() else {
            return Err(FileError::Weights("a projection with no weights".into()));
        };
        if let Some(values) = CellValues::of_float(first.ggml_type) {
            return Self::from_floats(values, &parts);
        }
        if let Some(values) = CellValues::of_k_quants(parts.iter().map(|p| p.ggml_type)) {
            return Self::from_k_quants(values, &parts);
        }
        let k = first.cols;
        for &p in &parts {
            let (per_block, block_bytes) = p.ggml_type.block();
            if !BlockTensor::packable(p.ggml_type)
                || p.cols != k
                || k % per_block != 0
                || p.bytes.len() != p.rows * k / per_block * block_bytes
            {
                return Err(FileError::Weights(format!(
                    "cannot keep a {} tensor of [{}, {}] packed (parts must share their input \
                     width, whole blocks, in a quantized format)",
                    type_name(p.ggml_type),
                    p.rows,
                    p.cols
                )));
            }
        }
        // One format of 32-weight blocks keeps the file's f16 scales; a mix is widened to f32.
        let scales = match Scales::of_file(first.ggml_type) {
            Some(s) if parts.iter().all(|p| p.ggml_type == first.ggml_type) => s,
            _ => Scales::F32,
        };
        let one_type = parts.iter().all(|p| p.ggml_type == first.ggml_type);
        let values = if parts.iter().all(|p| p.ggml_type == GgmlType::IQ4_NL) {
            CellValues::Iq4Nl
        } else if one_type && matches!(first.ggml_type, GgmlType::Q5_0 | GgmlType::Q5_1) {
            CellValues::FiveBits(scales)
        } else if parts.iter().any(|p| blocks::wider_than_4_bits(p.ggml_type)) {
            CellValues::Bytes(scales)
        } else {
            CellValues::Nibbles(scales)
        };
        let cell_rows = parts
            .iter()
            .map(|p| blocks::sub_block_len(p.ggml_type))
            .min()
            .unwrap_or(CELL_ROWS);
        let n: usize = parts.iter().map(|p| p.rows).sum();
        let source = if parts.iter().all(|p| p.ggml_type == first.ggml_type) {
            type_name(first.ggml_type)
        } else {
            "mixed"
        };
        let mut out = PackedMatrix::zeroed(values, cell_rows, k, n, source);
        let rows: Vec<(GgmlType, &[u8])> = parts
            .iter()
            .flat_map(|p| {
                let (per_block, block_bytes) = p.ggml_type.block();
                let row = p.bytes.chunks_exact(k / per_block * block_bytes);
                row.map(|r| (p.ggml_type, r))
            })
            .collect();
        if Self::copies(first.ggml_type, values) {
            out.copy_file_groups(first.ggml_type, &rows);
        } else {
            out.fill_groups(&rows, |&(t, row), coded| {
                for b in row.chunks_exact(t.block().1) {
                    blocks::decode(t, b, coded);
                }
            });
        }
        Ok(out)
    }

    /// Whether [`PackedMatrix::copy_file_groups`] stores blocks of `t` as cells of `values`.
    fn copies(t: GgmlType, values: CellValues) -> bool {
        matches!(
            (t, values),
            (GgmlType::Q8_0, CellValues::Bytes(Scales::HalfOnly))
                | (GgmlType::Q4_0, CellValues::Nibbles(Scales::HalfCentred))
                | (GgmlType::Q4_1, CellValues::Nibbles(Scales::Half))
        )
    }

    /// Stores Q8_0, Q4_0 or Q4_1 columns (`rows[j]`: column `j`'s blocks of `t`) byte for
    /// byte: a cell's head takes its 8 blocks' f16 scales (and Q4_1's minimums), its values
    /// their bytes (Q8_0) or nibbles reordered two rows a byte. What
    /// [`PackedMatrix::fill_groups`] stores, without decoding each weight on the way
    /// (`tests::file_blocks_copy_as_decoded`).
    fn copy_file_groups(&mut self, t: GgmlType, rows: &[(GgmlType, &[u8])]) {
        let block_bytes = t.block().1;
        let (cell_bytes, scales) = (self.cell_bytes(), Scales::of_file(t).expect("copies"));
        let head = scales.head_bytes();
        // Block bytes before the values: the scale, and Q4_1's minimum.
        let heads = if scales == Scales::Half { 4 } else { 2 };
        let group_bytes = self.k / CELL_ROWS * cell_bytes;
        self.data
            .par_chunks_mut(group_bytes)
            .zip(rows.par_chunks(GROUP))
            .for_each(|(cells, lanes)| {
                for (b, cell) in cells.chunks_exact_mut(cell_bytes).enumerate() {
                    let (cell_head, values) = cell.split_at_mut(head);
                    for (lane, &(_, row)) in lanes.iter().enumerate() {
                        let block = &row[b * block_bytes..(b + 1) * block_bytes];
                        cell_head[2 * lane..2 * lane + 2].copy_from_slice(&block[..2]);
                        if heads == 4 {
                            let m = 2 * GROUP + 2 * lane;
                            cell_head[m..m + 2].copy_from_slice(&block[2..4]);
                        }
                        let qs = &block[heads..];
                        if t == GgmlType::Q8_0 {
                            for (r, &q) in qs.iter().enumerate() {
                                values[r * GROUP + lane] = q;
                            }
                            continue;
                        }
                        // The file's byte i holds weights i (low) and i + 16 (high); a cell's
                        // byte m holds rows 2m (low) and 2m + 1 (high).
                        let nibble = |w: usize| (qs[w % 16] >> (4 * (w / 16))) & 0x0f;
                        for m in 0..CELL_ROWS / 2 {
                            values[m * GROUP + lane] = nibble(2 * m) | nibble(2 * m + 1) << 4;
                        }
                    }
                }
            });
    }

    /// Stores the columns of `rows` (`rows[j]` is column `j`), group by group in parallel:
    /// `decode(row, coded)` appends that column's `k` weights to `coded` (a 1B model's Q8_0
    /// weights took 7 s on one core a column at a time).
    fn fill_groups<R: Sync>(&mut self, rows: &[R], decode: impl Fn(&R, &mut Vec<Coded>) + Sync) {
        let (values, cell_rows, k) = (self.values, self.cell_rows, self.k);
        let group_bytes = k / cell_rows * self.cell_bytes();
        self.data
            .par_chunks_mut(group_bytes)
            .zip(rows.par_chunks(GROUP))
            .for_each_init(
                || Vec::with_capacity(k),
                |coded, (cells, lanes)| {
                    for (lane, row) in lanes.iter().enumerate() {
                        coded.clear();
                        decode(row, coded);
                        put_lane(values, cell_rows, cells, lane, coded);
                    }
                },
            );
    }

    /// K-quant parts, every one of a type `values` keeps ([`CellValues::of_k_quants`]), at the
    /// file's bits or Q3_K's widened beside Q6_K ([`kcells`]).
    fn from_k_quants(values: CellValues, parts: &[&BlockTensor]) -> Result<Self> {
        let (t, k) = (parts[0].ggml_type, parts[0].cols);
        let per_block = t.block().0;
        for p in parts {
            let block_bytes = p.ggml_type.block().1;
            if p.cols != k
                || k % per_block != 0
                || p.bytes.len() != p.rows * k / per_block * block_bytes
            {
                return Err(FileError::Weights(format!(
                    "cannot keep a {} tensor of [{}, {}] packed ({} bytes; parts must share their \
                     input width and hold whole blocks of {per_block})",
                    type_name(p.ggml_type),
                    p.rows,
                    p.cols,
                    p.bytes.len()
                )));
            }
        }
        let n: usize = parts.iter().map(|p| p.rows).sum();
        let source = match parts.iter().all(|p| p.ggml_type == t) {
            true => type_name(t),
            false => "mixed",
        };
        let mut out = PackedMatrix::zeroed(values, kcells::ROWS, k, n, source);
        let rows: Vec<(GgmlType, &[u8])> = parts
            .iter()
            .flat_map(|p| {
                let row_bytes = k / per_block * p.ggml_type.block().1;
                p.bytes.chunks_exact(row_bytes).map(|r| (p.ggml_type, r))
            })
            .collect();
        let cell_bytes = out.cell_bytes();
        let group_bytes = k / per_block * cell_bytes;
        // Each group's cells are its own bytes: the groups are re-laid in parallel (a 1B
        // model's weights took a second on one core).
        out.data
            .par_chunks_mut(group_bytes)
            .enumerate()
            .for_each(|(g, cells)| {
                let lanes = &rows[g * GROUP..((g + 1) * GROUP).min(rows.len())];
                for (c, cell) in cells.chunks_exact_mut(cell_bytes).enumerate() {
                    let blocks: Vec<blocks::KBlock> = lanes
                        .iter()
                        .map(|&(t, row)| {
                            let block_bytes = t.block().1;
                            blocks::KBlock::read(t, &row[c * block_bytes..(c + 1) * block_bytes])
                        })
                        .collect();
                    kcells::put(values, cell, &blocks);
                }
            });
        Ok(out)
    }

    /// 16-bit float parts, every one of the type `values` keeps, with whole cells of 32 rows.
    fn from_floats(values: CellValues, parts: &[&BlockTensor]) -> Result<Self> {
        let (first, k) = (parts[0].ggml_type, parts[0].cols);
        for p in parts {
            if p.ggml_type != first
                || p.cols != k
                || k % CELL_ROWS != 0
                || p.bytes.len() != p.rows * k * 2
            {
                return Err(FileError::Weights(format!(
                    "cannot keep a {} tensor of [{}, {}] packed with {} parts (parts must share \
                     their type and their input width, a multiple of {CELL_ROWS})",
                    type_name(p.ggml_type),
                    p.rows,
                    p.cols,
                    type_name(first)
                )));
            }
        }
        let n: usize = parts.iter().map(|p| p.rows).sum();
        let mut out = PackedMatrix::zeroed(values, CELL_ROWS, k, n, type_name(first));
        let rows: Vec<&[u8]> = parts
            .iter()
            .flat_map(|p| p.bytes.chunks_exact(k * 2))
            .collect();
        let group_bytes = k / CELL_ROWS * out.cell_bytes();
        out.data
            .par_chunks_mut(group_bytes)
            .zip(rows.par_chunks(GROUP))
            .for_each(|(cells, lanes)| {
                for (lane, row) in lanes.iter().enumerate() {
                    put_float_lane(values, cells, lane, row);
                }
            });
        Ok(out)
    }

    /// Rounds f32 weights (stacked along rows like [`PackedMatrix::quantize_q8_0`]) to bf16,
    /// to nearest, ties to even. Lossy (8 bits of mantissa), unlike packing stored bf16.
    pub fn round_to_bf16(parts: &[(&[f32], usize)], cols: usize) -> Result<Self> {
        let tensors: Vec<BlockTensor> = parts
            .iter()
            .map(|(data, rows)| BlockTensor {
                ggml_type: GgmlType::Bf16,
                rows: *rows,
                cols,
                bytes: data
                    .iter()
                    .take(rows * cols)
                    .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                    .collect(),
            })
            .collect();
        let mut out = Self::from_blocks(&tensors)?;
        out.source = "bf16 (from f32)";
        Ok(out)
    }

    /// Quantizes f32 weights (PyTorch layout `[rows, cols]`, stacked along rows like
    /// [`PackedMatrix::from_blocks`]) to 8 bits per weight with an f32 scale per 32, as
    /// llama.cpp's Q8_0 does (`d = max |w| / 127`, `q = round(w / d)`). Lossy, unlike packing.
    pub fn quantize_q8_0(parts: &[(&[f32], usize)], cols: usize) -> Result<Self> {
        if cols == 0 || !cols.is_multiple_of(CELL_ROWS) {
            return Err(FileError::Weights(format!(
                "cannot quantize a projection of {cols} inputs to q8_0 (needs a multiple of 32)"
            )));
        }
        let n: usize = parts.iter().map(|(_, rows)| rows).sum();
        let mut out = PackedMatrix::zeroed(
            CellValues::Bytes(Scales::F32),
            CELL_ROWS,
            cols,
            n,
            "q8_0 (from f32)",
        );
        let rows: Vec<&[f32]> = parts
            .iter()
            .flat_map(|(data, rows)| data.chunks_exact(cols).take(*rows))
            .collect();
        out.fill_groups(&rows, |row, coded| {
            for w in row.chunks_exact(CELL_ROWS) {
                let amax = w.iter().fold(0f32, |a, v| a.max(v.abs()));
                let d = amax / 127.0;
                let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
                coded.extend(w.iter().map(|v| Coded {
                    scale: d,
                    offset: -0.0,
                    q: (v * inv).round().clamp(-127.0, 127.0) as i8,
                }));
            }
        });
        Ok(out)
    }

    fn zeroed(
        values: CellValues,
        cell_rows: usize,
        k: usize,
        n: usize,
        source: &'static str,
    ) -> Self {
        let cells = n.div_ceil(GROUP) * (k / cell_rows);
        PackedMatrix {
            values,
            cell_rows,
            k,
            n,
            data: pages::Pages::zeroed(cells * values.cell_bytes(cell_rows)),
            source,
            order: CellOrder::Rows,
        }
    }

    /// Where this matrix's K-quant cells keep their rows' bits.
    pub fn order(&self) -> CellOrder {
        self.order
    }

    /// This matrix of K-quant cells (in row order) with every cell re-laid in the order the
    /// 8-bit products read ([`CellOrder::for_int8`]; [`kcells_order`]), in place: the same
    /// bytes and bits, in other places.
    pub(crate) fn in_dot_order(mut self) -> PackedMatrix {
        self.assert_dot_order_takes();
        let (values, cell_bytes) = (self.values, self.cell_bytes());
        self.data
            .par_chunks_mut(cell_bytes)
            .for_each(|cell| kcells_order::to_dot_order(values, cell));
        self.order = CellOrder::Dot;
        self
    }

    /// [`PackedMatrix::in_dot_order`] of a copy of this matrix, in one pass: each cell is
    /// re-laid by the thread that copies it, while it is in that core's cache.
    pub(crate) fn dot_order_copy(&self) -> PackedMatrix {
        self.assert_dot_order_takes();
        let (values, cell_bytes) = (self.values, self.cell_bytes());
        let mut data = pages::Pages::zeroed(self.data.len());
        data.par_chunks_mut(cell_bytes)
            .zip(self.data.par_chunks(cell_bytes))
            .for_each(|(cell, loaded)| {
                cell.copy_from_slice(loaded);
                kcells_order::to_dot_order(values, cell)
            });
        PackedMatrix {
            values,
            cell_rows: self.cell_rows,
            k: self.k,
            n: self.n,
            data,
            source: self.source,
            order: CellOrder::Dot,
        }
    }

    fn assert_dot_order_takes(&self) {
        assert!(
            self.values.is_k_quant()
                && CellOrder::for_int8(self.values) == CellOrder::Dot
                && self.order == CellOrder::Rows,
            "re-laying {:?} cells of {} in dot order",
            self.values,
            self.source
        );
    }

    /// Panics where the cells are in the 8-bit products' order: the f32 products and the
    /// expansions read row order.
    fn assert_row_order(&self, what: &str) {
        assert_eq!(
            self.order,
            CellOrder::Rows,
            "{what} of {}: its cells are in the 8-bit products' order",
            self.source
        );
    }

    fn cell_bytes(&self) -> usize {
        self.values.cell_bytes(self.cell_rows)
    }

    /// Byte offset of cell `c` (reduction rows `c * cell_rows..`) of group `g`.
    fn cell_at(&self, g: usize, c: usize) -> usize {
        (g * (self.k / self.cell_rows) + c) * self.cell_bytes()
    }

    /// Gives back the memory of groups `groups` (columns `8 g..`) to the system, for a
    /// conversion that has read them and consumes the matrix: their cells read as zeros
    /// afterwards, except on the pages they share with the groups beside them.
    pub(crate) fn release_groups(&mut self, groups: std::ops::Range<usize>) {
        let range = self.cell_at(groups.start, 0)..self.cell_at(groups.end, 0);
        self.data.release(range);
    }

    /// How the cells store their values.
    pub fn cell_values(&self) -> CellValues {
        self.values
    }

    /// Reduction rows per cell (32, or 16; 256 for K-quant cells).
    pub fn cell_rows(&self) -> usize {
        self.cell_rows
    }

    /// The cells of column group `g` (columns `8 g..8 g + 8`), consecutive over the reduction.
    pub fn group_cells(&self, g: usize) -> &[u8] {
        let per_group = self.k / self.cell_rows * self.cell_bytes();
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

    /// Every column, one after the other: the weights as f32 in PyTorch's layout `[n, k]` (an
    /// embedding table's rows).
    pub fn to_torch_layout(&self) -> Vec<f32> {
        (0..self.n).flat_map(|j| self.column(j)).collect()
    }

    /// Column `j` (one output feature: a row of the PyTorch weight, a token's embedding) as
    /// f32, all `k` values.
    pub fn column(&self, j: usize) -> Vec<f32> {
        let (g, lane, rows) = (j / GROUP, j % GROUP, self.cell_rows);
        let mut out = Vec::with_capacity(self.k);
        for c in 0..self.k / rows {
            let at = self.cell_at(g, c);
            let cell = &self.data[at..at + self.cell_bytes()];
            out.extend((0..rows).map(|r| dequant::value(self.values, self.order, cell, r, lane)));
        }
        out
    }

    /// Column `j`'s reduction rows `32 b..32 b + 32` as stored, for re-laying the weight out
    /// ([`crate::int8::IntDotMatrix`]): their scale and offset, and their integers in `q` (4-
    /// and 5-bit values unsigned, 8-bit values signed); `None` for 16-bit float cells and where
    /// 32 rows do not share one scale (cells of 16 rows, Q2_K, Q3_K, Q6_K).
    pub(crate) fn stored_integers(&self, j: usize, b: usize, q: &mut [i16]) -> Option<(f32, f32)> {
        const RUN: usize = 32;
        if !self.values.is_integer() || self.values.sub_rows(self.cell_rows) != RUN {
            return None;
        }
        let (g, lane) = (j / GROUP, j % GROUP);
        let (c, r0) = (b * RUN / self.cell_rows, b * RUN % self.cell_rows);
        let at = self.cell_at(g, c);
        let cell = &self.data[at..at + self.cell_bytes()];
        if self.values.is_k_quant() {
            let mut scales = (0.0, 0.0);
            for (r, q) in q.iter_mut().take(RUN).enumerate() {
                let (v, scale, offset) = kcells::parts(self.values, self.order, cell, r0 + r, lane);
                (*q, scales) = (v as i16, (scale, offset));
            }
            return Some(scales);
        }
        let scales = match self.values {
            CellValues::Nibbles(s) | CellValues::FiveBits(s) | CellValues::Bytes(s) => s,
            CellValues::Iq4Nl => Scales::HalfOnly,
            _ => return None,
        };
        let v = &cell[scales.head_bytes()..];
        for (r, q) in q.iter_mut().take(RUN).enumerate() {
            let nibble = || (v[r / 2 * GROUP + lane] >> (4 * (r % 2))) & 0x0f;
            *q = match self.values {
                CellValues::Nibbles(_) => nibble() as i16,
                CellValues::FiveBits(s) => five_bits::value(s, v, r, lane) as i16,
                CellValues::Iq4Nl => IQ4_VALUES[nibble() as usize] as i16,
                _ => v[r * GROUP + lane] as i8 as i16,
            };
        }
        Some(scales.read(cell, lane))
    }

    /// Writes columns `j0..j0 + cols` (`j0` a multiple of [`GROUP`]) of cells `c0..c1`
    /// (reduction rows `c0 * cell_rows..c1 * cell_rows`) as f32 into `out`, row-major with row
    /// stride `stride` (at least `cols` rounded up to [`GROUP`]; the lanes past `cols` receive
    /// padding values).
    pub fn dequantize_into(
        &self,
        (c0, c1): (usize, usize),
        (j0, cols): (usize, usize),
        out: &mut [f32],
        stride: usize,
    ) {
        assert!(
            j0 % GROUP == 0
                && c0 <= c1
                && j0 + cols <= self.n.div_ceil(GROUP) * GROUP
                && stride >= cols.div_ceil(GROUP) * GROUP
                && c1 <= self.k / self.cell_rows
                && out.len() >= (c1 - c0) * self.cell_rows * stride,
            "dequantize_into: bounds"
        );
        self.assert_row_order("dequantize_into");
        let cell_bytes = self.cell_bytes();
        let cells = |g: usize| {
            let from = self.cell_at(g, c0);
            &self.data[from..from + (c1 - c0) * cell_bytes]
        };
        let (g0, g1) = (j0 / GROUP, (j0 + cols).div_ceil(GROUP));
        let mut g = g0;
        // Two groups at a time where the CPU has 16-lane vectors (the same values).
        if dequant::pairs_vectorised(self.values) {
            while g + 2 <= g1 {
                let at = &mut out[(g - g0) * GROUP..];
                dequant::pair(
                    self.values,
                    self.cell_rows,
                    [cells(g), cells(g + 1)],
                    at,
                    stride,
                );
                g += 2;
            }
        }
        for g in g..g1 {
            let at = &mut out[(g - g0) * GROUP..];
            dequant::group(self.values, self.cell_rows, cells(g), at, stride);
        }
    }

    /// Every weight as f32, row-major `[k, n]` (for backends that do not run packed products).
    pub fn to_dense(&self) -> Vec<f32> {
        let n8 = self.n.div_ceil(GROUP) * GROUP;
        let mut padded = vec![0f32; self.k * n8];
        self.dequantize_into((0, self.k / self.cell_rows), (0, self.n), &mut padded, n8);
        if n8 == self.n {
            return padded;
        }
        padded
            .chunks_exact(n8)
            .flat_map(|row| row[..self.n].iter().copied())
            .collect()
    }
}

/// Stores `row`'s `k` 16-bit floats (little-endian bytes) as lane `lane` of a group's `cells`
/// of 16-bit values.
fn put_float_lane(values: CellValues, cells: &mut [u8], lane: usize, row: &[u8]) {
    let cell_bytes = values.cell_bytes(CELL_ROWS);
    for (cell, run) in cells
        .chunks_exact_mut(cell_bytes)
        .zip(row.chunks_exact(CELL_ROWS * 2))
    {
        for (r, value) in run.chunks_exact(2).enumerate() {
            let o = (r * GROUP + lane) * 2;
            cell[o..o + 2].copy_from_slice(value);
        }
    }
}

/// Stores a column's weights `coded` as lane `lane` of a group's `cells` of integers (each
/// cell's run of `cell_rows` shares one scale and offset).
fn put_lane(values: CellValues, cell_rows: usize, cells: &mut [u8], lane: usize, coded: &[Coded]) {
    let (scales, nibbles) = match values {
        CellValues::Nibbles(s) => (s, true),
        CellValues::FiveBits(s) => (s, false),
        CellValues::Bytes(s) => (s, false),
        CellValues::Iq4Nl => (Scales::HalfOnly, true),
        _ => unreachable!("16-bit and K-quant cells are filled by their own puts"),
    };
    // IQ4_NL's weights are table entries; its cells keep their nibbles.
    let nibble = |q: i8| {
        if values == CellValues::Iq4Nl {
            kcells::iq4_index(q)
        } else {
            q as u8 & 0x0f
        }
    };
    let cell_bytes = values.cell_bytes(cell_rows);
    for (cell, run) in cells
        .chunks_exact_mut(cell_bytes)
        .zip(coded.chunks_exact(cell_rows))
    {
        debug_assert!(run
            .iter()
            .all(|w| w.scale.to_bits() == run[0].scale.to_bits()
                && w.offset.to_bits() == run[0].offset.to_bits()));
        let exact = scales.write(cell, lane, run[0].scale, run[0].offset);
        debug_assert!(exact, "{scales:?} cannot hold {:?}", run[0]);
        let cell_values = &mut cell[scales.head_bytes()..];
        for (r, w) in run.iter().enumerate() {
            if let CellValues::FiveBits(s) = values {
                five_bits::put(s, cell_values, r, lane, w.q);
            } else if nibbles {
                cell_values[r / 2 * GROUP + lane] |= nibble(w.q) << (4 * (r % 2));
            } else {
                cell_values[r * GROUP + lane] = w.q as u8;
            }
        }
    }
}

#[cfg(test)]
mod tests;

/// The blocked GEMM expands a packed weight straight into its panels, block by block; its
/// reduction blocks (256 rows) are whole cells, so any panel is a run of cells.
impl crate::WeightPanels for PackedMatrix {
    fn panel(&self, k0: usize, rows: usize, j0: usize, cols: usize, out: &mut [f32]) {
        let cell = self.cell_rows;
        self.dequantize_into((k0 / cell, (k0 + rows) / cell), (j0, cols), out, crate::NR);
    }
}
