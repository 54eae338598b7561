//! A packed integer weight re-laid out for byte dot products: columns in groups of 16 (one
//! vector of i32 sums), each group's reduction in blocks of 32 rows. A group holds first the
//! heads of its blocks, then their values. A head is the 16 columns' scales and offsets as the
//! packed weight keeps them ([`Scales`]: the file's f16 numbers for Q4_0, Q4_1 and Q8_0, so the
//! matrix is the file's size; f32 for `--weights q8_0`). Values are unsigned bytes, 4 reduction
//! rows per column side by side (what `vpdpbusd` multiplies into one i32 lane):
//! - 4-bit values (Q4_0, Q4_1): 4 runs of 64 bytes; byte `lane * 4 + i` of run `c` holds row
//!   `4c + i` in its low nibble and row `16 + 4c + i` in its high nibble;
//! - 8-bit values (Q8_0, `--weights q8_0`): 8 runs of 64 bytes; byte `lane * 4 + i` of run `t`
//!   holds row `4t + i` as `q + 128` (the products subtract 128 times the activations' block
//!   sum, exactly, in integers).
//!
//! Heads apart from values keep every run of values on whole cache lines (a 34-byte Q8_0 block
//! per column would split them). Groups follow one another, so a product reads a range of
//! columns as two streams, heads and values.
//!
//! K-quant cells (Q2_K to Q6_K, IQ4_XS) keep their blocks and bits: their products read the
//! cells ([`super::kcells`]), Q2_K's and Q3_K's shared as loaded, the others' nibbles and high
//! bits moved into the byte dot products' order ([`PackedMatrix::order`]; the same bytes).

use super::{BLOCK, LANES};
use crate::packed::{CellOrder, CellValues, PackedMatrix, Pages, Scales, GROUP};
use rayon::prelude::*;
use std::sync::Arc;

/// A `[k, n]` weight for 8-bit activation products (see the module doc).
#[derive(Clone)]
pub struct IntDotMatrix {
    /// 4-bit values (else 8-bit).
    pub(super) nibbles: bool,
    /// How the heads hold the scales and offsets.
    pub(super) scales: Scales,
    /// Whether any block has a nonzero offset (Q4_1, Q4_K); without, products skip the term.
    pub(super) has_offsets: bool,
    pub(super) k: usize,
    pub(super) n: usize,
    data: Pages,
    source: &'static str,
    /// K-quant cells (in the order the products read, [`CellOrder::for_int8`]) in place of
    /// `data`.
    pub(super) kcells: Option<Arc<PackedMatrix>>,
}

impl std::fmt::Debug for IntDotMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "IntDotMatrix({} [{}, {}], {} bytes)",
            self.source,
            self.k,
            self.n,
            self.data.len()
        )
    }
}

impl IntDotMatrix {
    /// Whether [`IntDotMatrix::from_packed`] takes `p`: integers sharing a scale per 32 rows,
    /// or K-quant cells (whose sub-blocks of 16, Q2_K's, Q3_K's and Q6_K's, take the 8-bit
    /// rows' sums per 16).
    pub fn takes(p: &PackedMatrix) -> bool {
        let values = p.cell_values();
        values.is_k_quant() || (values.is_integer() && values.sub_rows(p.cell_rows()) == BLOCK)
    }

    /// `p` re-laid out (K-quant cells: shared as they are where the products read them so, else
    /// a copy in their order), or `None` where [`IntDotMatrix::takes`] does not take it.
    pub fn from_packed(p: &Arc<PackedMatrix>) -> Option<Self> {
        if !Self::takes(p) {
            return None;
        }
        if p.cell_values().is_k_quant() {
            if CellOrder::for_int8(p.cell_values()) == CellOrder::Dot {
                return Some(Self::sharing(Arc::new(p.dot_order_copy())));
            }
            return Some(Self::sharing(p.clone()));
        }
        let mut w = Self::empty(p);
        let all = w.data.len();
        w.has_offsets = w.fill(p, 0, all);
        Some(w)
    }

    /// [`IntDotMatrix::from_packed`] of a matrix nothing else holds, giving its memory back to
    /// the system as the layout fills, so the two are never both whole (a 1B model's tied
    /// embedding is 279 MB in Q8_0); `p` back where it is not taken.
    pub fn from_packed_consuming(p: PackedMatrix) -> Result<Self, PackedMatrix> {
        // About 16 MB a step: the most held twice.
        Self::consuming(p, 16 << 20)
    }

