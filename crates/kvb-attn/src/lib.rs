//! # kvb-attn: attention over a K/V cache with explicit query slots
//!
//! kvb reuses K/V computed earlier, so its attention must let queries sit anywhere in a longer K/V
//! sequence, not only at its start. This crate provides that attention in plain burn tensor ops, so
//! every backend (ndarray, wgpu, CUDA) runs the same code.
//!
//! Promises (proved by `tests/attention_matches_naive.rs` against a per-element implementation):
//! - **Offset queries.** With [`Visibility::Causal`], `n` queries over `t` keys sit at slots
//!   `[t - n, t)`: query `i` sees keys `[0, t - n + i]` (the bottom-right-aligned causal mask).
//! - **Arbitrary slots.** With [`Visibility::UpToSlot`], query `i` sees keys `[0, slot_i]`; this is
//!   what sparse recompute needs, where the recomputed tokens are scattered through the prompt.
//! - **Grouped-query attention** without materialising repeated K/V: q heads are grouped by the kv
//!   head they share (q head `h` uses kv head `h / (q_heads / kv_heads)`, as HF's `repeat_kv`).
//! - **Extra mask.** An optional `[n, t]` boolean mask (`true` = blocked) narrows what each query sees.
//! - Bad shapes and rows with nothing visible are errors, never panics or NaNs.
//! - **Paged K/V.** [`paged_attention`] runs the query rows of many sequences in one call over a
//!   block pool (`[kv_heads, slots, head_dim]` per layer): each sequence reads its K/V through its
//!   block table, so sequences that share a prefix share its blocks ([`paged`]).
//! - **Kernels agree with the reference.** [`AttentionBackend`] lets a backend swap in a faster
//!   kernel; burn-ndarray gets tiled online-softmax kernels (feature `ndarray`) that read K/V in
//!   place, and a decode kernel that reads each shared block once per step for every row that
//!   needs it. The same tests hold them to the per-element implementation
//!   (`tests/attention_matches_naive.rs`, `tests/paged_matches_naive.rs`).
//! - **Batch invariance (CPU).** A row's result depends only on its query, its keys and whether
//!   it is a prefill or a decode row: not on the other rows or sequences of the call, nor on how a
//!   prefill is cut into chunks, nor on where its blocks sit in the pool (bit for bit, tested).
//! - **f16 pools (CPU).** A pool layer whose burn-ndarray primitive is a `u16` array holds f16
//!   bits ([`KvPool`] in f16, see [`pool`]); the CPU kernels read it as those values widened to f32, the
//!   same bits as over an f32 pool holding them (tested). burn's reference ops cannot read it; a
//!   pool the kernels cannot read in place is then an error, never a misread.
//!
//! - **Half precision (GPU).** On a CubeCL backend holding f16 or bf16 (kvb's `--dtype`), the
//!   kernels read half precision and compute scores, softmax sums and outputs in f32, rounding
//!   once on write: they stay within the output's own rounding of the exact answer from the same
//!   inputs (`tests/cube_matches_naive.rs`, tolerances per dtype). [`float_on`] names a backend's
//!   float type where kvb creates a tensor, which burn 0.21 would otherwise take from the device.
//!
//! - **Tensor cores (GPU).** In f16 and bf16 on a device with 16x16x16 cooperative matrices
//!   (CUDA), a long prefill runs a kernel whose score and output products are tensor-core blocks
//!   with f32 sums; the softmax weights are rounded once to the tensors' type for the second
//!   product. `PagedKernelChoice` (feature `cube`) says which kernel a batch takes (decode and
//!   short calls stay on the vector kernel); `KVB_ATTN=vector` keeps every call there and
//!   `KVB_ATTN=reference` runs burn's ops. The same tests hold it to the per-element answer, and
//!   long prefills that take it (`tests/cube_matches_naive.rs`; CUDA only, ignored without a GPU).
//!
//! - **The K/V pool.** [`KvPool`] holds the K/V of many sequences in blocks of slots, per layer
//!   `[kv_heads, slots, head_dim]`, in f32 or (on the CPU) f16, and the kernels above read it in
//!   place. How a backend holds and moves a layer is its own trait, [`PoolBackend`]; attention
//!   ([`AttentionBackend`]) only reads it. What it gives back is what was written, rounded to its precision, through the host
//!   and the device read alike and after it grows; a block copy (copy-on-write), a prefault and a
//!   many-layer host write touch exactly the slots asked for (property and unit tests in
//!   [`pool`]). Bad layers, slots, blocks and shapes are errors ([`AttnError::Pool`]). On the
//!   CPU a layer costs memory only where blocks are written, huge pages kept off, so a pool can
//!   be made at its whole budget ([`PoolBackend::pool_reserves_budget`];
//!   `tests/pool_memory.rs`), and the decode kernel's vector versions read an f16 pool in place
//!   with the bits of its widening (`f16_runs_give_the_bits_of_their_widening`).
//! - **Pool writes.** [`PoolBackend::pool_scatter`] writes new K/V at a pool's slots; the
//!   CPU writes in place (f32 or rounding to f16), the CubeCL backends in one launch per call
//!   (burn's ops need one per run of consecutive slots), with the same values
//!   (`tests/cube_matches_naive.rs`).
//!
//! - **Host work, counted.** [`host_work`] counts, per thread, the kernel launches, uploads and
//!   reads that kvb's own code issues (its kernels here, the model's ops in kvb-model), so that a
//!   caller can report them per forward pass; kvb-server's `tests/launch_counts.rs` holds the
//!   count to CubeCL's own execution log on lavapipe (unit test: `host_work::tests`).
//!
//! Speed: `cargo bench -p kvb-attn --bench decode_attention` times a decode step over a long
//! paged cache, f32 and f16, against the machine's streaming read rate, measured in the same run.
//!
//! ```
//! use burn::backend::NdArray;
//! use burn::tensor::{Distribution, Tensor};
//! use kvb_attn::{attention, Visibility};
//!
//! let dev = Default::default();
//! // 4 query heads share 2 kv heads; 3 new queries attend to 10 cached + new keys.
//! let q = Tensor::<NdArray, 4>::random([1, 4, 3, 8], Distribution::Default, &dev);
//! let k = Tensor::<NdArray, 4>::random([1, 2, 10, 8], Distribution::Default, &dev);
//! let v = Tensor::<NdArray, 4>::random([1, 2, 10, 8], Distribution::Default, &dev);
//! let out = attention(q, k, v, &Visibility::Causal, None, 8f32.powf(-0.5)).unwrap();
//! assert_eq!(out.dims(), [1, 4, 3, 8]);
//! ```
#![warn(missing_docs)]

