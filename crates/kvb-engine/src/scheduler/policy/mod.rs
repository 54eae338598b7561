//! The scheduling policy as data: what a step runs, decided from a view of the running
//! sequences alone (no model, no pool), as a [`StepPlan`] that `step.rs` carries out. Which
//! sequences a full pool preempts is decided here too ([`preemption_victims`]), and whether a
//! waiting request starts ([`admission`]).

mod admission;
mod preemption;

pub(crate) use admission::{admission, waits_for_prefill, Admission, Candidate, PrefillView, Room};
pub(crate) use preemption::{preemption_victims, Holder};

/// A piece of a sequence's prefill work, as the policy sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pending {
    /// A reused run to place (and repair): no rows of the step's budget.
    Place,
    /// This many prompt rows to compute.
    Compute(usize),
}

/// A running sequence, as the policy sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SeqView {
    /// It samples one row per step (its prompt is in).
    pub decoding: bool,
    /// Its prefill work, in order.
    pub work: Vec<Pending>,
}

/// The token budgets of a step.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budgets {
    /// Rows one forward pass runs at most.
    pub max_batch_tokens: usize,
    /// Prefill rows a step takes at most while sequences decode.
    pub prefill_tokens_while_decoding: usize,
}

/// What one running sequence does in a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slice {
    /// One decode row.
    Decode,
    /// Place its next `places` reused runs, then compute the first `rows` rows of the work
    /// after them (0: it waits for a step with room).
    Prefill { places: usize, rows: usize },
}

/// A step's plan: what each running sequence does, by index into the running set; decoders
/// first, then prefills, oldest first. Sequences absent wait.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct StepPlan {
    pub slices: Vec<(usize, Slice)>,
}

/// How a step's prefill rows are shared out.
#[derive(Clone, Copy, Debug)]
struct PrefillBudget {
    /// Prefill rows of a whole step.
    step: usize,
    /// Of those, what this step has left.
    left: usize,
}

impl PrefillBudget {
    /// Rows a step takes of a prefill slice of `next` rows, when `queued` rows (that slice's and
    /// those of every prefill after it in this step; at least `next`) are known and `backlog`
    /// says whether requests also wait to be admitted.
    ///
    /// A slice that does not fit what is left is cut to fill it only when that saves a step on
    /// the known work: otherwise it finishes in the same later step either way, and waiting
    /// whole keeps this step shorter for every sequence in it (the server bench's warm-turn
    /// TTFT; see `bench/results/2026-11-25-prefill-slices-server`). Never more than `left`;
    /// never 0 from an untouched step, so the oldest prefill always advances.
    fn take(&self, next: usize, queued: usize, backlog: bool) -> usize {
        let steps = |rows: usize| rows.div_ceil(self.step.max(1));
        let queued = queued.max(next);
        let waiting_saves_nothing = steps(queued) == steps(queued.saturating_sub(self.left));
        if next > self.left && self.left < self.step && !backlog && waiting_saves_nothing {
            0
        } else {
            next.min(self.left)
        }
    }
}