    /// [`IntDotMatrix::from_packed_consuming`], giving memory back every `step_bytes`.
    pub(super) fn consuming(mut p: PackedMatrix, step_bytes: usize) -> Result<Self, PackedMatrix> {
        if !Self::takes(&p) {
            return Err(p);
        }
        if p.cell_values().is_k_quant() {
            if CellOrder::for_int8(p.cell_values()) == CellOrder::Dot {
                return Ok(Self::sharing(Arc::new(p.in_dot_order())));
            }
            return Ok(Self::sharing(Arc::new(p)));
        }
        let mut w = Self::empty(&p);
        let groups = w.n.div_ceil(LANES);
        let per_group = w.data.len() / groups.max(1);
        let step = (step_bytes / per_group.max(1)).max(1);
        let packed_groups = w.n.div_ceil(GROUP);
        for g0 in (0..groups).step_by(step) {
            let g1 = (g0 + step).min(groups);
            w.has_offsets |= w.fill(&p, g0 * per_group, g1 * per_group);
            let to_packed = |g: usize| (g * LANES / GROUP).min(packed_groups);
            p.release_groups(to_packed(g0)..to_packed(g1));
        }
        Ok(w)
    }

    /// [`IntDotMatrix::from_packed_consuming`] of `p` where nothing else holds it (re-laid in
    /// its own pages), else [`IntDotMatrix::from_packed`] of it (a copy; `p` stays as it is);
    /// `p` back where [`IntDotMatrix::takes`] does not take it.
    pub fn from_held(p: Arc<PackedMatrix>) -> Result<Self, Arc<PackedMatrix>> {
        match Arc::try_unwrap(p) {
            Ok(m) => Self::from_packed_consuming(m).map_err(Arc::new),
            Err(p) => Self::from_packed(&p).ok_or(p),
        }
    }

    /// The matrix holding K-quant cells `p` (in the order its products read).
    fn sharing(p: Arc<PackedMatrix>) -> Self {
        IntDotMatrix {
            nibbles: false,
            scales: Scales::F32,
            has_offsets: false,
            k: p.k(),
            n: p.n(),
            data: Pages::zeroed(0),
            source: p.source(),
            kcells: Some(p),
        }
    }

    /// Zeroed room for `p` (integer cells of 32 rows) re-laid out.
    fn empty(p: &PackedMatrix) -> Self {
        let (nibbles, scales) = match p.cell_values() {
            CellValues::Nibbles(s) => (true, s),
            // 5-bit values as bytes, as they were held before their own cells (the same bits).
            CellValues::Bytes(s) | CellValues::FiveBits(s) => (false, s),
            // Its table's entries are 8-bit values.
            CellValues::Iq4Nl => (false, Scales::HalfOnly),
            other => unreachable!("{other:?} cells are K-quants' or floats, not taken"),
        };
        let (k, n) = (p.k(), p.n());
        let block = scales.head_bytes_of(LANES) + Self::value_bytes_of(nibbles);
        IntDotMatrix {
            nibbles,
            scales,
            has_offsets: false,
            k,
            n,
            data: Pages::zeroed(n.div_ceil(LANES) * k / BLOCK * block),
            source: p.source(),
            kcells: None,
        }
    }

    /// Fills the groups in bytes `from..to` of the layout (whole groups) from `p`, group by
    /// group in parallel (a 1B model's Q8_0 weights took 6 s on one core); whether any of
    /// their blocks has an offset.
    fn fill(&mut self, p: &PackedMatrix, from: usize, to: usize) -> bool {
        self.fill_from(p, from, to, true)
    }

    /// [`IntDotMatrix::fill`]; `copy_bytes` lets 8-bit cells with f16 scales (Q8_0's) be
    /// copied byte by byte rather than read and written a weight at a time (the same bytes:
    /// `tests::copied_bytes_are_the_decoded_layout`).
    fn fill_from(&mut self, p: &PackedMatrix, from: usize, to: usize, copy_bytes: bool) -> bool {
        let copy = copy_bytes
            && p.cell_values() == CellValues::Bytes(Scales::HalfOnly)
            && p.cell_rows() == BLOCK;
        let (nibbles, scales, n) = (self.nibbles, self.scales, self.n);
        let blocks = self.k / BLOCK;
        let (head, values) = (self.head_bytes(), self.value_bytes());
        let per_group = blocks * (head + values);
        self.data[from..to]
            .par_chunks_mut(per_group)
            .enumerate()
            .map(|(i, group)| {
                let g = from / per_group + i;
                let (heads, group_values) = group.split_at_mut(blocks * head);
                let mut q = [0i16; BLOCK];
                let mut offsets = false;
                for (lane, j) in (g * LANES..n.min((g + 1) * LANES)).enumerate() {
                    if copy {
                        copy_half_bytes(p, j, lane, heads, group_values, (head, values));
                        continue;
                    }
                    let blocks = heads
                        .chunks_exact_mut(head)
                        .zip(group_values.chunks_exact_mut(values));
                    for (b, (head, values)) in blocks.enumerate() {
                        let (scale, offset) = p
                            .stored_integers(j, b, &mut q)
                            .expect("`takes` found integers sharing a scale per 32 rows");
                        offsets |= offset != 0.0;
                        let exact = scales.write_of(LANES, head, lane, scale, offset);
                        debug_assert!(exact, "{scales:?} cannot hold {scale}, {offset}");
                        put(nibbles, values, lane, &q);
                    }
                }
                offsets
            })
            .reduce(|| false, |a, b| a || b)
    }