mod backend;
#[cfg(feature = "ndarray")]
mod cpu;
#[cfg(feature = "cube")]
mod cube;
pub mod fastmath;
pub mod float_dtype;
mod float_type;
mod host_read;
pub mod host_work;
mod mask;
pub mod paged;
pub mod pool;
mod reference;

pub use backend::AttentionBackend;
#[cfg(feature = "cube")]
pub use cube::{Kernel, PagedKernelChoice};
pub use float_dtype::FloatDtype;
pub use float_type::float_on;
pub use host_read::to_host_f32;
pub use host_work::HostWork;
pub use mask::Visibility;
pub use paged::{paged_attention, PagedBatch, PagedSeq};
pub use pool::{HostKv, KvPool, PoolBackend};
pub use reference::attention;

/// Everything that can go wrong when calling attention.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AttnError {
    /// The tensors' shapes do not fit together.
    #[error("attention shape mismatch: {0}")]
    Shape(String),
    /// A visibility description does not fit the number of queries or keys.
    #[error("attention visibility: {0}")]
    Visibility(String),
    /// A K/V pool cannot be built as asked (its element type, its block size), or was asked for
    /// a layer, slot or block it does not have.
    #[error("K/V pool: {0}")]
    Pool(String),
}

/// burn, whose `Backend` and tensors this crate's API takes.
pub use burn;

/// The README's example, run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
