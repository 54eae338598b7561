//! Log-probabilities of a sampled token and of the most likely ones, as OpenAI's `logprobs` and
//! `top_logprobs` report them: from the model's own distribution (the softmax of the raw logits,
//! before temperature or top-p), whatever the sampler then drew.

/// One generated token's log-probability and the `n` most likely tokens at its position.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    /// The token generated.
    pub token: u32,
    /// Its log-probability.
    pub logprob: f32,
    /// The most likely tokens and their log-probabilities, most likely first (ties: lower id
    /// first, so the first is [`super::argmax`]'s pick).
    pub top: Vec<(u32, f32)>,
}

/// `token`'s log-probability under `logits` and the `top` most likely tokens'. The normaliser is
/// summed in f64 from the largest logit down, so every log-probability is at most 0.
pub fn token_logprobs(logits: &[f32], token: u32, top: usize) -> TokenLogprobs {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let normaliser = max as f64 + sum.ln();
    let logprob = |l: f32| (l as f64 - normaliser).min(0.0) as f32;
    let top = top.min(logits.len());
    // Only when alternatives are asked for: a vocabulary's worth of ids otherwise for nothing.
    let mut ids: Vec<u32> = if top > 0 {
        (0..logits.len() as u32).collect()
    } else {
        Vec::new()
    };
    let most_likely_first = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    if top > 0 && top < ids.len() {
        ids.select_nth_unstable_by(top - 1, most_likely_first);
    }
    ids.truncate(top);
    ids.sort_unstable_by(most_likely_first);
    TokenLogprobs {
        token,
        logprob: logits
            .get(token as usize)
            .map_or(f32::NEG_INFINITY, |&l| logprob(l)),
        top: ids
            .into_iter()
            .map(|id| (id, logprob(logits[id as usize])))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The log-probabilities are a distribution's (at most 0, exponentials summing to 1),
        /// the top list is the most likely tokens in order, and the generated token's entry
        /// agrees with it.
        #[test]
        fn a_distributions_most_likely_tokens(
            logits in proptest::collection::vec(-30f32..30.0, 1..300),
            pick in 0usize..300,
            top in 0usize..25,
        ) {
            let token = (pick % logits.len()) as u32;
            let all = token_logprobs(&logits, token, logits.len());
            let total: f64 = all.top.iter().map(|(_, l)| (*l as f64).exp()).sum();
            prop_assert!((total - 1.0).abs() < 1e-4, "probabilities sum to {}", total);
            prop_assert!(all.top.iter().all(|(_, l)| *l <= 0.0));
            let r = token_logprobs(&logits, token, top);
            prop_assert_eq!(r.top.len(), top.min(logits.len()));
            prop_assert_eq!(&r.top[..], &all.top[..r.top.len()]);
            for w in all.top.windows(2) {
                prop_assert!(w[0].1 >= w[1].1);
                let (a, b) = (logits[w[0].0 as usize], logits[w[1].0 as usize]);
                prop_assert!(a > b || (a == b && w[0].0 < w[1].0));
            }
            prop_assert_eq!(all.top[0].0 as usize, super::super::argmax(&logits));
            let entry = all.top.iter().find(|(id, _)| *id == token).expect("every token listed");
            prop_assert_eq!(entry.1, r.logprob);
        }
    }

    #[test]
    fn an_out_of_range_token_has_no_probability() {
        let r = token_logprobs(&[1.0, 2.0], 7, 1);
        assert_eq!(r.logprob, f32::NEG_INFINITY);
        assert_eq!(r.top, vec![(1, token_logprobs(&[1.0, 2.0], 1, 0).logprob)]);
    }
}
