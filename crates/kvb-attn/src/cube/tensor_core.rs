//! The paged attention kernel on tensor cores (CubeCL's cooperative matrices: WMMA on CUDA), for
//! rows that come many to a sequence: prefill, a suffix after cached K/V, CacheBlend's rows.
//!
//! One cube per (work item, q head); its planes (warps) take 16 query rows each. K/V tiles of
//! [`KEYS`] keys are staged in shared memory through the sequence's block table, as in
//! [`super::kernel`]. Scores `Q K^T` and the output `P V` are 16x16x16 matrix products with f16
//! or bf16 inputs and f32 sums. The softmax is two passes over the keys: the first finds each
//! row's max and sum, the second forms the final weights `P` (rounded once to the tensors' type,
//! as the products need) and sums `P V` in accumulators that stay in registers to the end,
//! never rescaled. Recomputing `Q K^T` costs a third more products; a one-pass online softmax
//! would instead round-trip the output through shared memory at every tile.

use super::plan::ITEM_FIELDS;
use cubecl::prelude::*;

/// Query rows per plane: the products' M.
pub(crate) const PLANE_ROWS: usize = 16;

/// Keys per tile staged in shared memory. With head dim 128 and four planes the cube takes
/// 47 KiB of shared memory (padding included), under the 48 KiB a CUDA launch gets unasked.
pub(crate) const KEYS: usize = 32;

/// Half-precision elements added to each staged row of Q, K and V, and f32 elements to each row
/// of scores: rows 16 bytes apart in the banks, so a fragment's 16 rows do not all hit one bank.
/// Both keep every fragment's start 32-byte aligned, as WMMA loads need.
const PAD: usize = 8;
const SCORE_PAD: usize = 4;

