//! Group layout and per-group parameters (f16 scale and zero point, rounded outward).

use crate::{Bits, QuantError};
use half::f16;

/// Which axis a group's statistics run along.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantAxis {
    /// One group per channel and run of `group_size` tokens (KIVI's keys).
    PerChannel,
    /// One group per token and run of `group_size` channels (KIVI's values).
    PerToken,
}

/// A group's scale and zero point: `x ≈ zero + code * scale`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupParams {
    /// Step between consecutive codes.
    pub scale: f16,
    /// The value of code 0.
    pub zero: f16,
}

/// Largest magnitude kept away from f16's limit (65504) so that outward rounding cannot overflow.
pub(crate) const F16_SAFE: f32 = 65000.0;

/// The f16 nearest `x` toward -inf (`down`) or +inf.
fn f16_directed(x: f32, down: bool) -> f16 {
    let h = f16::from_f32(x);
    let back = h.to_f32();
    if (down && back <= x) || (!down && back >= x) {
        return h;
    }
    let bits = h.to_bits();
    let positive = bits & 0x8000 == 0;
    let next = match (down, positive, bits & 0x7fff == 0) {
        (true, _, true) => 0x8001,         // ±0 down: smallest negative subnormal
        (false, _, true) => 0x0001,        // ±0 up: smallest positive subnormal
        (true, true, false) => bits - 1,   // positive, toward zero
        (true, false, false) => bits + 1,  // negative, away from zero
        (false, true, false) => bits + 1,  // positive, away from zero
        (false, false, false) => bits - 1, // negative, toward zero
    };
    f16::from_bits(next)
}

impl GroupParams {
    /// Parameters covering `[min, max]` with `bits` codes: zero rounded down, scale rounded up, and
    /// the top code checked to reach `max` in the f32 arithmetic dequantization uses.
    pub fn covering(min: f32, max: f32, bits: Bits) -> GroupParams {
        let zero = f16_directed(min, true);
        let z = zero.to_f32();
        let levels = bits.max_code() as f32;
        if max <= z {
            return GroupParams {
                scale: f16::ZERO,
                zero,
            };
        }
        let mut scale = f16_directed((max - z) / levels, false);
        // The f32 product can still fall short of `max` by a rounding: step the scale up.
        while z + levels * scale.to_f32() < max {
            scale = f16::from_bits(scale.to_bits() + 1);
        }
        GroupParams { scale, zero }
    }

    /// `1 / scale`, or 0 for a constant group (every code 0). Codes are computed by multiplying
    /// with it, on the host and on devices alike, so both give the same codes.
    #[inline]
    pub fn inv_scale(&self) -> f32 {
        let s = self.scale.to_f32();
        if s == 0.0 {
            0.0
        } else {
            1.0 / s
        }
    }

    /// The code of `x`: `round((x - zero) / scale)` clamped to the code range.
    #[inline]
    pub fn code(&self, x: f32, max_code: u32) -> u8 {
        ((x - self.zero.to_f32()) * self.inv_scale() + 0.5)
            .floor()
            .clamp(0.0, max_code as f32) as u8
    }

    /// The value of `code`.
    #[inline]
    pub fn value(&self, code: u8) -> f32 {
        self.zero.to_f32() + code as f32 * self.scale.to_f32()
    }
}

/// How a `[heads, tokens, dim]` block splits into groups.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    pub shape: [usize; 3],
    pub axis: QuantAxis,
    pub group_size: usize,
}

impl Layout {
    pub fn new(shape: [usize; 3], axis: QuantAxis, group_size: usize) -> Result<Self, QuantError> {
        if group_size == 0 {
            return Err(QuantError::Shape("group_size must be at least 1".into()));
        }
        if shape.iter().product::<usize>() == 0 {
            return Err(QuantError::Shape(format!("empty block {shape:?}")));
        }
        Ok(Layout {
            shape,
            axis,
            group_size,
        })
    }

    /// Groups along the statistics axis of one (head, other-axis index).
    pub fn groups_per_line(&self) -> usize {
        let [_, t, d] = self.shape;
        match self.axis {
            QuantAxis::PerChannel => t.div_ceil(self.group_size),
            QuantAxis::PerToken => d.div_ceil(self.group_size),
        }
    }

    /// Total number of groups.
    pub fn group_count(&self) -> usize {
        let [h, t, d] = self.shape;
        let lines = match self.axis {
            QuantAxis::PerChannel => h * d,
            QuantAxis::PerToken => h * t,
        };
        lines * self.groups_per_line()
    }

    /// The group of element `[head, token, channel]`. Per channel, groups are ordered
    /// (head, token group, channel); per token, (head, token, channel group).
    #[inline]
    pub fn group_of(&self, head: usize, token: usize, channel: usize) -> usize {
        let [_, t, d] = self.shape;
        let g = self.group_size;
        match self.axis {
            QuantAxis::PerChannel => (head * t.div_ceil(g) + token / g) * d + channel,
            QuantAxis::PerToken => (head * t + token) * d.div_ceil(g) + channel / g,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directed_rounding_brackets_the_value() {
        for x in [
            0.1f32, -0.1, 1e-6, -1e-6, 3.25159, -2.61828, 0.0, 1000.3, -65000.0,
        ] {
            assert!(f16_directed(x, true).to_f32() <= x, "{x}");
            assert!(f16_directed(x, false).to_f32() >= x, "{x}");
        }
    }
}
