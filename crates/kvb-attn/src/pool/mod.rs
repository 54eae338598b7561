//! [`KvPool`]: the K/V of many sequences in fixed-size blocks of token slots.
//!
//! Per layer the pool holds K and V as `[kv_heads, blocks * block_size, head_dim]`; block `b` is
//! slots `b * block_size..(b + 1) * block_size`. Keys are stored after RoPE. Which blocks a
//! sequence owns, in what order (its *block table*), and who else reads them is the caller's
//! business: kvb-engine's block manager for many sequences, kvb-model's `KvCache` for one. The pool
//! only stores values and moves them: writes land in place (the pool owns its tensors alone), a
//! read gathers the slots asked for. A pool holds f32, or f16 ([`FloatDtype`]) where the
//! backend can (the CPU): half the memory, and half the bytes every decode step reads.
//!
//! How a backend holds a layer, and moves values in it, is its [`PoolBackend`]: burn tensor ops by
//! default, in place on the CPU. There a layer is one row-major array (slot `s` of head `h` at
//! element `(h * slots + s) * head_dim`); an f16 layer is a burn float tensor whose burn-ndarray
//! primitive is a `u16` array of the values' bits, which only this crate's CPU code reads
//! (`cpu/layer.rs`): read the pool through [`KvPool`], never as a burn tensor.

mod backend;
mod host_kv;

pub use backend::PoolBackend;
pub(crate) use host_kv::write_host_layer;
pub use host_kv::{pool_read, HostKv, PoolLayer};

use crate::{AttnError, FloatDtype};
use burn::tensor::Tensor;

type Result<T> = std::result::Result<T, AttnError>;

/// K and V of one layer: `[kv_heads, slots, head_dim]` each.
type LayerKv<B> = (Tensor<B, 3>, Tensor<B, 3>);

/// Blocks of K/V for every layer.
#[derive(Debug)]
pub struct KvPool<B: PoolBackend> {
    /// `Some` outside of `&mut self` methods; taken only to update a layer in place.
    layers: Vec<Option<LayerKv<B>>>,
    block_size: usize,
    blocks: usize,
    kv_heads: usize,
    head_dim: usize,
    precision: FloatDtype,
    device: B::Device,
}

impl<B: PoolBackend> KvPool<B> {
    /// A pool of `blocks` blocks of `block_size` slots for `num_layers` layers of `kv_heads` heads
    /// of `head_dim`, holding the backend's float type (zeroed; on the CPU its pages are mapped
    /// as blocks are first written).
    pub fn new(
        num_layers: usize,
        head_shape: (usize, usize),
        block_size: usize,
        blocks: usize,
        device: &B::Device,
    ) -> Result<Self> {
        Self::with_precision(
            FloatDtype::native::<B>(),
            num_layers,
            head_shape,
            block_size,
            blocks,
            device,
        )
    }

    /// As [`KvPool::new`], holding values in `precision` (an error where the backend cannot).
    pub fn with_precision(
        precision: FloatDtype,
        num_layers: usize,
        (kv_heads, head_dim): (usize, usize),
        block_size: usize,
        blocks: usize,
        device: &B::Device,
    ) -> Result<Self> {
        if block_size == 0 {
            return Err(AttnError::Pool(
                "a K/V block needs at least one slot".into(),
            ));
        }
        if !B::holds_pool_precision(precision) {
            return Err(AttnError::Pool(format!(
                "this backend cannot hold {precision} values: the CPU holds f32 or f16, a GPU \
                 backend its own float type (here {})",
                FloatDtype::native::<B>()
            )));
        }
        let shape = [kv_heads, blocks * block_size, head_dim];
        let zeros = || B::pool_zeros(shape, precision, device);
        Ok(KvPool {
            layers: (0..num_layers).map(|_| Some((zeros(), zeros()))).collect(),
            block_size,
            blocks,
            kv_heads,
            head_dim,
            precision,
            device: device.clone(),
        })
    }

    /// The element type the pool holds.
    pub fn precision(&self) -> FloatDtype {
        self.precision
    }

    /// Slots per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks the pool holds now.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Number of layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// `(kv_heads, head_dim)` of every layer.
    pub fn head_shape(&self) -> (usize, usize) {
        (self.kv_heads, self.head_dim)
    }

    /// The device the pool lives on.
    pub fn device(&self) -> &B::Device {
        &self.device
    }