/// A score below any real one.
const NEG_BIG: f32 = -1.0e30;

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn paged_attention_mma_kernel<F: Float, I: Numeric, A: Float>(
    q: &Tensor<F>,         // [1, q_heads, rows, head_dim]
    k_pool: &Tensor<F>,    // [kv_heads, slots, head_dim]
    v_pool: &Tensor<F>,    // [kv_heads, slots, head_dim]
    tables: &Tensor<I>,    // every sequence's block table, concatenated
    last_slot: &Tensor<I>, // [rows]
    items: &Tensor<I>,     // [items * ITEM_FIELDS]
    out: &mut Tensor<F>,   // [rows, q_heads * head_dim]
    scale: InputScalar,
    group: u32,
    block_size: u32,
    #[comptime] head_dim: usize,
    #[comptime] planes: usize,
    #[define(F, I, A)] _dtypes: [StorageType; 3],
) {
    let item = CUBE_POS_X as usize * ITEM_FIELDS;
    let q_head = CUBE_POS_Y as usize;
    let kv_head = q_head / group as usize;
    let lane = UNIT_POS_X as usize;
    let plane = UNIT_POS_Y as usize;
    let units = CUBE_DIM_X as usize * CUBE_DIM_Y as usize;
    let unit = plane * CUBE_DIM_X as usize + lane;
    let block_size = block_size as usize;

    let first_row = u32::cast_from(items[item]) as usize;
    let n_rows = u32::cast_from(items[item + 1]) as usize;
    let table = u32::cast_from(items[item + 2]) as usize;
    let keys = u32::cast_from(items[item + 3]) as usize;

    let rows_of_cube = comptime!(planes * PLANE_ROWS);
    let row = comptime!(head_dim + PAD);
    let s_row = comptime!(KEYS + SCORE_PAD);
    let scale = scale.get::<A>();
    let mut q_s = SharedMemory::<F>::new_aligned(rows_of_cube * row, 32usize);
    let mut k_s = SharedMemory::<F>::new_aligned(KEYS * row, 32usize);
    let mut v_s = SharedMemory::<F>::new_aligned(KEYS * row, 32usize);
    let mut s_s = SharedMemory::<A>::new_aligned(rows_of_cube * s_row, 32usize);
    let mut p_s = SharedMemory::<F>::new_aligned(rows_of_cube * KEYS, 32usize);

    // The cube's query rows; rows past the item's are zeros (their results are never written).
    let mut i = unit;
    while i < rows_of_cube * head_dim {
        let r = i / head_dim;
        let e = i % head_dim;
        let mut x = F::new(0.0);
        if r < n_rows {
            x = q[q_head * q.stride(1) + (first_row + r) * q.stride(2) + e * q.stride(3)];
        }
        q_s[r * row + e] = x;
        i += units;
    }

    // Lane r < 16 of a plane keeps row r's last visible slot, and its max and sum.
    let my_row = plane * PLANE_ROWS + lane;
    let row_valid = lane < PLANE_ROWS && my_row < n_rows;
    let mut last = 0usize;
    if row_valid {
        last = u32::cast_from(last_slot[first_row + my_row]) as usize;
    }
    let mut row_max = A::new(NEG_BIG);
    let mut row_sum = A::new(0.0);

    let q_base = plane * PLANE_ROWS * row;
    let s_base = plane * PLANE_ROWS * s_row;
    let p_base = plane * PLANE_ROWS * KEYS;

    // Pass 1: each row's max and sum of exp over the keys it sees.
    let mut start = 0usize;
    while start < keys {
        stage(
            k_pool, tables, &mut k_s, kv_head, table, start, keys, block_size, unit, units,
            head_dim,
        );
        sync_cube();
        scores::<F, A>(&q_s, &k_s, &mut s_s, q_base, s_base, head_dim);
        sync_cube();
        if row_valid && start <= last {
            let mut tile_max = row_max;
            for j in 0..KEYS {
                let slot = start + j;
                if slot <= last && slot < keys {
                    tile_max = A::max(tile_max, s_s[s_base + lane * s_row + j] * scale);
                }
            }
            let mut sum = row_sum * (row_max - tile_max).exp();
            for j in 0..KEYS {
                let slot = start + j;
                if slot <= last && slot < keys {
                    sum += (s_s[s_base + lane * s_row + j] * scale - tile_max).exp();
                }
            }
            row_sum = sum;
            row_max = tile_max;
        }
        sync_cube();
        start += KEYS;
    }
    let mut inv_sum = A::new(0.0);
    if row_valid {
        inv_sum = A::new(1.0) / row_sum;
    }

    // Pass 2: the final weights, and their products with V summed in registers.
    let mut acc = Sequence::<cmma::Matrix<A>>::new();
    #[unroll]
    for _i in 0..head_dim / 16 {
        acc.push(cmma::Matrix::<A>::from_value(
            cmma::MatrixIdent::Accumulator,
            16usize,
            16usize,
            16usize,
            cmma::MatrixLayout::Undefined,
            A::new(0.0),
        ));
    }
    let mut start = 0usize;
    while start < keys {
        stage(
            k_pool, tables, &mut k_s, kv_head, table, start, keys, block_size, unit, units,
            head_dim,
        );
        stage(
            v_pool, tables, &mut v_s, kv_head, table, start, keys, block_size, unit, units,
            head_dim,
        );
        sync_cube();
        scores::<F, A>(&q_s, &k_s, &mut s_s, q_base, s_base, head_dim);
        sync_cube();
        if lane < PLANE_ROWS {
            for j in 0..KEYS {
                let slot = start + j;
                let mut p = A::new(0.0);
                if row_valid && slot <= last && slot < keys {
                    p = (s_s[s_base + lane * s_row + j] * scale - row_max).exp() * inv_sum;
                }
                p_s[p_base + lane * KEYS + j] = F::cast_from(p);
            }
        }
        sync_cube();
        #[unroll]
        for nt in 0..head_dim / 16 {
            let a = acc.index(nt);
            #[unroll]
            for kk in 0..KEYS / 16 {
                let p = cmma::Matrix::<F>::from_slice(
                    cmma::MatrixIdent::A,
                    16usize,
                    16usize,
                    16usize,
                    cmma::MatrixLayout::RowMajor,
                    &p_s.slice(p_base + kk * 16, p_base + PLANE_ROWS * KEYS),
                    KEYS as u32,
                );
                let v = cmma::Matrix::<F>::from_slice(
                    cmma::MatrixIdent::B,
                    16usize,
                    16usize,
                    16usize,
                    cmma::MatrixLayout::RowMajor,
                    &v_s.slice(kk * 16 * row + nt * 16, KEYS * row),
                    row as u32,
                );
                cmma::execute::<F, F, A, A>(&p, &v, a, a);
            }
        }
        sync_cube();
        start += KEYS;
    }

    // Out, one 16x16 block at a time through the plane's score tile.
    #[unroll]
    for nt in 0..head_dim / 16 {
        cmma::store(
            &mut s_s.slice_mut(s_base, s_base + PLANE_ROWS * s_row),
            acc.index(nt),
            16u32,
            cmma::MatrixLayout::RowMajor,
        );
        sync_cube();
        let mut x = lane;
        while x < 256 {
            let r = x / 16;
            let c = x % 16;
            let out_row = plane * PLANE_ROWS + r;
            if out_row < n_rows {
                out[(first_row + out_row) * out.stride(0) + q_head * head_dim + nt * 16 + c] =
                    F::cast_from(s_s[s_base + x]);
            }
            x += 32;
        }
        sync_cube();
    }
}

