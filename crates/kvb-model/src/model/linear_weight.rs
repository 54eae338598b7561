//! A projection's weight behind one trait: each format knows its product, its size and how it
//! converts (8-bit activations, the bf16 yardstick), so the model's code never matches on
//! formats. kvb's formats are here; another crate's format implements [`LinearWeight`] and goes
//! into a [`super::Linear`] through [`super::Linear::from_weight`].

use super::backend_ops::ModelBackend;
use super::bf16_compute::{bf16, not_with_q8_activations, round_tensor, rounded_packed};
use super::int8::IntDotMatrix;
use crate::error::Result;
use crate::packed::PackedMatrix;
use burn::tensor::{Tensor, TensorData};
use kvb_attn::host_work;
use std::fmt::Debug;
use std::sync::Arc;

/// A weight `[in, out]` in some format.
pub trait LinearWeight<B: ModelBackend>: Debug + Send + Sync {
    /// `x`: `[n, in]` -> `[n, out]`.
    fn apply(&self, x: Tensor<B, 2>) -> Tensor<B, 2>;

    /// Output width.
    fn out_dim(&self) -> usize;

    /// Whether the weight is held quantized to integers, not as floats.
    fn is_quantized(&self) -> bool;

    /// Bytes the weight holds.
    fn bytes(&self) -> usize;

    /// Whether some part of it is one 8-bit activations take ([`IntDotMatrix::takes`]).
    fn takes_q8_activations(&self) -> bool {
        false
    }

    /// The weight laid out for 8-bit activations; `None` where it stays as it is.
    fn with_q8_activations(&self) -> Option<Arc<dyn LinearWeight<B>>> {
        None
    }

    /// [`LinearWeight::with_q8_activations`] of a weight its holder gives up, asked only where
    /// [`LinearWeight::takes_q8_activations`]: what nothing else holds may be converted in
    /// place, not beside a copy (an 8B model's LM head is 430 MB, and fresh pages cost a load
    /// their faults). `None` drops the weight.
    fn into_q8_activations(self: Arc<Self>) -> Option<Arc<dyn LinearWeight<B>>> {
        self.with_q8_activations()
    }

    /// The weight rounded to bf16 (the emulated bf16 forward); an error where the format
    /// cannot be.
    fn rounded_to_bf16(&self, device: &B::Device) -> Result<Arc<dyn LinearWeight<B>>>;

    /// The packed matrix it holds as it is, if any: a tied LM head shares the embedding's.
    fn packed(&self) -> Option<&Arc<PackedMatrix>> {
        None
    }
}

/// f32 (or the backend's float type) on the backend: `[in, out]` contiguous, or the transposed
/// view of `[out, in]` where [`ModelBackend::weights_out_in`].
#[derive(Debug, Clone)]
pub struct Dense<B: ModelBackend>(pub Tensor<B, 2>);

impl<B: ModelBackend> LinearWeight<B> for Dense<B> {
    fn apply(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        B::linear_matmul(x, self.0.clone())
    }

    fn out_dim(&self) -> usize {
        self.0.dims()[1]
    }

    fn is_quantized(&self) -> bool {
        false
    }

    fn bytes(&self) -> usize {
        self.0.shape().num_elements() * self.0.dtype().size()
    }

    fn rounded_to_bf16(&self, _device: &B::Device) -> Result<Arc<dyn LinearWeight<B>>> {
        let w = self.0.clone();
        // Rounded as held, `[out, in]`, so the view (and the backend's kernels) stay.
        let rounded = if B::weights_out_in() {
            round_tensor(w.transpose())?.transpose()
        } else {
            round_tensor(w)?
        };
        Ok(Arc::new(Dense(rounded)))
    }
}

/// Packed blocks in their stored precision, on a backend that multiplies them
/// ([`ModelBackend::runs_packed_weights`]). Shared: a tied LM head is the token embedding.
#[derive(Debug, Clone)]
pub struct Packed(pub Arc<PackedMatrix>);

impl<B: ModelBackend> LinearWeight<B> for Packed {
    fn apply(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        B::packed_linear(x, &self.0)
    }

    fn out_dim(&self) -> usize {
        self.0.n()
    }