    /// Bytes of K/V one block holds over every layer.
    pub fn block_bytes(&self) -> usize {
        Self::bytes_per_block(
            self.layers.len(),
            self.head_shape(),
            self.block_size,
            self.precision,
        )
    }

    /// Bytes of K/V one block of `block_size` slots holds in `precision`, for a model's shape.
    pub fn bytes_per_block(
        num_layers: usize,
        (kv_heads, head_dim): (usize, usize),
        block_size: usize,
        precision: FloatDtype,
    ) -> usize {
        2 * num_layers * kv_heads * block_size * head_dim * precision.bytes()
    }

    /// K and V of `layer` as the pool holds them: `[kv_heads, slots, head_dim]`. An f16 pool's
    /// layers on the CPU carry f16 bits that only the backend's pool and attention ops read;
    /// [`KvPool::read`] gives f32 values anywhere.
    pub fn layer(&self, layer: usize) -> Result<(&Tensor<B, 3>, &Tensor<B, 3>)> {
        match self.layers.get(layer) {
            Some(Some((k, v))) => Ok((k, v)),
            _ => Err(AttnError::Pool(format!(
                "layer {layer} of a pool of {} layers",
                self.layers.len()
            ))),
        }
    }

    /// Grows the pool to `blocks` blocks, keeping what it holds (a copy of every layer: grow in
    /// large steps).
    pub fn grow(&mut self, blocks: usize) {
        if blocks <= self.blocks {
            return;
        }
        let slots = blocks * self.block_size;
        for slot in self.layers.iter_mut() {
            let (k, v) = slot
                .take()
                .expect("a layer is only taken inside a method that puts it back");
            let grow = |t: Tensor<B, 3>| B::pool_grow(t, slots, self.precision);
            *slot = Some((grow(k), grow(v)));
        }
        self.blocks = blocks;
    }

    /// Backs block `block` with memory ahead of use (on the CPU the pool's pages are mapped on
    /// first write; elsewhere nothing to do). Only for a free block: its values are lost.
    pub fn prefault(&mut self, block: usize) -> Result<()> {
        if block >= self.blocks {
            return Err(AttnError::Pool(format!(
                "block {block} of a pool of {} blocks",
                self.blocks
            )));
        }
        let slots = block * self.block_size..(block + 1) * self.block_size;
        for layer in self.layers.iter_mut() {
            let (k, v) = layer.take().expect("layer present");
            *layer = Some((
                B::pool_prefault(k, slots.clone()),
                B::pool_prefault(v, slots.clone()),
            ));
        }
        Ok(())
    }

    fn check_slots(&self, layer: usize, slots: &[usize], values: Option<[usize; 3]>) -> Result<()> {
        if layer >= self.layers.len() {
            return Err(AttnError::Pool(format!(
                "layer {layer} of a pool of {} layers",
                self.layers.len()
            )));
        }
        let capacity = self.blocks * self.block_size;
        if let Some(&bad) = slots.iter().find(|&&s| s >= capacity) {
            return Err(AttnError::Pool(format!(
                "pool slot {bad} is beyond the pool's {capacity} slots"
            )));
        }
        if let Some(shape) = values {
            let want = [self.kv_heads, slots.len(), self.head_dim];
            if shape != want {
                return Err(AttnError::Pool(format!(
                    "K/V of shape {shape:?} for {} slots of a pool of {} heads x {}",
                    slots.len(),
                    self.kv_heads,
                    self.head_dim
                )));
            }
        }
        Ok(())
    }

    /// Writes `k`, `v` (`[kv_heads, n, head_dim]`) of `layer` at pool slots `slots` (`n`,
    /// distinct).
    pub fn write(
        &mut self,
        layer: usize,
        slots: &[usize],
        k: Tensor<B, 3>,
        v: Tensor<B, 3>,
    ) -> Result<()> {
        self.check_slots(layer, slots, Some(k.dims()))?;
        self.check_slots(layer, slots, Some(v.dims()))?;
        let (pk, pv) = self.layers[layer].take().expect("layer present");
        let [pk, pv] = B::pool_scatter_pair([pk, pv], slots, [k, v]);
        self.layers[layer] = Some((pk, pv));
        Ok(())
    }