/// Stages keys `[start, start + KEYS)` of a sequence (zeros past `end`) into `tile`, read through
/// its block table.
#[cube]
#[allow(clippy::too_many_arguments)]
fn stage<F: Float, I: Numeric>(
    pool: &Tensor<F>,
    tables: &Tensor<I>,
    tile: &mut SharedMemory<F>,
    kv_head: usize,
    table: usize,
    start: usize,
    end: usize,
    block_size: usize,
    unit: usize,
    units: usize,
    #[comptime] head_dim: usize,
) {
    let mut i = unit;
    while i < KEYS * head_dim {
        let slot = start + i / head_dim;
        let e = i % head_dim;
        let mut x = F::new(0.0);
        if slot < end {
            let block = u32::cast_from(tables[table + slot / block_size]) as usize;
            let pool_slot = block * block_size + slot % block_size;
            x = pool[kv_head * pool.stride(0) + pool_slot * pool.stride(1) + e * pool.stride(2)];
        }
        tile[(i / head_dim) * comptime!(head_dim + PAD) + e] = x;
        i += units;
    }
}

/// A plane's raw scores `Q K^T` for one key tile: 16 rows by [`KEYS`] keys, f32, into `s_s`.
#[cube]
fn scores<F: Float, A: Float>(
    q_s: &SharedMemory<F>,
    k_s: &SharedMemory<F>,
    s_s: &mut SharedMemory<A>,
    q_base: usize,
    s_base: usize,
    #[comptime] head_dim: usize,
) {
    let row = comptime!(head_dim + PAD);
    let s_row = comptime!(KEYS + SCORE_PAD);
    #[unroll]
    for n in 0..KEYS / 16 {
        let s = cmma::Matrix::<A>::from_value(
            cmma::MatrixIdent::Accumulator,
            16usize,
            16usize,
            16usize,
            cmma::MatrixLayout::Undefined,
            A::new(0.0),
        );
        #[unroll]
        for kk in 0..head_dim / 16 {
            let a = cmma::Matrix::<F>::from_slice(
                cmma::MatrixIdent::A,
                16usize,
                16usize,
                16usize,
                cmma::MatrixLayout::RowMajor,
                &q_s.slice(q_base + kk * 16, q_base + PLANE_ROWS * row),
                row as u32,
            );
            // K^T: key `n * 16 + c`'s element `kk * 16 + r` sits at `(n * 16 + c) * row
            // + kk * 16 + r`, a column-major 16x16 block with stride `row`.
            let b = cmma::Matrix::<F>::from_slice(
                cmma::MatrixIdent::B,
                16usize,
                16usize,
                16usize,
                cmma::MatrixLayout::ColMajor,
                &k_s.slice(n * 16 * row + kk * 16, KEYS * row),
                row as u32,
            );
            cmma::execute::<F, F, A, A>(&a, &b, &s, &s);
        }
        cmma::store(
            &mut s_s.slice_mut(s_base + n * 16, s_base + PLANE_ROWS * s_row),
            &s,
            s_row as u32,
            cmma::MatrixLayout::RowMajor,
        );
    }
}
