//! Quantization of host slices.

use crate::groups::{GroupParams, Layout, F16_SAFE};
use crate::packing::{pack, packed_len, unpack};
use crate::{Bits, QuantAxis, QuantConfig, QuantError};
use half::f16;

/// A quantized `[heads, tokens, dim]` block.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizedKv {
    shape: [usize; 3],
    axis: QuantAxis,
    config: QuantConfig,
    /// Packed codes, in the element order of the block.
    codes: Vec<u8>,
    /// One per group (see the layout's group order).
    scales: Vec<f16>,
    zeros: Vec<f16>,
}

/// Group parameters of every group of `data`.
pub(crate) fn group_params(
    data: &[f32],
    layout: &Layout,
    bits: Bits,
) -> Result<Vec<GroupParams>, QuantError> {
    let n = layout.group_count();
    let mut mins = vec![f32::INFINITY; n];
    let mut maxs = vec![f32::NEG_INFINITY; n];
    let [h, t, d] = layout.shape;
    for head in 0..h {
        for tok in 0..t {
            for ch in 0..d {
                let i = (head * t + tok) * d + ch;
                let x = data[i];
                if !x.is_finite() || x.abs() > F16_SAFE {
                    return Err(QuantError::OutOfRange { value: x, index: i });
                }
                let g = layout.group_of(head, tok, ch);
                mins[g] = mins[g].min(x);
                maxs[g] = maxs[g].max(x);
            }
        }
    }
    Ok(mins
        .iter()
        .zip(&maxs)
        .map(|(&lo, &hi)| GroupParams::covering(lo, hi, bits))
        .collect())
}

/// Quantizes `data` (`shape` = `[heads, tokens, dim]`, row-major) along `axis`.
pub fn quantize(
    data: &[f32],
    shape: [usize; 3],
    axis: QuantAxis,
    config: QuantConfig,
) -> Result<QuantizedKv, QuantError> {
    let layout = Layout::new(shape, axis, config.group_size)?;
    if data.len() != shape.iter().product::<usize>() {
        return Err(QuantError::Shape(format!(
            "{} values for a block of {shape:?}",
            data.len()
        )));
    }
    let params = group_params(data, &layout, config.bits)?;
    let max_code = config.bits.max_code();
    let [h, t, d] = shape;
    let mut codes = Vec::with_capacity(data.len());
    for head in 0..h {
        for tok in 0..t {
            for ch in 0..d {
                let p = params[layout.group_of(head, tok, ch)];
                codes.push(p.code(data[(head * t + tok) * d + ch], max_code));
            }
        }
    }
    Ok(QuantizedKv::from_parts(
        shape,
        axis,
        config,
        pack(&codes, config.bits),
        params,
    ))
}

impl QuantizedKv {
    pub(crate) fn from_parts(
        shape: [usize; 3],
        axis: QuantAxis,
        config: QuantConfig,
        codes: Vec<u8>,
        params: Vec<GroupParams>,
    ) -> Self {
        QuantizedKv {
            shape,
            axis,
            config,
            codes,
            scales: params.iter().map(|p| p.scale).collect(),
            zeros: params.iter().map(|p| p.zero).collect(),
        }
    }

    /// Rebuilds a block from its stored parts (e.g. read back from disk), checking every length.
    pub fn from_raw(
        shape: [usize; 3],
        axis: QuantAxis,
        config: QuantConfig,
        codes: Vec<u8>,
        scales: Vec<f16>,
        zeros: Vec<f16>,
    ) -> Result<Self, QuantError> {
        let layout = Layout::new(shape, axis, config.group_size)?;
        let elems: usize = shape.iter().product();
        if codes.len() != packed_len(elems, config.bits)
            || scales.len() != layout.group_count()
            || zeros.len() != scales.len()
        {
            return Err(QuantError::Shape(format!(
                "{} code bytes, {} scales, {} zeros do not fit a {shape:?} block in groups of {}",
                codes.len(),
                scales.len(),
                zeros.len(),
                config.group_size
            )));
        }
        Ok(QuantizedKv {
            shape,
            axis,
            config,
            codes,
            scales,
            zeros,
        })
    }

    /// `[heads, tokens, dim]`.
    pub fn shape(&self) -> [usize; 3] {
        self.shape
    }

    /// The statistics axis.
    pub fn axis(&self) -> QuantAxis {
        self.axis
    }

    /// Bits and group size.
    pub fn config(&self) -> QuantConfig {
        self.config
    }

    /// The packed codes.
    pub fn codes(&self) -> &[u8] {
        &self.codes
    }

    /// Per-group scales.
    pub fn scales(&self) -> &[f16] {
        &self.scales
    }

    /// Per-group zero points.
    pub fn zeros(&self) -> &[f16] {
        &self.zeros
    }

    fn layout(&self) -> Layout {
        Layout {
            shape: self.shape,
            axis: self.axis,
            group_size: self.config.group_size,
        }
    }

    /// The quantization step of the group holding element `[head, token, channel]`.
    pub fn step_at(&self, head: usize, token: usize, channel: usize) -> f32 {
        self.scales[self.layout().group_of(head, token, channel)].to_f32()
    }

    /// Writes the dequantized block into `out` (`heads * tokens * dim` values).
    pub fn dequantize_into(&self, out: &mut [f32]) {
        let [h, t, d] = self.shape;
        let n = h * t * d;
        // Group parameters widened once, codes unpacked once (8-bit codes are used in place):
        // the row loops below are then plain multiply-adds the compiler vectorises. Each value is
        // `zero + code * scale` in f32, exactly as `GroupParams::value` computes it.
        let scales: Vec<f32> = self.scales.iter().map(|s| s.to_f32()).collect();
        let zeros: Vec<f32> = self.zeros.iter().map(|z| z.to_f32()).collect();
        let unpacked;
        let codes: &[u8] = match self.config.bits {
            Bits::Eight => &self.codes[..n],
            bits => {
                unpacked = unpack(&self.codes, bits, n);
                &unpacked
            }
        };
        let g = self.config.group_size;
        for head in 0..h {
            for tok in 0..t {
                let row = (head * t + tok) * d;
                let (o, c) = (&mut out[row..row + d], &codes[row..row + d]);
                match self.axis {
                    QuantAxis::PerChannel => {
                        // One group per channel: parameters run along the row.
                        let base = (head * t.div_ceil(g) + tok / g) * d;
                        let (z, s) = (&zeros[base..base + d], &scales[base..base + d]);
                        for i in 0..d {
                            o[i] = z[i] + c[i] as f32 * s[i];
                        }
                    }
                    QuantAxis::PerToken => {
                        let base = (head * t + tok) * d.div_ceil(g);
                        for (j, (oc, cc)) in o.chunks_mut(g).zip(c.chunks(g)).enumerate() {
                            let (z, s) = (zeros[base + j], scales[base + j]);
                            for (x, &q) in oc.iter_mut().zip(cc) {
                                *x = z + q as f32 * s;
                            }
                        }
                    }
                }
            }
        }
    }

    /// The dequantized block, `[heads, tokens, dim]` row-major.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.shape.iter().product()];
        self.dequantize_into(&mut out);
        out
    }

    /// Bytes held: packed codes plus two f16 per group.
    pub fn memory_bytes(&self) -> usize {
        self.codes.len() + 2 * (self.scales.len() + self.zeros.len())
    }

    /// Bytes of the block in f32 over [`QuantizedKv::memory_bytes`].
    pub fn compression_ratio(&self) -> f64 {
        (self.shape.iter().product::<usize>() * 4) as f64 / self.memory_bytes() as f64
    }
}