    /// As [`KvPool::write`], from host values: tokens `k.first..k.first + slots.len()` of `k`
    /// and `v` (each `[kv_heads, tokens, head_dim]`, e.g. a stored chunk's layer).
    pub fn write_host(
        &mut self,
        layer: usize,
        slots: &[usize],
        k: HostKv,
        v: HostKv,
    ) -> Result<()> {
        self.check_host(slots, &k, &v)?;
        self.check_slots(layer, slots, None)?;
        let (pk, pv) = self.layers[layer].take().expect("layer present");
        self.layers[layer] = Some((
            B::pool_write_host(pk, slots, k),
            B::pool_write_host(pv, slots, v),
        ));
        Ok(())
    }

    /// K and V of `layer` at pool slots `slots`, as f32: `[kv_heads, n, head_dim]` each.
    pub fn read(&self, layer: usize, slots: &[usize]) -> Result<(Tensor<B, 3>, Tensor<B, 3>)> {
        self.check_slots(layer, slots, None)?;
        let (k, v) = self.layer(layer)?;
        Ok((B::pool_gather(k, slots), B::pool_gather(v, slots)))
    }

    /// As [`KvPool::read`], on the host: `[kv_heads, n, head_dim]` each.
    pub fn read_host(&self, layer: usize, slots: &[usize]) -> Result<(Vec<f32>, Vec<f32>)> {
        self.check_slots(layer, slots, None)?;
        let (k, v) = self.layer(layer)?;
        Ok((B::pool_read_host(k, slots), B::pool_read_host(v, slots)))
    }

    /// [`KvPool::write_host`] into every layer at once (`srcs[l]` for layer `l`), the layers
    /// in parallel where the backend can.
    pub fn write_host_all(&mut self, slots: &[usize], srcs: &[(HostKv, HostKv)]) -> Result<()> {
        if srcs.len() != self.layers.len() {
            return Err(AttnError::Pool(format!(
                "host K/V for {} layers, the pool has {}",
                srcs.len(),
                self.layers.len()
            )));
        }
        for (layer, (k, v)) in srcs.iter().enumerate() {
            self.check_host(slots, k, v)?;
            self.check_slots(layer, slots, None)?;
        }
        let layers: Vec<_> = self
            .layers
            .iter_mut()
            .map(|l| l.take().expect("layer present"))
            .collect();
        for (slot, layer) in self
            .layers
            .iter_mut()
            .zip(B::pool_write_host_layers(layers, slots, srcs))
        {
            *slot = Some(layer);
        }
        Ok(())
    }

    /// Host K and V hold `slots.len()` tokens from their first of whole `[heads, tokens, dim]`.
    fn check_host(&self, slots: &[usize], k: &HostKv, v: &HostKv) -> Result<()> {
        for src in [k, v] {
            let need = self.kv_heads * src.tokens * self.head_dim;
            if src.data.len() != need || src.first + slots.len() > src.tokens {
                return Err(AttnError::Pool(format!(
                    "{} host values of {} tokens (from token {}) for {} slots of {} heads x {}",
                    src.data.len(),
                    src.tokens,
                    src.first,
                    slots.len(),
                    self.kv_heads,
                    self.head_dim
                )));
            }
        }
        Ok(())
    }

    /// Copies the K/V of pool slots `from` to pool slots `to`, in every layer (copy-on-write of a
    /// block another sequence also reads).
    pub fn copy_slots(&mut self, from: &[usize], to: &[usize]) -> Result<()> {
        if from.len() != to.len() {
            return Err(AttnError::Pool(format!(
                "copying {} slots onto {}",
                from.len(),
                to.len()
            )));
        }
        for layer in 0..self.layers.len() {
            self.check_slots(layer, from, None)?;
            self.check_slots(layer, to, None)?;
            let (k, v) = self.layers[layer].take().expect("layer present");
            self.layers[layer] = Some((B::pool_copy(k, from, to), B::pool_copy(v, from, to)));
        }
        Ok(())
    }

    /// The pool slot of logical slot `s` of a sequence with block table `blocks`.
    pub fn pool_slot(&self, blocks: &[u32], s: usize) -> Result<usize> {
        let b = blocks.get(s / self.block_size).ok_or_else(|| {
            AttnError::Pool(format!(
                "slot {s} is beyond the {} blocks of the sequence",
                blocks.len()
            ))
        })?;
        if *b as usize >= self.blocks {
            return Err(AttnError::Pool(format!(
                "block {b} is beyond the pool's {} blocks",
                self.blocks
            )));
        }
        Ok(*b as usize * self.block_size + s % self.block_size)
    }

