//! The host side of the GPU kernel: a paged batch flattened into the small integer tables the
//! kernel reads, and cut into work items (one cube each per kv head).
//!
//! A work item is up to `rows_per_item` consecutive query rows of one sequence. Its rows share a
//! block table, so the cube stages each K/V tile once for all of them (and for every q head of
//! the group). Kept free of GPU types so that it is tested on any machine.

use crate::paged::PagedBatch;

/// Integers per work item in [`WorkPlan::items`].
pub(crate) const ITEM_FIELDS: usize = 4;

/// What one paged call sends to the kernel, as `i32` (burn's int element on wgpu and CUDA).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WorkPlan {
    /// Every sequence's block table, one after the other.
    pub tables: Vec<i32>,
    /// Per query row, the last logical slot it sees.
    pub last_slot: Vec<i32>,
    /// Per work item: first row, number of rows, offset of its table in `tables`, keys it reads
    /// (one more than its rows' largest last slot).
    pub items: Vec<i32>,
}

impl WorkPlan {
    /// Number of work items.
    pub fn len(&self) -> usize {
        self.items.len() / ITEM_FIELDS
    }
}

/// Rows per work item for a batch: one when no sequence has more than one row (decode steps,
/// where more rows per cube would only idle), else as many as fit a cube of `max_units` units
/// with `group` q heads per kv head, at most 16, a power of two.
pub(crate) fn rows_per_item(batch: &PagedBatch, group: usize, max_units: usize) -> usize {
    let longest = batch.seqs.iter().map(|s| s.rows.len()).max().unwrap_or(0);
    let mut r = 1;
    while r < 16 && r < longest && 2 * r * group <= max_units {
        r *= 2;
    }
    r
}

/// Flattens `batch` into the kernel's tables. Sequences without rows send nothing; a checked
/// batch (`check_paged`) keeps every value well inside `i32`.
pub(crate) fn plan(batch: &PagedBatch, rows_per_item: usize) -> WorkPlan {
    let mut plan = WorkPlan {
        tables: Vec::new(),
        last_slot: Vec::new(),
        items: Vec::new(),
    };
    for seq in batch.seqs.iter().filter(|s| !s.rows.is_empty()) {
        let table_offset = plan.tables.len() as i32;
        plan.tables.extend(seq.blocks.iter().map(|&b| b as i32));
        plan.last_slot
            .extend(seq.last_slot.iter().map(|&s| s as i32));
        for (i, lasts) in seq.last_slot.chunks(rows_per_item).enumerate() {
            let first_row = seq.rows.start + i * rows_per_item;
            let keys = lasts.iter().max().map_or(0, |&m| m + 1);
            plan.items.extend([
                first_row as i32,
                lasts.len() as i32,
                table_offset,
                keys as i32,
            ]);
        }
    }
    plan
}

/// What the process asked for (`KVB_ATTN`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// The fastest kernel the device and the batch allow.
    Auto,
    /// Never tensor cores.
    Vector,
    /// burn's reference ops, no kernel.
    Reference,
}

/// Which kernel a paged call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// Products on tensor cores, 16 rows a plane (`tensor_core`).
    TensorCore,
    /// One unit per (head, row) in f32 (`kernel`): every device, every dtype, decode steps.
    Vector,
    /// burn's reference ops.
    Reference,
}

/// Rows a cube of the tensor-core kernel takes (four planes of 16).
pub(crate) const WIDE_ROWS: usize = 64;

/// Cubes of [`WIDE_ROWS`] rows a call must fill before tensor cores take it: fewer leave the GPU
/// idle (an H100 or H200 has 132 multiprocessors) where the vector kernel splits the keys.
pub(crate) const WIDE_CUBES: usize = 512;

/// Tensor cores take a call when the device has them for its dtype, the head dim is a whole
/// number of 16-wide blocks that fits the kernel's shared memory, and the call's rows fill at
/// least [`WIDE_CUBES`] cubes of 64 rows a (sequence, q head), counting sequences of a plane's
/// 16 rows or more: a long prefill, not a decode batch, a short suffix or CacheBlend's few rows.
pub(crate) fn kernel_for(
    mode: Mode,
    tensor_cores: bool,
    head_dim: usize,
    q_heads: usize,
    seq_rows: impl IntoIterator<Item = usize>,
) -> Kernel {
    let cubes = || -> usize {
        let long = seq_rows
            .into_iter()
            .filter(|&r| r >= super::tensor_core::PLANE_ROWS);
        q_heads * long.map(|r| r.div_ceil(WIDE_ROWS)).sum::<usize>()
    };
    match mode {
        Mode::Reference => Kernel::Reference,
        Mode::Auto
            if tensor_cores
                && head_dim.is_multiple_of(16)
                && head_dim <= 128
                && cubes() >= WIDE_CUBES =>
        {
            Kernel::TensorCore
        }
        _ => Kernel::Vector,
    }
}

