//! The K/V pool's moves on the CPU, in place in f32 or f16 layers ([`CpuLayer`]): burn-ndarray's
//! [`PoolBackend`]. Writes round to nearest even; reads widen exactly.

use super::layer::{CpuLayer, Layer};
use crate::paged::{pool_write_runs, runs};
use crate::pool::{pool_read, write_host_layer, HostKv, PoolBackend, PoolLayer};
use crate::FloatDtype;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use burn_ndarray::{NdArray, NdArrayTensor};
use rayon::prelude::*;

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
    let written = CpuLayer::update(pool, |mut dst, [h, total, d]| {
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
    CpuLayer::update(pool, |mut dst, [h, total, d]| {
        for head in 0..h {
            dst.zero((head * total + slots.start) * d, slots.len() * d);
        }
    })
    .0
}

/// Copies slots `from` onto slots `to` in place, slot to slot: no tensor ops (the generic path's
/// 60 per copied block took ~1.5 ms of a warm request's assembly) and no buffer in between.
pub(crate) fn copy(pool: Layer, from: &[usize], to: &[usize]) -> Layer {
    let copied = CpuLayer::update(pool, |mut dst, [h, total, d]| {
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

/// The values at `slots` as f32, `[h, n, d]`.
pub(crate) fn read_host(pool: &Layer, slots: &[usize]) -> Vec<f32> {
    let [h, total, d] = pool.dims();
    let read = CpuLayer::of(pool).and_then(|layer| {
        layer.read(|src| {
            let n = slots.len();
            let mut out = vec![0f32; h * n * d];
            for head in 0..h {
                for (at, first, len) in runs(slots) {
                    let to = (head * n + at) * d;
                    src.get((head * total + first) * d, &mut out[to..to + len * d]);
                }
            }
            out
        })
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
    if !CpuLayer::is_f16(&pool) && precision == FloatDtype::F32 {
        let fresh = CpuLayer::zeros([h, slots, d], precision);
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
        CpuLayer::zeros([h, slots, d], precision),
        &every,
        HostKv::all(&values, old),
    )
}

/// The values at `slots` as an f32 tensor `[h, n, d]`.
pub(crate) fn gather(pool: &Layer, slots: &[usize]) -> Layer {
    if !CpuLayer::is_f16(pool) {
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

impl PoolBackend for NdArray<f32> {
    /// f32 and f16 (an f16 layer as its bits, `cpu/layer.rs`).
    fn holds_pool_precision(precision: FloatDtype) -> bool {
        precision != FloatDtype::Bf16
    }

    fn pool_zeros(
        shape: [usize; 3],
        precision: FloatDtype,
        _device: &burn::tensor::Device<Self>,
    ) -> Tensor<Self, 3> {
        CpuLayer::zeros(shape, precision)
    }

    /// Where the kernel maps zeroed memory on first write and overcommits (a layer is a
    /// calloc'd array, mapped fresh at this size): growing instead copied every layer, and glibc
    /// cleared a reused block whole, so the pool's pages were its capacity, not its use
    /// (bench/results/2026-12-05-pool-reserve).
    fn pool_reserves_budget() -> bool {
        super::layer::lazily_mapped()
    }

    fn pool_grow(pool: Tensor<Self, 3>, slots: usize, precision: FloatDtype) -> Tensor<Self, 3> {
        grow(pool, slots, precision)
    }

    fn pool_gather(pool: &Tensor<Self, 3>, slots: &[usize]) -> Tensor<Self, 3> {
        gather(pool, slots)
    }

    fn pool_prefault(pool: Tensor<Self, 3>, slots: std::ops::Range<usize>) -> Tensor<Self, 3> {
        prefault(pool, slots)
    }

    /// In place, f32 or f16.
    fn pool_scatter(
        pool: Tensor<Self, 3>,
        slots: &[usize],
        values: Tensor<Self, 3>,
    ) -> Tensor<Self, 3> {
        crate::host_work::launched(1);
        scatter(pool, slots, values)
    }

    fn pool_write_host(pool: Tensor<Self, 3>, slots: &[usize], src: HostKv) -> Tensor<Self, 3> {
        write(pool, slots, src)
    }

    /// The layers in parallel: a warm request copies tens of megabytes of stored K/V, which one
    /// core moved at ~8 GB/s (1.1 ms of a RAG request's 434 cached tokens).
    fn pool_write_host_layers(
        layers: Vec<PoolLayer<Self>>,
        slots: &[usize],
        srcs: &[(HostKv, HostKv)],
    ) -> Vec<PoolLayer<Self>> {
        layers
            .into_par_iter()
            .zip(srcs.par_iter())
            .map(|(layer, src)| write_host_layer::<Self>(layer, slots, src))
            .collect()
    }

    fn pool_copy(pool: Tensor<Self, 3>, from: &[usize], to: &[usize]) -> Tensor<Self, 3> {
        copy(pool, from, to)
    }

    fn pool_read_host(pool: &Tensor<Self, 3>, slots: &[usize]) -> Vec<f32> {
        read_host(pool, slots)
    }
}
