//! Each row's argmax (a greedy step's token) in two launches: cubes split a row into spans and
//! each keeps its span's best value and index, then one cube per row picks among the spans.
//! burn's `argmax` reduces a row in one cube: on an H200 it took 3.7 ms of device time for a
//! 128,256-token vocabulary, nearly half of a 1B model's 7.8 ms decode step
//! (`bench/results/2026-11-27-gpu-step-time`).
//!
//! The lowest index wins a tie, as on the host ([`crate::generate::argmax`]); a NaN never wins
//! over a number.

use burn::tensor::DType;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

/// Units per cube (a power of two, for the tree).
const UNITS: usize = 256;

/// Values each unit of the first launch reads, about: enough spans to occupy the device, few
/// enough that the second launch's single cube reads them at once.
const VALUES_PER_UNIT: usize = 8;

/// Spans per row at most (one per unit of the second launch).
const MAX_SPANS: usize = UNITS;

/// Marks a slot with no index yet (a unit whose span is empty).
const NONE: u32 = u32::MAX;

/// Whether (`value`, `id`) beats (`best`, `best_id`): a larger value, or the same with a lower
/// index; anything beats an empty slot.
#[cube]
fn beats(value: f32, id: u32, best: f32, best_id: u32) -> bool {
    id != NONE && (best_id == NONE || value > best || (value == best && id < best_id))
}

/// The cube's best (value, index) from each unit's, left in slot 0 of `values` and `ids`.
#[cube]
fn tree(values: &mut SharedMemory<f32>, ids: &mut SharedMemory<u32>, value: f32, id: u32) {
    let unit = UNIT_POS_X as usize;
    values[unit] = value;
    ids[unit] = id;
    sync_cube();
    // A runtime count: a `let mut` copy of a comptime value stays a constant that cannot halve.
    let mut half = CUBE_DIM_X as usize / 2;
    while half > 0 {
        // Nested, not `&&`: a kernel evaluates both sides, and the upper half's read would fall
        // past the shared memory (an illegal address on CUDA).
        if unit < half {
            let other = unit + half;
            if beats(values[other], ids[other], values[unit], ids[unit]) {
                values[unit] = values[other];
                ids[unit] = ids[other];
            }
        }
        sync_cube();
        half /= 2;
    }
}

/// Cube (span, row) writes its span's best value and index to `[row, span]` of the partials.
#[cube(launch)]
fn span_best_kernel<F: Float>(
    logits: &Tensor<F>,       // [rows, vocab], any strides
    values: &mut Tensor<f32>, // [rows, spans]
    ids: &mut Tensor<u32>,    // [rows, spans]
    #[comptime] units: usize,
    #[define(F)] _dtype: StorageType,
) {
    let span = CUBE_POS_X as usize;
    let spans = CUBE_COUNT_X as usize;
    let row = CUBE_POS_Y as usize;
    let unit = UNIT_POS_X as usize;
    let vocab = logits.shape(1);
    let width = vocab.div_ceil(spans);
    let start = span * width;
    let end = vocab.min(start + width);
    let mut best = f32::new(0.0);
    let mut best_id = u32::new(NONE as i64);
    let mut e = start + unit;
    while e < end {
        let v = f32::cast_from(logits[row * logits.stride(0) + e * logits.stride(1)]);
        // A unit's indices rise, so a strict `>` keeps the lowest of equal values.
        if best_id == NONE || v > best {
            best = v;
            best_id = e as u32;
        }
        e += units;
    }
    let mut shared_values = SharedMemory::<f32>::new(units);
    let mut shared_ids = SharedMemory::<u32>::new(units);
    tree(&mut shared_values, &mut shared_ids, best, best_id);
    if unit == 0 {
        values[row * spans + span] = shared_values[0];
        ids[row * spans + span] = shared_ids[0];
    }
}

/// Cube `row` picks the best of its row's spans and writes its index.
#[cube(launch)]
fn row_best_kernel<I: Numeric>(
    values: &Tensor<f32>, // [rows, spans]
    ids: &Tensor<u32>,    // [rows, spans]
    out: &mut Tensor<I>,  // [rows, 1]
    #[comptime] units: usize,
    #[define(I)] _dtype: StorageType,
) {
    let row = CUBE_POS_X as usize;
    let unit = UNIT_POS_X as usize;
    let spans = values.shape(1);
    let mut best = f32::new(0.0);
    let mut best_id = u32::new(NONE as i64);
    if unit < spans {
        best = values[row * spans + unit];
        best_id = ids[row * spans + unit];
    }
    let mut shared_values = SharedMemory::<f32>::new(units);
    let mut shared_ids = SharedMemory::<u32>::new(units);
    tree(&mut shared_values, &mut shared_ids, best, best_id);
    if unit == 0 {
        out[row] = I::cast_from(shared_ids[0]);
    }
}

/// Units of a cube on `t`'s device: a power of two, since the tree halves them.
fn units_per_cube<R: CubeRuntime>(t: &CubeTensor<R>) -> usize {
    1usize
        << UNITS
            .min(t.client.properties().hardware.max_cube_dim.0 as usize)
            .ilog2()
}