    /// The layout of `p`'s integer cells, filled with or without [`copy_half_bytes`].
    #[cfg(test)]
    pub(super) fn layout_of(p: &PackedMatrix, copy_bytes: bool) -> Vec<u8> {
        let mut w = Self::empty(p);
        let all = w.data.len();
        w.fill_from(p, 0, all, copy_bytes);
        w.data.to_vec()
    }

    fn value_bytes_of(nibbles: bool) -> usize {
        if nibbles {
            BLOCK * LANES / 2
        } else {
            BLOCK * LANES
        }
    }

    /// Bytes of one block's head (its 16 columns' scales and offsets).
    pub(super) fn head_bytes(&self) -> usize {
        self.scales.head_bytes_of(LANES)
    }

    /// Bytes of one block's values.
    pub(super) fn value_bytes(&self) -> usize {
        Self::value_bytes_of(self.nibbles)
    }

    /// Group `g` (columns `16 g..16 g + 16`): its blocks' heads, then their values.
    pub(super) fn group(&self, g: usize) -> (&[u8], &[u8]) {
        let blocks = self.k / BLOCK;
        let heads = blocks * self.head_bytes();
        let per_group = heads + blocks * self.value_bytes();
        self.data[g * per_group..(g + 1) * per_group].split_at(heads)
    }

    /// Block `b` of column `j`: its scale, offset and stored integers (as [`PackedMatrix`] holds
    /// them: 4-bit values unsigned, 8-bit values signed).
    pub(super) fn stored(&self, j: usize, b: usize) -> (f32, f32, [i32; BLOCK]) {
        let (g, lane) = (j / LANES, j % LANES);
        let (heads, values) = self.group(g);
        let (head, bytes) = (self.head_bytes(), self.value_bytes());
        let (scale, offset) = self.scales.read_of(LANES, &heads[b * head..], lane);
        let values = &values[b * bytes..(b + 1) * bytes];
        let q = std::array::from_fn(|r| {
            if self.nibbles {
                let byte = values[((r % 16) / 4) * 64 + lane * 4 + r % 4];
                ((byte >> (4 * (r >= 16) as u8)) & 0x0f) as i32
            } else {
                values[(r / 4) * 64 + lane * 4 + r % 4] as i32 - 128
            }
        });
        (scale, offset, q)
    }

    /// Column `j` (a token's embedding when the matrix is a tied embedding) as f32: the values
    /// [`PackedMatrix::column`] gives (`q * scale + offset`, the product exact).
    pub fn column(&self, j: usize) -> Vec<f32> {
        if let Some(p) = &self.kcells {
            return p.column(j);
        }
        let mut out = Vec::with_capacity(self.k);
        for b in 0..self.k / BLOCK {
            let (scale, offset, q) = self.stored(j, b);
            out.extend(q.iter().map(|&q| q as f32 * scale + offset));
        }
        out
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
        self.kcells.as_ref().map_or(self.data.len(), |p| p.bytes())
    }

    /// What the values were packed from (`q4_1`, `q8_0` ...).
    pub fn source(&self) -> &'static str {
        self.source
    }
}

/// Column `j` of `p`'s 8-bit cells with f16 scales as lane `lane` of a group's `heads` and
/// `values` (blocks of `sizes` bytes each): the scale's bits as they are, each value biased
/// by 128 as [`put`] stores it.
fn copy_half_bytes(
    p: &PackedMatrix,
    j: usize,
    lane: usize,
    heads: &mut [u8],
    values: &mut [u8],
    sizes: (usize, usize),
) {
    let (cells, lane_in_cell) = (p.group_cells(j / GROUP), j % GROUP);
    let cell_bytes = p.cell_values().cell_bytes(BLOCK);
    let scale_bytes = Scales::HalfOnly.head_bytes();
    let blocks = heads
        .chunks_exact_mut(sizes.0)
        .zip(values.chunks_exact_mut(sizes.1))
        .zip(cells.chunks_exact(cell_bytes));
    for ((head, values), cell) in blocks {
        head[2 * lane..2 * lane + 2].copy_from_slice(&cell[2 * lane_in_cell..2 * lane_in_cell + 2]);
        let q = &cell[scale_bytes..];
        for r in 0..BLOCK {
            values[(r / 4) * 64 + lane * 4 + r % 4] = q[r * GROUP + lane_in_cell] ^ 0x80;
        }
    }
}

/// Stores column `lane`'s integers `q` in `values` (one block of one group).
fn put(nibbles: bool, values: &mut [u8], lane: usize, q: &[i16; BLOCK]) {
    for (r, &v) in q.iter().enumerate() {
        if nibbles {
            let (run, i, high) = ((r % 16) / 4, r % 4, r >= 16);
            values[run * 64 + lane * 4 + i] |= (v as u8 & 0x0f) << (4 * high as u8);
        } else {
            values[(r / 4) * 64 + lane * 4 + r % 4] = (v + 128) as u8;
        }
    }
}
