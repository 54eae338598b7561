//! What the CPU offers, detected once per process for every kernel of kvb (these products,
//! the packed and 8-bit ones, kvb-attn's attention): one answer, so that every product in a
//! process rounds alike, and one place where `KVB_CPU_ISA` caps it.

/// The vector instructions this crate's kernels use, from the CPU's features (detected once at
/// run time). All of them sum every output in the same order, so they give the same bits except
/// [`Isa::Portable`], which rounds products and sums separately as non-FMA CPUs must.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Plain loops, separate multiplies and adds.
    Portable,
    /// AVX2 with fused multiply-adds: 8 lanes.
    Avx2Fma,
    /// AVX-512F: 16 lanes, 32 registers (a 12 x 32 output block in registers).
    Avx512,
}

impl Isa {
    /// The widest set this CPU runs, capped by `KVB_CPU_ISA` (`avx2` or `portable`; `avx512f`
    /// keeps AVX-512 without its extensions, `avx512` without AMX's tiles, [`CpuFeatures`]) so
    /// that one machine can measure the narrower paths beside the wider one.
    pub fn detect() -> Isa {
        let cap = match std::env::var("KVB_CPU_ISA").as_deref() {
            Ok("portable") => Isa::Portable,
            Ok("avx2") => Isa::Avx2Fma,
            Ok("avx512" | "avx512f" | "amx") | Err(_) => Isa::Avx512,
            Ok(other) => {
                // Read once per process, where no caller can take an error: say it and go on
                // with what the CPU has, rather than run a path the user did not ask for silently.
                eprintln!(
                    "kvb: KVB_CPU_ISA={other:?} is not one of portable, avx2, avx512f, avx512, amx; \
                     ignoring it"
                );
                Isa::Avx512
            }
        };
        Isa::supported()
            .into_iter()
            .filter(|i| *i <= cap)
            .max()
            .unwrap_or(Isa::Portable)
    }

    /// Every set this CPU runs, narrowest first (tests compare them).
    pub fn supported() -> Vec<Isa> {
        let mut all = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx2") && has!("fma") {
                all.push(Isa::Avx2Fma);
                if has!("avx512f") {
                    all.push(Isa::Avx512);
                }
            }
        }
        all
    }
}

/// The set [`Isa::detect`] found, once per process, so that every product rounds alike.
pub fn isa() -> Isa {
    static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
    *ISA.get_or_init(Isa::detect)
}

/// The CPU's features the kernels branch on, beyond [`Isa`]; AVX-512 extensions only where
/// [`Isa::Avx512`] is in use (`KVB_CPU_ISA` caps them too).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuFeatures {
    /// The widest vector set in use ([`isa`]).
    pub isa: Isa,
    /// F16C and AVX: 16-bit float conversions in 8 lanes.
    pub f16c: bool,
    /// AVX-512 BW: byte and word lanes.
    pub avx512bw: bool,
    /// AVX-512 VL: AVX-512 instructions on 128- and 256-bit registers.
    pub avx512vl: bool,
    /// AVX-512 VNNI: 8-bit dot products.
    pub avx512vnni: bool,
    /// AVX-512 VBMI: byte permutes.
    pub avx512vbmi: bool,
    /// AMX's 8-bit tile products, granted to this process and seen to run (`crate::amx`);
    /// `KVB_CPU_ISA=avx512` leaves them out.
    pub amx_int8: bool,
    /// The family of an AMD CPU (0x19: Zen 3 and Zen 4; 0x1A: Zen 5), for what is tuned per
    /// core rather than per instruction set (kvb-attn's decode prefetches).
    pub amd_family: Option<u32>,
}

impl CpuFeatures {
    /// This CPU's features with `isa` in use.
    pub fn with_isa(isa: Isa) -> CpuFeatures {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let wide = isa == Isa::Avx512;
            let cap = std::env::var("KVB_CPU_ISA");
            let plain = cap.as_deref() == Ok("avx512f");
            let extension = |present: bool| wide && present && !plain;
            // Asked last: the check grants the process AMX's state and forks once.
            let tiles = !matches!(cap.as_deref(), Ok("avx512" | "avx512f"));
            CpuFeatures {
                isa,
                f16c: has!("f16c") && has!("avx"),
                avx512bw: extension(has!("avx512bw")),
                avx512vl: extension(has!("avx512vl")),
                avx512vnni: extension(has!("avx512vnni")),
                avx512vbmi: extension(has!("avx512vbmi")),
                amx_int8: extension(tiles && has!("avx512vnni")) && crate::amx::usable(),
                amd_family: amd_family(),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        CpuFeatures {
            isa,
            f16c: false,
            avx512bw: false,
            avx512vl: false,
            avx512vnni: false,
            avx512vbmi: false,
            amx_int8: false,
            amd_family: None,
        }
    }

    /// Whether this is Zen 4 with its AVX-512 in use (AMD family 0x19, which has AVX-512 on
    /// Zen 4 alone): some prefetches that pay elsewhere cost there.
    pub fn zen4(&self) -> bool {
        self.amd_family == Some(0x19) && self.isa == Isa::Avx512
    }

    /// Every feature set this CPU runs, one per [`Isa::supported`] (tests compare them).
    pub fn supported() -> Vec<CpuFeatures> {
        Isa::supported()
            .into_iter()
            .map(CpuFeatures::with_isa)
            .collect()
    }
}

/// CPUID's family where the vendor is AMD (leaves 0 and 1 exist on every x86_64 CPU).
#[cfg(target_arch = "x86_64")]
fn amd_family() -> Option<u32> {
    use std::arch::x86_64::__cpuid;
    let vendor = __cpuid(0);
    let amd = (vendor.ebx, vendor.edx, vendor.ecx) == (0x6874_7541, 0x6974_6e65, 0x444d_4163);
    let signature = __cpuid(1).eax;
    amd.then(|| ((signature >> 8) & 0xf) + ((signature >> 20) & 0xff))
}

/// The features in use, detected once ([`isa`] and what goes with it).
pub fn cpu() -> &'static CpuFeatures {
    static CPU: std::sync::OnceLock<CpuFeatures> = std::sync::OnceLock::new();
    CPU.get_or_init(|| CpuFeatures::with_isa(isa()))
}

/// The features of the widest set this CPU runs, detected once: what a kernel chosen above the
/// one in use (by a test) may rely on. Kernels ask it per call, and CPUID traps to the host in a
/// virtual machine, so it must not be read again each time.
pub fn widest() -> &'static CpuFeatures {
    static WIDEST: std::sync::OnceLock<CpuFeatures> = std::sync::OnceLock::new();
    WIDEST.get_or_init(|| {
        let isa = Isa::supported().into_iter().max().unwrap_or(Isa::Portable);
        CpuFeatures::with_isa(isa)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_widest_features_are_those_of_the_last_supported_set() {
        let all = CpuFeatures::supported();
        assert_eq!(widest(), all.last().expect("the portable set at least"));
        assert_eq!(widest(), widest(), "detected once, the same answer");
    }
}