    /// The pool slots of logical slots `slots` of a sequence with block table `blocks`.
    pub fn pool_slots(
        &self,
        blocks: &[u32],
        slots: impl IntoIterator<Item = usize>,
    ) -> Result<Vec<usize>> {
        slots
            .into_iter()
            .map(|s| self.pool_slot(blocks, s))
            .collect()
    }
}

#[cfg(all(test, feature = "ndarray"))]
mod tests {
    use super::*;
    use burn::tensor::TensorData;
    type Cpu = burn::backend::NdArray<f32>;
    const BOTH: [FloatDtype; 2] = [FloatDtype::F32, FloatDtype::F16];

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]
        /// What a pool gives back is what was written, rounded to its precision (f16: to
        /// nearest even, exactly `half`'s rounding), through the host and the tensor read alike,
        /// and after the pool grows; slots never written read as zero.
        #[test]
        fn reads_give_the_written_values_in_the_pools_precision(
            f16 in proptest::prelude::any::<bool>(), seed in 0u32..1000, grow in 0usize..3,
        ) {
            let precision = if f16 { FloatDtype::F16 } else { FloatDtype::F32 };
            let dev = Default::default();
            let (h, d, bs) = (2, 8, 4);
            let mut pool = KvPool::<Cpu>::with_precision(precision, 2, (h, d), bs, 3, &dev).unwrap();
            let slots = [1usize, 2, 3, 8, 11];
            let n = slots.len();
            let val = |i: usize| {
                let x = (i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8;
                (x % 20001) as f32 / 997.0 - 10.0
            };
            let k: Vec<f32> = (0..h * n * d).map(val).collect();
            let v: Vec<f32> = (0..h * n * d).map(|i| val(i + 5000)).collect();
            let tensor = |x: &[f32]| Tensor::<Cpu, 3>::from_data(TensorData::new(x.to_vec(), [h, n, d]), &dev);
            pool.write(1, &slots, tensor(&k), tensor(&v)).unwrap();
            pool.grow(3 + grow);
            let round = |x: &[f32]| -> Vec<f32> {
                match precision {
                    FloatDtype::F32 => x.to_vec(),
                    FloatDtype::F16 => x.iter().map(|&y| half::f16::from_f32(y).to_f32()).collect(),
                    FloatDtype::Bf16 => unreachable!("the CPU holds no bf16 pool"),
                }
            };
            let (hk, hv) = pool.read_host(1, &slots).unwrap();
            proptest::prop_assert_eq!(&hk, &round(&k));
            proptest::prop_assert_eq!(&hv, &round(&v));
            let (tk, _) = pool.read(1, &slots).unwrap();
            proptest::prop_assert_eq!(tk.into_data().to_vec::<f32>().unwrap(), round(&k));
            let (untouched, _) = pool.read_host(0, &slots).unwrap();
            proptest::prop_assert!(untouched.iter().all(|&x| x == 0.0));
            proptest::prop_assert_eq!(pool.block_bytes(), 2 * 2 * h * bs * d * precision.bytes());
        }
    }

    /// A block's copy-on-write: the copied slots hold the source's values in every layer, K and V,
    /// and no other slot changes (the CPU's in-place copy against the generic gather + write).
    #[test]
    fn copy_slots_copies_exactly_the_given_slots() {
        for precision in BOTH {
            copy_slots_in(precision);
        }
    }

    fn copy_slots_in(precision: FloatDtype) {
        let dev = Default::default();
        let (layers, h, d, bs) = (3, 2, 4, 4);
        let mut pool =
            KvPool::<Cpu>::with_precision(precision, layers, (h, d), bs, 4, &dev).unwrap();
        let slots: Vec<usize> = (0..16).collect();
        for layer in 0..layers {
            let val = |salt: usize| {
                let data: Vec<f32> = (0..h * 16 * d)
                    .map(|i| (i * 7 + layer * 131 + salt) as f32)
                    .collect();
                Tensor::<Cpu, 3>::from_data(TensorData::new(data, [h, 16, d]), &dev)
            };
            pool.write(layer, &slots, val(0), val(1000)).unwrap();
        }
        let before: Vec<_> = (0..layers)
            .map(|l| pool.read_host(l, &slots).unwrap())
            .collect();
        let (from, to) = ([1usize, 2, 3], [9usize, 10, 11]);
        pool.copy_slots(&from, &to).unwrap();
        for (layer, (k0, v0)) in before.iter().enumerate() {
            let (k, v) = pool.read_host(layer, &slots).unwrap();
            for (now, was) in [(&k, k0), (&v, v0)] {
                for head in 0..h {
                    for s in 0..16 {
                        let src = from
                            .iter()
                            .zip(&to)
                            .find(|(_, t)| **t == s)
                            .map_or(s, |(f, _)| *f);
                        let at = |slot: usize| (head * 16 + slot) * d;
                        assert_eq!(
                            now[at(s)..at(s) + d],
                            was[at(src)..at(src) + d],
                            "layer {layer} head {head} slot {s}"
                        );
                    }
                }
            }
        }
        assert!(pool.copy_slots(&[1, 2], &[3]).is_err());
    }

    /// Backing a free block with memory touches that block alone: every other block keeps its
    /// K and V in every layer, and a block beyond the pool is an error.
    #[test]
    fn prefault_leaves_other_blocks_alone() {
        for precision in BOTH {
            prefault_in(precision);
        }
    }

    fn prefault_in(precision: FloatDtype) {
        let dev = Default::default();
        let (layers, h, d, bs, blocks) = (2, 3, 4, 4, 4);
        let mut pool =
            KvPool::<Cpu>::with_precision(precision, layers, (h, d), bs, blocks, &dev).unwrap();
        let every: Vec<usize> = (0..bs * blocks).collect();
        for layer in 0..layers {
            let val = |salt: usize| {
                let data: Vec<f32> = (0..h * every.len() * d)
                    .map(|i| (1 + i * 5 + layer * 71 + salt) as f32)
                    .collect();
                Tensor::<Cpu, 3>::from_data(TensorData::new(data, [h, every.len(), d]), &dev)
            };
            pool.write(layer, &every, val(0), val(500)).unwrap();
        }
        let before: Vec<_> = (0..layers)
            .map(|l| pool.read_host(l, &every).unwrap())
            .collect();
        pool.prefault(2).unwrap();
        let others: Vec<usize> = every.iter().copied().filter(|s| s / bs != 2).collect();
        for (layer, (k0, v0)) in before.iter().enumerate() {
            let (k, v) = pool.read_host(layer, &every).unwrap();
            for (now, was) in [(&k, k0), (&v, v0)] {
                for head in 0..h {
                    for &s in &others {
                        let at = (head * every.len() + s) * d;
                        assert_eq!(now[at..at + d], was[at..at + d], "layer {layer} slot {s}");
                    }
                }
            }
        }
        assert!(pool.prefault(blocks).is_err());
    }

    /// Writing host K/V into every layer at once (in parallel on the CPU) leaves the pool as
    /// writing layer after layer does, and checks every layer's input first.
    #[test]
    fn write_host_all_equals_writing_each_layer() {
        for precision in BOTH {
            write_host_all_in(precision);
        }
    }

    fn write_host_all_in(precision: FloatDtype) {
        let dev = Default::default();
        let (layers, h, d, bs, tokens) = (4, 2, 4, 4, 7);
        let data: Vec<Vec<f32>> = (0..2 * layers)
            .map(|l| {
                (0..h * tokens * d)
                    .map(|i| (i * 3 + l * 97) as f32)
                    .collect()
            })
            .collect();
        let src = |l: usize, kv: usize| HostKv {
            data: &data[2 * l + kv],
            tokens,
            first: 2,
        };
        let slots = [5usize, 6, 7, 12, 13];
        let pool =
            || KvPool::<Cpu>::with_precision(precision, layers, (h, d), bs, 4, &dev).unwrap();
        let (mut all, mut each) = (pool(), pool());
        let srcs: Vec<(HostKv, HostKv)> = (0..layers).map(|l| (src(l, 0), src(l, 1))).collect();
        all.write_host_all(&slots, &srcs).unwrap();
        for (l, (k, v)) in srcs.iter().enumerate() {
            each.write_host(l, &slots, *k, *v).unwrap();
        }
        let every: Vec<usize> = (0..16).collect();
        for l in 0..layers {
            assert_eq!(
                all.read_host(l, &every).unwrap(),
                each.read_host(l, &every).unwrap()
            );
            let (k, _) = all.read_host(l, &slots).unwrap();
            assert_eq!(
                k[0],
                data[2 * l][2 * d],
                "layer {l}: the first written token"
            );
        }
        assert!(all.write_host_all(&slots, &srcs[..3]).is_err());
        let short = HostKv {
            data: &data[0][..8],
            tokens,
            first: 0,
        };
        let mut bad = srcs.clone();
        bad[3].1 = short;
        assert!(all.write_host_all(&slots, &bad).is_err());
    }
}