/// The plan of a step over `running` (in the order they were admitted): every decoding
/// sequence gets its row; the prefill budget (the whole step's rows, or
/// `prefill_tokens_while_decoding` while any decodes) goes to prefill slices oldest first, each
/// sequence's places going with its next slice. `backlog`: requests wait to be admitted.
pub(crate) fn plan_step(running: &[SeqView], budgets: Budgets, backlog: bool) -> StepPlan {
    let decoding = running.iter().filter(|s| s.decoding).count();
    let step = if decoding > 0 {
        budgets
            .prefill_tokens_while_decoding
            .min(budgets.max_batch_tokens.saturating_sub(decoding))
    } else {
        budgets.max_batch_tokens
    };
    let mut slices: Vec<(usize, Slice)> = (0..running.len())
        .filter(|&i| running[i].decoding)
        .map(|i| (i, Slice::Decode))
        .collect();
    // Rows of each prefill and of every prefill after it.
    let mut queued: Vec<usize> = running
        .iter()
        .map(|s| {
            s.work
                .iter()
                .map(|w| match w {
                    Pending::Compute(n) => *n,
                    Pending::Place => 0,
                })
                .sum()
        })
        .collect();
    for i in (0..queued.len().saturating_sub(1)).rev() {
        queued[i] += queued[i + 1];
    }
    let mut left = step;
    for (i, s) in running.iter().enumerate() {
        if s.decoding {
            continue;
        }
        let (mut places, mut rows) = (0, 0);
        for w in &s.work {
            if left == 0 {
                break;
            }
            match *w {
                Pending::Place => places += 1,
                Pending::Compute(n) => {
                    rows = PrefillBudget { step, left }.take(n, queued[i], backlog);
                    left -= rows;
                    break;
                }
            }
        }
        if places > 0 || rows > 0 {
            slices.push((i, Slice::Prefill { places, rows }));
        }
    }
    StepPlan { slices }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn view() -> impl Strategy<Value = SeqView> {
        (
            any::<bool>(),
            proptest::collection::vec(
                prop_oneof![
                    1 => Just(Pending::Place),
                    3 => (1usize..300).prop_map(Pending::Compute),
                ],
                0..4,
            ),
        )
            .prop_map(|(decoding, work)| {
                let mut work = if decoding { Vec::new() } else { work };
                if !decoding && !work.iter().any(|w| matches!(w, Pending::Compute(_))) {
                    // A prefill always ends in a computed suffix (its last token's logits).
                    work.push(Pending::Compute(1));
                }
                SeqView { decoding, work }
            })
    }

    fn budgets() -> impl Strategy<Value = Budgets> {
        (1usize..600, 1usize..600).prop_map(|(max_batch_tokens, p)| Budgets {
            max_batch_tokens,
            prefill_tokens_while_decoding: p,
        })
    }

    fn rows(plan: &StepPlan) -> usize {
        plan.slices
            .iter()
            .map(|(_, s)| match s {
                Slice::Decode => 1,
                Slice::Prefill { rows, .. } => *rows,
            })
            .sum()
    }

    fn prefill_rows(plan: &StepPlan) -> usize {
        plan.slices
            .iter()
            .map(|(_, s)| match s {
                Slice::Prefill { rows, .. } => *rows,
                Slice::Decode => 0,
            })
            .sum()
    }

    /// The next compute slice of `s` (after its places).
    fn next_compute(s: &SeqView) -> usize {
        s.work
            .iter()
            .find_map(|w| match w {
                Pending::Compute(n) => Some(*n),
                Pending::Place => None,
            })
            .unwrap_or(0)
    }

    proptest! {
        /// Within what is left; whole when it fits; all that is left with a backlog; a slice
        /// waits only when waiting costs no step on the known work, and is cut only when cutting
        /// saves one; an untouched step always advances a prefill.
        #[test]
        fn a_slice_is_cut_only_when_that_saves_a_step(
            next in 1usize..300,
            after in 0usize..400,
            step in 1usize..130,
            used in 0usize..130,
            backlog: bool,
        ) {
            let b = PrefillBudget { step, left: step.saturating_sub(used).max(1) };
            let queued = next + after;
            let take = b.take(next, queued, backlog);
            prop_assert!(take == 0 || take == next.min(b.left));
            let steps = |rows: usize| rows.div_ceil(step);
            let saves_a_step = steps(queued) > steps(queued - b.left.min(queued));
            if next <= b.left || backlog || b.left == step {
                prop_assert_eq!(take, next.min(b.left));
            } else if saves_a_step {
                prop_assert_eq!(take, b.left, "waited, though cutting saves a step");
            } else {
                prop_assert_eq!(take, 0, "cut, though waiting costs no step");
            }
        }

        /// Every decoder gets its row, the step's budget holds, and a sequence appears once.
        #[test]
        fn decoders_run_and_the_budget_holds(
            running in proptest::collection::vec(view(), 0..12),
            b in budgets(),
            backlog in any::<bool>(),
        ) {
            let plan = plan_step(&running, b, backlog);
            let decoders = running.iter().filter(|s| s.decoding).count();
            prop_assert_eq!(
                plan.slices.iter().filter(|(_, s)| *s == Slice::Decode).count(),
                decoders
            );
            for (i, s) in &plan.slices {
                prop_assert_eq!(running[*i].decoding, *s == Slice::Decode);
            }
            let mut seen: Vec<usize> = plan.slices.iter().map(|(i, _)| *i).collect();
            seen.sort();
            seen.dedup();
            prop_assert_eq!(seen.len(), plan.slices.len());
            let prefill = prefill_rows(&plan);
            if decoders > 0 {
                prop_assert!(prefill <= b.prefill_tokens_while_decoding);
                prop_assert!(prefill + decoders <= b.max_batch_tokens.max(decoders));
            } else {
                prop_assert!(prefill <= b.max_batch_tokens);
            }
            for (i, s) in &plan.slices {
                if let Slice::Prefill { places, rows } = *s {
                    let w = &running[*i].work;
                    prop_assert!(rows <= next_compute(&running[*i]));
                    prop_assert!(w[..places].iter().all(|p| *p == Pending::Place));
                    prop_assert!(places < w.len(), "a compute follows the places");
                }
            }
        }

        /// No prefill starves: the oldest prefilling sequence advances in every step that has
        /// prefill rows at all (at least one row, or all its places first).
        #[test]
        fn the_oldest_prefill_always_advances(
            running in proptest::collection::vec(view(), 1..12),
            b in budgets(),
            backlog in any::<bool>(),
        ) {
            let plan = plan_step(&running, b, backlog);
            let decoders = running.iter().filter(|s| s.decoding).count();
            let has_budget = if decoders > 0 {
                b.prefill_tokens_while_decoding.min(b.max_batch_tokens.saturating_sub(decoders)) > 0
            } else {
                true
            };
            if let (Some(oldest), true) = (running.iter().position(|s| !s.decoding), has_budget) {
                let slice = plan.slices.iter().find(|(i, _)| *i == oldest).map(|(_, s)| *s);
                let places = running[oldest].work.iter().take_while(|w| **w == Pending::Place).count();
                match slice {
                    Some(Slice::Prefill { places: p, rows }) => {
                        prop_assert_eq!(p, places);
                        prop_assert!(rows > 0, "{:?}", plan);
                    }
                    other => prop_assert!(false, "the oldest prefill got {:?}", other),
                }
            }
        }

        /// Arrival order among equals: a younger prefill gets rows only where every older one
        /// took its whole next slice or could not fit it whole in what was left for it.
        #[test]
        fn a_younger_prefill_never_takes_what_an_older_one_fits(
            running in proptest::collection::vec(view(), 1..12),
            b in budgets(),
            backlog in any::<bool>(),
        ) {
            let plan = plan_step(&running, b, backlog);
            let decoders = running.iter().filter(|s| s.decoding).count();
            let mut left = if decoders > 0 {
                b.prefill_tokens_while_decoding.min(b.max_batch_tokens.saturating_sub(decoders))
            } else {
                b.max_batch_tokens
            };
            let rows_of = |i: usize| plan.slices.iter().find_map(|(j, s)| match s {
                Slice::Prefill { rows, .. } if *j == i => Some(*rows),
                _ => None,
            }).unwrap_or(0);
            for (i, s) in running.iter().enumerate().filter(|(_, s)| !s.decoding) {
                let (next, rows) = (next_compute(s), rows_of(i));
                if rows < next {
                    // Cut or waiting: only because its whole slice did not fit.
                    prop_assert!(next > left, "seq {i}: {rows} of {next} with {left} left");
                }
                left -= rows;
            }
        }
    }

    /// A slice that does not fit waits whole when cutting it saves no step, and is cut when
    /// requests wait to be admitted (they need the rows used now).
    #[test]
    fn a_slice_waits_whole_unless_cutting_saves_a_step() {
        let b = Budgets {
            max_batch_tokens: 100,
            prefill_tokens_while_decoding: 100,
        };
        let seq = |n: usize| SeqView {
            decoding: false,
            work: vec![Pending::Compute(n)],
        };
        let plan = plan_step(&[seq(60), seq(60)], b, false);
        assert_eq!(
            plan.slices,
            [(
                0,
                Slice::Prefill {
                    places: 0,
                    rows: 60
                }
            )],
            "120 rows take two steps, cut or not: the second waits whole"
        );
        let plan = plan_step(&[seq(60), seq(60)], b, true);
        assert_eq!(
            plan.slices[1],
            (
                1,
                Slice::Prefill {
                    places: 0,
                    rows: 40
                }
            )
        );
        let plan = plan_step(&[seq(60), seq(90), seq(50)], b, false);
        assert_eq!(rows(&plan), 100, "200 rows: cutting keeps it to two steps");
    }
}