/// Cubes a launch aims for at least: enough to keep a large GPU busy (an H100 has 132
/// multiprocessors, each running several cubes at once).
const TARGET_CUBES: usize = 1024;

/// A split reads at least this many keys: a shorter one would cost the merge more than it saves.
const MIN_SPLIT_KEYS: usize = 64;

/// How the keys of every work item are cut for a launch (flash-decoding): cube `z` of an item
/// reads keys `z * split_len .. (z + 1) * split_len`, and a merge pass combines the partial
/// softmax sums. One split means no merge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeySplit {
    pub splits: usize,
    /// A multiple of the kernel's tile, so that a split stages whole tiles.
    pub split_len: usize,
}

/// Splits the keys when the items alone (times `kv_heads`) are too few cubes to fill a GPU: a
/// decode batch (one row per item over thousands of keys), or a short suffix after a long cache.
pub(crate) fn key_split(plan: &WorkPlan, kv_heads: usize, tile: usize) -> KeySplit {
    let max_keys = plan
        .items
        .chunks(ITEM_FIELDS)
        .map(|item| item[3] as usize)
        .max()
        .unwrap_or(0)
        .max(1);
    let cubes = (plan.len() * kv_heads).max(1);
    let wanted = TARGET_CUBES.div_ceil(cubes);
    let splits = wanted.clamp(1, (max_keys / MIN_SPLIT_KEYS).max(1));
    let split_len = max_keys.div_ceil(splits).next_multiple_of(tile);
    KeySplit {
        splits: max_keys.div_ceil(split_len),
        split_len,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paged::PagedSeq;
    use proptest::prelude::*;

    /// Random batches: sequences of 0..40 rows, each row seeing some slot of its blocks.
    fn batch_parts() -> impl Strategy<Value = Vec<(Vec<u32>, Vec<usize>)>> {
        prop::collection::vec(
            (1usize..6).prop_flat_map(|blocks| {
                (
                    prop::collection::vec(0u32..64, blocks),
                    prop::collection::vec(0..blocks * 4, 0..40),
                )
            }),
            1..5,
        )
    }

    proptest! {
        /// Every row lands in exactly one item of its own sequence, items never exceed the row
        /// budget, and an item's key count and table are those of its sequence.
        #[test]
        fn items_cover_every_row_once(parts in batch_parts(), group in 1usize..9) {
            let mut seqs = Vec::new();
            let mut next = 0;
            for (blocks, lasts) in &parts {
                seqs.push(PagedSeq { blocks, rows: next..next + lasts.len(), last_slot: lasts, decode: false });
                next += lasts.len();
            }
            let batch = PagedBatch { block_size: 4, seqs: &seqs };
            let per = rows_per_item(&batch, group, 256);
            prop_assert!(per.is_power_of_two() && per * group <= 256 && per <= 16);
            let p = plan(&batch, per);
            prop_assert_eq!(p.last_slot.len(), next);
            let mut owner = vec![usize::MAX; next];
            for item in p.items.chunks(ITEM_FIELDS) {
                let [first, n, table, keys] = [item[0], item[1], item[2], item[3]].map(|v| v as usize);
                prop_assert!(n >= 1 && n <= per);
                let s = seqs.iter().position(|s| s.rows.contains(&first)).unwrap();
                prop_assert!(seqs[s].rows.contains(&(first + n - 1)));
                prop_assert_eq!(&p.tables[table..table + seqs[s].blocks.len()],
                    &seqs[s].blocks.iter().map(|&b| b as i32).collect::<Vec<_>>()[..]);
                let want = (first..first + n).map(|r| p.last_slot[r] as usize + 1).max().unwrap();
                prop_assert_eq!(keys, want);
                for (r, o) in owner.iter_mut().enumerate().skip(first).take(n) {
                    prop_assert_eq!(*o, usize::MAX, "row {} in two items", r);
                    *o = s;
                }
            }
            prop_assert!(owner.iter().all(|&o| o != usize::MAX));
            for (r, &l) in p.last_slot.iter().enumerate() {
                let s = &seqs[owner[r]];
                prop_assert_eq!(l as usize, s.last_slot[r - s.rows.start]);
            }
        }
    }

    proptest! {
        /// The splits cover every item's keys in whole tiles with no split left empty, and a
        /// launch that already has enough cubes is not split.
        #[test]
        fn key_splits_cover_the_keys(
            keys in prop::collection::vec(1usize..20_000, 1..300),
            kv_heads in 1usize..9,
            tile in prop::sample::select(vec![1usize, 8, 16, 32]),
        ) {
            let items = keys.iter().flat_map(|&k| [0, 1, 0, k as i32]).collect();
            let plan = WorkPlan { tables: vec![], last_slot: vec![], items };
            let KeySplit { splits, split_len } = key_split(&plan, kv_heads, tile);
            let max_keys = *keys.iter().max().unwrap();
            prop_assert!(splits >= 1 && split_len % tile == 0);
            prop_assert!(splits * split_len >= max_keys);
            prop_assert!((splits - 1) * split_len < max_keys, "an empty split");
            if keys.len() * kv_heads >= TARGET_CUBES || max_keys <= MIN_SPLIT_KEYS {
                prop_assert_eq!(splits, 1);
            }
            if splits > 1 {
                prop_assert!(split_len >= MIN_SPLIT_KEYS.min(max_keys));
            }
        }
    }

    #[test]
    fn tensor_cores_take_long_prefills_only() {
        use Kernel::*;
        let auto = |tc, d, heads, rows: &[usize]| {
            kernel_for(Mode::Auto, tc, d, heads, rows.iter().copied())
        };
        assert_eq!(auto(true, 128, 32, &[4096]), TensorCore);
        assert_eq!(auto(true, 64, 32, &[1024]), TensorCore, "exactly 512 cubes");
        assert_eq!(
            auto(true, 64, 32, &[1000]),
            TensorCore,
            "16 items of up to 64 rows"
        );
        assert_eq!(auto(true, 64, 32, &[960]), Vector, "480 cubes");
        assert_eq!(auto(true, 128, 32, &[128]), Vector, "a short suffix");
        assert_eq!(auto(true, 128, 32, &[1; 600]), Vector, "decode rows");
        assert_eq!(
            auto(true, 128, 32, &[15; 600]),
            Vector,
            "under a plane each"
        );
        let mixed: Vec<usize> = std::iter::once(4096).chain([1; 100]).collect();
        assert_eq!(
            auto(true, 128, 32, &mixed),
            TensorCore,
            "decode rows ride along"
        );
        assert_eq!(auto(true, 96, 32, &[4096]), TensorCore);
        assert_eq!(auto(true, 8, 32, &[4096]), Vector, "head dim under 16");
        assert_eq!(auto(true, 72, 32, &[4096]), Vector, "not whole blocks");
        assert_eq!(auto(true, 256, 32, &[4096]), Vector, "shared memory");
        assert_eq!(auto(false, 128, 32, &[4096]), Vector, "no tensor cores");
        let forced = |mode| kernel_for(mode, true, 128, 32, [4096]);
        assert_eq!(forced(Mode::Vector), Vector);
        assert_eq!(forced(Mode::Reference), Reference);
    }

    #[test]
    fn a_decode_step_over_a_long_cache_is_split() {
        let plan = WorkPlan {
            tables: vec![],
            last_slot: vec![],
            items: vec![0, 1, 0, 4096],
        };
        let s = key_split(&plan, 3, 16);
        assert!(s.splits >= 32, "{s:?}");
        assert!(s.splits * s.split_len >= 4096);
    }

    #[test]
    fn decode_batches_get_one_row_per_item() {
        let blocks = [0u32, 1];
        let seqs: Vec<PagedSeq> = (0..3)
            .map(|i| PagedSeq {
                blocks: &blocks,
                rows: i..i + 1,
                last_slot: &[5],
                decode: true,
            })
            .collect();
        let batch = PagedBatch {
            block_size: 4,
            seqs: &seqs,
        };
        assert_eq!(rows_per_item(&batch, 3, 256), 1);
        assert_eq!(plan(&batch, 1).len(), 3);
    }
}
