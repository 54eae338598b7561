//! One layer's K or V in a paged pool, as the kernels read it: f32, or f16.
//!
//! An f16 layer is held as its bits ([`super::layer`]); [`super::layer::CpuLayer::view`] gives
//! this view of either. The kernels compute in f32 either way: an f16 run of keys is widened
//! exactly, in the registers that load it (the decode kernel's vector versions, [`Run`]) or into
//! a small scratch tile first, so the arithmetic after it is the same on the same values; what
//! f16 buys is half the bytes read from memory, the cost of a long decode step.

use super::view::View;
use half::f16;
use half::slice::HalfFloatSliceExt;

/// A pool layer `[kv_heads, slots, head_dim]`.
#[derive(Clone, Copy)]
pub(crate) enum PoolView {
    F32(View<3>),
    F16(View<3, f16>),
}

impl PoolView {
    pub fn strides(&self) -> [isize; 3] {
        match self {
            PoolView::F32(v) => v.strides,
            PoolView::F16(v) => v.strides,
        }
    }

    /// The f32 view, where the pool holds f32 (then kernels may read it in place).
    pub fn as_f32(&self) -> Option<View<3>> {
        match self {
            PoolView::F32(v) => Some(*v),
            PoolView::F16(_) => None,
        }
    }

    /// `len` consecutive pool slots of kv head `kh` from `slot`, `d` values each (contiguous), as
    /// f32: in place for an f32 pool, widened into `scratch` (at least `len * d` long) for f16.
    ///
    /// # Safety
    /// The slots must lie inside the pool, with `d` contiguous and slots `d` apart (as the
    /// callers check), and the pool must outlive the returned slice.
    #[inline]
    pub unsafe fn slots<'a>(
        &self,
        (kh, slot, len): (usize, usize, usize),
        d: usize,
        scratch: &'a mut [f32],
    ) -> &'a [f32] {
        match self {
            PoolView::F32(v) => std::slice::from_raw_parts(v.at([kh, slot, 0]), len * d),
            PoolView::F16(_) => {
                let dst = &mut scratch[..len * d];
                self.read_into((kh, slot, len), d, dst);
                dst
            }
        }
    }

    /// The same slots as [`PoolView::slots`] as a kernel that reads f16 takes them: an f16
    /// pool's in place when `reads_f16`, else as [`PoolView::slots`] gives them.
    ///
    /// # Safety
    /// As [`PoolView::slots`].
    #[inline]
    pub unsafe fn run<'a>(
        &self,
        (kh, slot, len): (usize, usize, usize),
        d: usize,
        scratch: &'a mut [f32],
        reads_f16: bool,
    ) -> Run<'a> {
        match self {
            PoolView::F16(v) if reads_f16 => {
                Run::F16(std::slice::from_raw_parts(v.at([kh, slot, 0]), len * d))
            }
            _ => Run::F32(self.slots((kh, slot, len), d, scratch)),
        }
    }

    /// Copies (f32) or widens (f16) the same slots as [`PoolView::slots`] into `dst`
    /// (`len * d` long).
    ///
    /// # Safety
    /// As [`PoolView::slots`].
    #[inline]
    pub unsafe fn read_into(
        &self,
        (kh, slot, len): (usize, usize, usize),
        d: usize,
        dst: &mut [f32],
    ) {
        match self {
            PoolView::F32(v) => {
                dst.copy_from_slice(std::slice::from_raw_parts(v.at([kh, slot, 0]), len * d))
            }
            PoolView::F16(v) => widen(
                std::slice::from_raw_parts(v.at([kh, slot, 0]), len * d),
                dst,
            ),
        }
    }
}

/// A run of pool slots' keys or values, `d` each, as a kernel reads them.
pub(crate) enum Run<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
}

impl PoolView {
    /// Asks the CPU to start loading the same slots as [`PoolView::slots`] into cache. A block
    /// of the pool is a few KiB on its own page, and the hardware prefetchers stop at page
    /// boundaries: without this, the first lines of every block arrive at full memory latency.
    /// A hint only: it never faults and changes no value.
    #[inline]
    pub fn prefetch(&self, (kh, slot, len): (usize, usize, usize), d: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let (start, bytes) = match self {
                PoolView::F32(v) => (v.at([kh, slot, 0]) as *const i8, len * d * 4),
                PoolView::F16(v) => (v.at([kh, slot, 0]) as *const i8, len * d * 2),
            };
            for line in (0..bytes).step_by(64) {
                // SAFETY: a prefetch never faults, whatever the address; wrapping_add computes
                // the address without asserting it lies in an allocation.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(line)) };
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (kh, slot, len, d);
    }
}

/// `dst = src` widened to f32 (exact). With F16C, eight values per instruction in one loop:
/// `half`'s slice conversion calls a function per eight values (its F16C code cannot be inlined
/// into code built without the feature), which cost as much as the bytes f16 saves.
#[inline]
fn widen(src: &[f16], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_f16c() {
        // SAFETY: the CPU has F16C and AVX (checked).
        unsafe { widen_f16c(src, dst) };
        return;
    }
    src.convert_to_f32_slice(dst);
}

#[cfg(target_arch = "x86_64")]
fn has_f16c() -> bool {
    kvb_gemm::cpu().f16c
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
unsafe fn widen_f16c(src: &[f16], dst: &mut [f32]) {
    use std::arch::x86_64::{__m128i, _mm256_cvtph_ps, _mm256_storeu_ps, _mm_loadu_si128};
    let n = src.len().min(dst.len());
    let whole = n / 8 * 8;
    for i in (0..whole).step_by(8) {
        let bits = _mm_loadu_si128(src.as_ptr().add(i).cast::<__m128i>());
        _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(bits));
    }
    src[whole..n].convert_to_f32_slice(&mut dst[whole..n]);
}