/// Whether [`launch`] takes `logits` `[rows, vocab]`: some of each, and rows within one axis of
/// cubes.
pub(super) fn fits<R: CubeRuntime>(logits: &CubeTensor<R>) -> bool {
    let [rows, vocab] = [logits.meta.shape[0], logits.meta.shape[1]];
    rows > 0 && vocab > 0 && rows <= super::MAX_CUBES_PER_AXIS && vocab < NONE as usize
}

/// Whether the kernel runs on the runtime named `runtime`. `KVB_ARGMAX=split` runs it and
/// `KVB_ARGMAX=burn` runs burn's argmax everywhere. Unset, it runs where it has been checked:
/// wgpu (CI's lavapipe), not yet CUDA. Its first version read past its shared memory there; the
/// fixed one has not run on a GPU yet.
pub(super) fn chosen(runtime: &str) -> bool {
    static CHOICE: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    let forced = *CHOICE.get_or_init(|| match std::env::var("KVB_ARGMAX").as_deref() {
        Ok("split") => Some(true),
        Ok("burn") => Some(false),
        _ => None,
    });
    forced.unwrap_or(runtime != "cuda")
}

/// The index of each row's largest value, `[rows, 1]` in `int` (see [`fits`]).
pub(super) fn launch<R: CubeRuntime>(logits: CubeTensor<R>, int: DType) -> CubeTensor<R> {
    let [rows, vocab] = [logits.meta.shape[0], logits.meta.shape[1]];
    let units = units_per_cube(&logits);
    let spans = vocab
        .div_ceil(units * VALUES_PER_UNIT)
        .clamp(1, MAX_SPANS.min(units));
    let empty = |shape: Vec<usize>, dtype: DType| {
        empty_device_contiguous_dtype::<R>(
            logits.client.clone(),
            logits.device.clone(),
            shape.into(),
            dtype,
        )
    };
    let (values, ids) = (
        empty(vec![rows, spans], DType::F32),
        empty(vec![rows, spans], DType::U32),
    );
    let out = empty(vec![rows, 1], int);
    span_best_kernel::launch::<R>(
        &logits.client,
        CubeCount::Static(spans as u32, rows as u32, 1),
        CubeDim::new_1d(units as u32),
        logits.clone().into_tensor_arg(),
        values.clone().into_tensor_arg(),
        ids.clone().into_tensor_arg(),
        units,
        logits.dtype.into(),
    );
    row_best_kernel::launch::<R>(
        &logits.client,
        CubeCount::Static(rows as u32, 1, 1),
        CubeDim::new_1d(units as u32),
        values.into_tensor_arg(),
        ids.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        units,
        int.into(),
    );
    out
}

#[cfg(all(test, feature = "wgpu"))]
mod tests {
    use super::*;
    use burn::tensor::{Int, Tensor, TensorData};

    type B = burn::backend::Wgpu<f32, i32>;

    /// Each row's argmax through the kernel.
    fn argmax(rows: &[Vec<f32>]) -> Vec<i32> {
        let vocab = rows[0].len();
        let flat: Vec<f32> = rows.concat();
        let t = Tensor::<B, 2>::from_data(
            TensorData::new(flat, [rows.len(), vocab]),
            &Default::default(),
        );
        let logits = t.into_primitive().tensor();
        assert!(fits(&logits));
        let ids = Tensor::<B, 2, Int>::from_primitive(launch(logits, DType::I32));
        ids.into_data().to_vec::<i32>().unwrap()
    }

    /// Ties go to the lowest index, whether the equal values fall in one unit's values, in one
    /// span's units or in different spans; an all-equal row and an all `-inf` row give index 0,
    /// and a NaN never wins.
    #[test]
    fn the_lowest_index_wins_a_tie_anywhere() {
        let vocab = 50_000; // 25 spans of 2,048 values, 8 a unit
        let row = |best: &[usize]| {
            let mut r: Vec<f32> = (0..vocab).map(|i| -((i % 97) as f32)).collect();
            for &b in best {
                r[b] = 5.0;
            }
            r
        };
        let rows = [
            row(&[7, 7 + 256]),     // one unit's first and second value
            row(&[300, 299]),       // neighbouring units of one span
            row(&[49_999, 40_000]), // different spans, the later one first
            row(&[2_048, 2_047]),   // either side of a span's edge
            vec![1.0; vocab],
            vec![f32::NEG_INFINITY; vocab],
            {
                let mut r = row(&[123]);
                r[5] = f32::NAN;
                r[60] = f32::NAN;
                r
            },
        ];
        assert_eq!(argmax(&rows), [7, 299, 40_000, 2_047, 0, 0, 123]);
        // One value a row, and fewer values than units.
        assert_eq!(argmax(&[vec![-3.0], vec![2.0]]), [0, 0]);
        assert_eq!(argmax(&[vec![1.0, 4.0, 4.0, -2.0]]), [1]);
    }
}