    fn is_quantized(&self) -> bool {
        self.0.cell_values().is_integer()
    }

    fn bytes(&self) -> usize {
        self.0.bytes()
    }

    fn takes_q8_activations(&self) -> bool {
        IntDotMatrix::takes(&self.0)
    }

    /// Re-laid out, or K-quant cells shared as loaded.
    fn with_q8_activations(&self) -> Option<Arc<dyn LinearWeight<B>>> {
        let d = IntDotMatrix::from_packed(&self.0)?;
        Some(Arc::new(IntDot(Arc::new(d))))
    }

    /// The matrix itself re-laid where nothing else holds it, else a copy.
    fn into_q8_activations(self: Arc<Self>) -> Option<Arc<dyn LinearWeight<B>>> {
        let p = match Arc::try_unwrap(self) {
            Ok(Packed(p)) => p,
            Err(shared) => return shared.with_q8_activations(),
        };
        // A matrix the products do not take comes back as it was.
        Some(match IntDotMatrix::from_held(p) {
            Ok(d) => Arc::new(IntDot(Arc::new(d))),
            Err(p) => Arc::new(Packed(p)),
        })
    }

    fn rounded_to_bf16(&self, device: &B::Device) -> Result<Arc<dyn LinearWeight<B>>> {
        let p = &self.0;
        Ok(match rounded_packed(p)? {
            Some(r) => Arc::new(Packed(Arc::new(r))),
            None => {
                let dense: Vec<f32> = p.to_dense().into_iter().map(bf16).collect();
                Arc::new(Dense(Tensor::<B, 2>::from_data(
                    TensorData::new(dense, [p.k(), p.n()]),
                    kvb_attn::float_on::<B>(device),
                )))
            }
        })
    }

    fn packed(&self) -> Option<&Arc<PackedMatrix>> {
        Some(&self.0)
    }
}

/// Laid out for products with 8-bit activations (`--activations q8`, [`super::int8`]).
#[derive(Debug, Clone)]
pub struct IntDot(pub Arc<IntDotMatrix>);

impl<B: ModelBackend> LinearWeight<B> for IntDot {
    fn apply(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        B::int8_linear(x, &self.0)
    }

    fn out_dim(&self) -> usize {
        self.0.n()
    }

    fn is_quantized(&self) -> bool {
        true
    }

    fn bytes(&self) -> usize {
        self.0.bytes()
    }

    /// The emulated bf16 forward rounds f32 activations; these are quantized to 8 bits already.
    fn rounded_to_bf16(&self, _device: &B::Device) -> Result<Arc<dyn LinearWeight<B>>> {
        Err(not_with_q8_activations())
    }
}

/// Fused parts stored in different formats (a Q4_K_M file's Q4_K q and k beside a Q6_K v), each
/// kept as stored rather than all widened to a format that holds both; their outputs side by
/// side.
#[derive(Debug, Clone)]
pub struct Stacked<B: ModelBackend>(pub Vec<Arc<dyn LinearWeight<B>>>);

impl<B: ModelBackend> LinearWeight<B> for Stacked<B> {
    fn apply(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        // One product per stored part (each counted), and their concatenation.
        let outputs = self.0.iter().map(|w| {
            host_work::launched(1);
            w.apply(x.clone())
        });
        Tensor::cat(outputs.collect(), 1)
    }

    fn out_dim(&self) -> usize {
        self.0.iter().map(|w| w.out_dim()).sum()
    }

    fn is_quantized(&self) -> bool {
        self.0.iter().all(|w| w.is_quantized())
    }

    fn bytes(&self) -> usize {
        self.0.iter().map(|w| w.bytes()).sum()
    }

    fn takes_q8_activations(&self) -> bool {
        self.0.iter().any(|w| w.takes_q8_activations())
    }

    fn with_q8_activations(&self) -> Option<Arc<dyn LinearWeight<B>>> {
        let parts = self
            .0
            .iter()
            .map(|w| w.with_q8_activations().unwrap_or_else(|| w.clone()))
            .collect();
        Some(Arc::new(Stacked(parts)))
    }

