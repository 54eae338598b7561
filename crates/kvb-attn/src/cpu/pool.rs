//! The K/V pool on the CPU, in place: f32, or f16 bits in a `u16` array.
//!
//! burn-ndarray has no f16 storage, so an f16 pool layer is a float tensor whose primitive is a
//! `u16` array of f16 bits. Only the functions here and kvb-attn's CPU kernels (which read a
//! `u16` pool as f16) ever see it; everything else reads the pool through them, as f32.
//! Writes round to nearest even ([`half`]'s conversions, F16C where the CPU has it: the same
//! bits either way); reads widen exactly.

use crate::paged::{pool_write_runs, runs};
use crate::pool::{pool_read, HostKv};
use crate::FloatDtype;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use burn_ndarray::{NdArray, NdArrayTensor};
use half::f16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};

type Layer = Tensor<NdArray<f32>, 3>;

/// A pool layer's memory, `[h, slots, d]` contiguous, borrowed for an in-place update.
enum Values<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [f16]),
}

impl Values<'_> {
    /// Writes `src` at element `at`, rounding for an f16 pool.
    fn put(&mut self, at: usize, src: &[f32]) {
        match self {
            Values::F32(v) => v[at..at + src.len()].copy_from_slice(src),
            Values::F16(v) => v[at..at + src.len()].convert_from_f32_slice(src),
        }
    }

    /// Copies `len` values from element `from` to element `to` (ranges apart).
    fn copy_within(&mut self, from: usize, to: usize, len: usize) {
        match self {
            Values::F32(v) => v.copy_within(from..from + len, to),
            Values::F16(v) => v.copy_within(from..from + len, to),
        }
    }

    /// Zeroes `len` values from element `at` (clamped to the layer).
    fn zero(&mut self, at: usize, len: usize) {
        match self {
            Values::F32(v) => {
                let end = (at + len).min(v.len());
                v[at.min(end)..end].fill(0.0)
            }
            Values::F16(v) => {
                let end = (at + len).min(v.len());
                v[at.min(end)..end].fill(f16::ZERO)
            }
        }
    }
}

/// A pool layer's memory, borrowed to read.
enum ValuesRef<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
}

impl ValuesRef<'_> {
    /// Reads `dst.len()` values from element `at` into `dst`, widened for an f16 pool.
    fn get(&self, at: usize, dst: &mut [f32]) {
        match self {
            ValuesRef::F32(v) => dst.copy_from_slice(&v[at..at + dst.len()]),
            ValuesRef::F16(v) => v[at..at + dst.len()].convert_to_f32_slice(dst),
        }
    }
}

/// A zeroed layer from a zeroed allocation: the pages are mapped lazily, so a large pool costs
/// memory only as its blocks are first written (burn's `zeros` writes every element).
pub(crate) fn zeros(shape: [usize; 3], precision: FloatDtype) -> Layer {
    let n = shape.iter().product();
    let data = match precision {
        FloatDtype::F32 => TensorData::new(vec![0f32; n], shape),
        FloatDtype::F16 => TensorData::new(vec![0u16; n], shape),
        FloatDtype::Bf16 => {
            unreachable!("KvPool refuses bf16 on the CPU (holds_pool_precision)")
        }
    };
    Tensor::from_primitive(TensorPrimitive::Float(NdArrayTensor::from_data(data)))
}

/// Runs `f` on the layer's memory in place; returns the layer and whether `f` ran (not when the
/// layer is neither contiguous f32 nor f16 bits). The pool is uniquely owned by its
/// [`crate::KvPool`]; were it shared, `into_owned` would copy it first (correct, only slow).
fn in_place(pool: Layer, f: impl FnOnce(Values, [usize; 3])) -> (Layer, bool) {
    let dims = pool.dims();
    let TensorPrimitive::Float(primitive) = pool.clone().into_primitive() else {
        return (pool, false);
    };
    match primitive {
        NdArrayTensor::F32(storage) => {
            drop(pool);
            let mut array = storage.into_owned();
            let ran = array.as_slice_mut().map(|v| f(Values::F32(v), dims));
            let primitive = NdArrayTensor::from(array);
            (
                Tensor::from_primitive(TensorPrimitive::Float(primitive)),
                ran.is_some(),
            )
        }
        NdArrayTensor::U16(storage) => {
            drop(pool);
            let mut array = storage.into_owned();
            let ran = array
                .as_slice_mut()
                .map(|v| f(Values::F16(v.reinterpret_cast_mut()), dims));
            let primitive = NdArrayTensor::from(array);
            (
                Tensor::from_primitive(TensorPrimitive::Float(primitive)),
                ran.is_some(),
            )
        }
        _ => (pool, false),
    }
}

/// Whether the layer holds f16 bits (then burn's generic ops must not touch it).
fn is_f16(pool: &Layer) -> bool {
    matches!(
        pool.clone().into_primitive(),
        TensorPrimitive::Float(NdArrayTensor::U16(_))
    )
}

/// Writes `values` `[h, n, d]` at pool slots `slots` in place (through host values when they
/// are not contiguous f32: the pool may hold f16, which burn's ops cannot write).
pub(crate) fn scatter(pool: Layer, slots: &[usize], values: Layer) -> Layer {
    let [h, n, d] = values.dims();
    let primitive = values.clone().into_primitive();
    // Borrowed in place, no copy: every forward pass writes its K/V through here.
    if let TensorPrimitive::Float(NdArrayTensor::F32(storage)) = &primitive {
        if storage.shape() == [h, n, d] {
            if let Some(v) = storage.view().to_slice() {
                return write(pool, slots, HostKv::all(v, n));
            }
        }
    }
    let v = values.into_data().convert::<f32>().to_vec::<f32>();
    write(pool, slots, HostKv::all(&v.unwrap_or_default(), n))
}