    /// Each part that takes them given up to its own conversion.
    fn into_q8_activations(self: Arc<Self>) -> Option<Arc<dyn LinearWeight<B>>> {
        let parts = match Arc::try_unwrap(self) {
            Ok(Stacked(parts)) => parts,
            Err(shared) => return shared.with_q8_activations(),
        };
        let parts = parts
            .into_iter()
            .map(|w| match w.takes_q8_activations() {
                true => w.into_q8_activations(),
                false => Some(w),
            })
            .collect::<Option<_>>()?;
        Some(Arc::new(Stacked(parts)))
    }

    fn rounded_to_bf16(&self, device: &B::Device) -> Result<Arc<dyn LinearWeight<B>>> {
        let parts = self
            .0
            .iter()
            .map(|w| w.rounded_to_bf16(device))
            .collect::<Result<_>>()?;
        Ok(Arc::new(Stacked(parts)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Linear;
    use burn::backend::NdArray;

    type B = NdArray<f32>;

    /// A format from outside kvb's: `[in, out]` values on the host, multiplied there.
    #[derive(Debug)]
    struct HostMatrix {
        values: Vec<f32>,
        k: usize,
        n: usize,
    }

    impl LinearWeight<B> for HostMatrix {
        fn apply(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
            let m = x.dims()[0];
            let x = crate::to_host_f32(x);
            let mut y = vec![0f32; m * self.n];
            for (row, out) in y.chunks_mut(self.n).enumerate() {
                for (i, &xi) in x[row * self.k..(row + 1) * self.k].iter().enumerate() {
                    for (o, w) in out
                        .iter_mut()
                        .zip(&self.values[i * self.n..(i + 1) * self.n])
                    {
                        *o += xi * w;
                    }
                }
            }
            Tensor::from_data(TensorData::new(y, [m, self.n]), &Default::default())
        }
        fn out_dim(&self) -> usize {
            self.n
        }
        fn is_quantized(&self) -> bool {
            false
        }
        fn bytes(&self) -> usize {
            self.values.len() * 4
        }
        fn rounded_to_bf16(
            &self,
            _device: &burn::tensor::Device<B>,
        ) -> Result<Arc<dyn LinearWeight<B>>> {
            Err(crate::error::ModelError::unsupported("not here".into()))
        }
    }

    fn values(len: usize, seed: f32) -> Vec<f32> {
        (0..len)
            .map(|i| ((i as f32 * 0.37 + seed).sin() * 4.0).round() / 4.0)
            .collect()
    }

    /// Another crate's format goes into a `Linear` and gives what the same values give as f32;
    /// a stack of formats gives its parts' outputs side by side.
    #[test]
    fn any_format_behind_the_trait_gives_the_same_product() {
        let (m, k, n) = (3, 8, 5);
        let dev = Default::default();
        let dense = |w: &[f32]| {
            Linear::<B>::from_in_out(Tensor::from_data(TensorData::new(w.to_vec(), [k, n]), &dev))
        };
        let (wa, wb) = (values(k * n, 0.5), values(k * n, 2.5));
        let x = Tensor::<B, 2>::from_data(TensorData::new(values(m * k, 1.5), [m, k]), &dev);
        let host: Arc<dyn LinearWeight<B>> = Arc::new(HostMatrix {
            values: wb.clone(),
            k,
            n,
        });
        let ours = Linear::from_weight(host.clone(), None);
        let want_b = crate::to_host_f32(dense(&wb).forward(x.clone()));
        assert_eq!(crate::to_host_f32(ours.forward(x.clone())), want_b);
        assert_eq!(
            (ours.out_dim(), ours.weight_bytes(), ours.is_quantized()),
            (n, k * n * 4, false)
        );

        let a = dense(&wa);
        let want_a = crate::to_host_f32(a.forward(x.clone()));
        let stacked = Linear::from_weight(Arc::new(Stacked(vec![a.weight.clone(), host])), None);
        assert_eq!(stacked.out_dim(), 2 * n);
        let both = crate::to_host_f32(stacked.forward(x));
        for row in 0..m {
            let got = &both[row * 2 * n..(row + 1) * 2 * n];
            assert_eq!(&got[..n], &want_a[row * n..(row + 1) * n]);
            assert_eq!(&got[n..], &want_b[row * n..(row + 1) * n]);
        }
    }
}