/// Writes host values (tokens `src.first..` of `[h, src.tokens, d]`) at pool slots in place: a
/// slice-assign per run would first build a tensor of the values and then copy it, two passes
/// over K/V that a store hit reads by the tens of megabytes.
pub(crate) fn write(pool: Layer, slots: &[usize], src: HostKv) -> Layer {
    let written = in_place(pool, |mut dst, [h, total, d]| {
        for head in 0..h {
            for (at, first, len) in runs(slots) {
                let from = (head * src.tokens + src.first + at) * d;
                dst.put((head * total + first) * d, &src.data[from..from + len * d]);
            }
        }
    });
    match written {
        (pool, true) => pool,
        (pool, false) => write_generic(pool, slots, src),
    }
}

/// Zeroes slots `slots` of every head: the layer comes from a zeroed allocation whose pages the
/// kernel maps on first write, one fault per 4 KiB. Measured here, those faults were 90% of a
/// warm request's copy-on-write of its partial block (16 of 18 us per layer).
pub(crate) fn prefault(pool: Layer, slots: std::ops::Range<usize>) -> Layer {
    in_place(pool, |mut dst, [h, total, d]| {
        for head in 0..h {
            dst.zero((head * total + slots.start) * d, slots.len() * d);
        }
    })
    .0
}

/// Copies slots `from` onto slots `to` in place, slot to slot: no tensor ops (the generic path's
/// 60 per copied block took ~1.5 ms of a warm request's assembly) and no buffer in between.
pub(crate) fn copy(pool: Layer, from: &[usize], to: &[usize]) -> Layer {
    let copied = in_place(pool, |mut dst, [h, total, d]| {
        for head in 0..h {
            for (&f, &t) in from.iter().zip(to) {
                dst.copy_within((head * total + f) * d, (head * total + t) * d, d);
            }
        }
    });
    match copied {
        (pool, true) => pool,
        (pool, false) => {
            let values = read_host(&pool, from);
            write_generic(pool, to, HostKv::all(&values, from.len()))
        }
    }
}

/// Runs `f` on the layer's memory, read only; `None` when the layer is neither contiguous f32
/// nor f16 bits.
fn read_only<R>(pool: &Layer, f: impl FnOnce(ValuesRef, [usize; 3]) -> R) -> Option<R> {
    let dims = pool.dims();
    // An `Arc` clone of the storage: no copy of the data.
    let TensorPrimitive::Float(primitive) = pool.clone().into_primitive() else {
        return None;
    };
    match &primitive {
        NdArrayTensor::F32(storage) => {
            let view = storage.view();
            Some(f(ValuesRef::F32(view.to_slice()?), dims))
        }
        NdArrayTensor::U16(storage) => {
            let view = storage.view();
            Some(f(ValuesRef::F16(view.to_slice()?.reinterpret_cast()), dims))
        }
        _ => None,
    }
}

/// The values at `slots` as f32, `[h, n, d]`.
pub(crate) fn read_host(pool: &Layer, slots: &[usize]) -> Vec<f32> {
    let read = read_only(pool, |src, [h, total, d]| {
        let n = slots.len();
        let mut out = vec![0f32; h * n * d];
        for head in 0..h {
            for (at, first, len) in runs(slots) {
                let to = (head * n + at) * d;
                src.get((head * total + first) * d, &mut out[to..to + len * d]);
            }
        }
        out
    });
    read.unwrap_or_else(|| {
        pool_read(pool, slots)
            .into_data()
            .to_vec::<f32>()
            .unwrap_or_default()
    })
}

/// The layer grown to `slots` slots: a fresh zeroed layer with every head's old slots copied in.
pub(crate) fn grow(pool: Layer, slots: usize, precision: FloatDtype) -> Layer {
    let [h, old, d] = pool.dims();
    if !is_f16(&pool) && precision == FloatDtype::F32 {
        let fresh = zeros([h, slots, d], precision);
        return if old == 0 {
            fresh
        } else {
            fresh.slice_assign([0..h, 0..old, 0..d], pool)
        };
    }
    let every: Vec<usize> = (0..old).collect();
    let values = read_host(&pool, &every);
    drop(pool);
    write(
        zeros([h, slots, d], precision),
        &every,
        HostKv::all(&values, old),
    )
}

/// The values at `slots` as an f32 tensor `[h, n, d]`.
pub(crate) fn gather(pool: &Layer, slots: &[usize]) -> Layer {
    if !is_f16(pool) {
        return pool_read(pool, slots);
    }
    let [h, _, d] = pool.dims();
    let values = read_host(pool, slots);
    Tensor::from_data(TensorData::new(values, [h, slots.len(), d]), &pool.device())
}

/// The generic write, for an f32 layer that is not contiguous.
fn write_generic(pool: Layer, slots: &[usize], src: HostKv) -> Layer {
    let [h, _, d] = pool.dims();
    let values = src.tensor(h, d, slots.len(), &pool.device());
    pool_write_runs(pool, slots, values)
}
