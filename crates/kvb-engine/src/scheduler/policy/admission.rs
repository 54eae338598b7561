//! Admission's rule: whether the oldest undecided waiting request starts now, waits for a
//! running prefill, or stops admission for this step. `admit.rs` plans each request's reuse
//! (which reads the pool's tree as the admissions before it left it) and carries the decision out.

/// A waiting request, once its reuse is planned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// Fresh blocks it needs to start (its prompt and first token, less the blocks it reuses).
    pub needed_blocks: usize,
    /// A running prefill will index more of its prompt than the cache holds now
    /// ([`waits_for_prefill`]).
    pub waits_for_prefill: bool,
}

/// What admission has room for now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Room {
    /// Running slots left (`max_running` less the running sequences).
    pub slots: usize,
    /// Blocks the pool can give without preempting (free and evictable).
    pub blocks: usize,
}

/// The decision for one waiting request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// It starts now.
    Start,
    /// It waits for a running prefill to index its shared prefix; younger requests may start.
    Wait,
    /// No room: admission stops, so nothing younger overtakes it.
    Stop,
}

/// Admission's rule for the oldest waiting request not yet decided this step.
pub(crate) fn admission(candidate: &Candidate, room: Room) -> Admission {
    if room.slots == 0 {
        Admission::Stop
    } else if candidate.waits_for_prefill {
        Admission::Wait
    } else if candidate.needed_blocks > room.blocks {
        Admission::Stop
    } else {
        Admission::Start
    }
}

/// A running sequence still prefilling, as admission sees it (same namespace and reuse mode as
/// the waiting request).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PrefillView<'a> {
    /// The prompt tokens it will index (its cacheable prefix).
    pub tokens: &'a [u32],
    /// Slots below this already hold final K/V (indexed, or about to be).
    pub final_until: usize,
}

/// Whether a prompt whose reuse found `cached_blocks` whole blocks should wait for one of
/// `prefills`: one that shares more whole blocks with it (never counting its last token, which
/// is always computed) and has not made them final yet. Sixteen chats arriving at once behind
/// one system prompt then compute it once, not sixteen times side by side.
pub(crate) fn waits_for_prefill<'a>(
    prompt: &[u32],
    cached_blocks: usize,
    block_size: usize,
    prefills: impl IntoIterator<Item = PrefillView<'a>>,
) -> bool {
    let Some(last) = prompt.len().checked_sub(1) else {
        return false;
    };
    prefills.into_iter().any(|p| {
        let common = prompt
            .iter()
            .zip(p.tokens)
            .take_while(|(a, b)| a == b)
            .count()
            .min(last);
        common / block_size > cached_blocks && p.final_until < common
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The queue decided oldest first, as `admit.rs` does: a start takes a slot and its blocks.
    fn decide(queue: &[Candidate], mut room: Room) -> Vec<Admission> {
        let mut out = Vec::new();
        for c in queue {
            let d = admission(c, room);
            out.push(d);
            match d {
                Admission::Start => {
                    room.slots -= 1;
                    room.blocks -= c.needed_blocks;
                }
                Admission::Wait => {}
                Admission::Stop => break,
            }
        }
        out
    }

    fn candidate() -> impl Strategy<Value = Candidate> {
        (0usize..8, prop::bool::weighted(0.2)).prop_map(|(needed_blocks, waits_for_prefill)| {
            Candidate {
                needed_blocks,
                waits_for_prefill,
            }
        })
    }

    proptest! {
        /// Starts never take more slots or blocks than there are; the oldest request that does
        /// not wait for a prefill starts whenever it fits, so it is never passed over.
        #[test]
        fn room_holds_and_the_oldest_fitting_request_starts(
            queue in prop::collection::vec(candidate(), 0..12),
            slots in 0usize..6,
            blocks in 0usize..20,
        ) {
            let decided = decide(&queue, Room { slots, blocks });
            let started: Vec<&Candidate> = queue
                .iter()
                .zip(&decided)
                .filter(|(_, d)| **d == Admission::Start)
                .map(|(c, _)| c)
                .collect();
            prop_assert!(started.len() <= slots);
            prop_assert!(started.iter().map(|c| c.needed_blocks).sum::<usize>() <= blocks);
            if let Some(oldest) = queue.iter().position(|c| !c.waits_for_prefill) {
                if slots > 0 && queue[oldest].needed_blocks <= blocks {
                    prop_assert_eq!(decided[oldest], Admission::Start);
                }
            }
        }

        /// Arrival order is kept: once a request is stopped for room, nothing younger is decided;
        /// only a request waiting for a prefill lets a younger one pass; and it never starts.
        #[test]
        fn nothing_younger_overtakes_a_request_that_waits_for_room(
            queue in prop::collection::vec(candidate(), 0..12),
            slots in 0usize..6,
            blocks in 0usize..20,
        ) {
            let decided = decide(&queue, Room { slots, blocks });
            if let Some(stop) = decided.iter().position(|d| *d == Admission::Stop) {
                prop_assert_eq!(stop, decided.len() - 1);
            } else {
                prop_assert_eq!(decided.len(), queue.len());
            }
            for (c, d) in queue.iter().zip(&decided) {
                if c.waits_for_prefill && *d != Admission::Stop {
                    prop_assert_eq!(*d, Admission::Wait);
                }
            }
        }

        /// A prompt waits only for a prefill that will make more of its whole blocks final
        /// than the cache gives it; with none running it never waits.
        #[test]
        fn a_prompt_waits_only_for_a_prefill_that_gives_it_more(
            shared in 0usize..40,
            prompt_tail in 1usize..20,
            cached_blocks in 0usize..6,
            final_until in 0usize..50,
        ) {
            let bs = 4;
            let prompt: Vec<u32> = (0..(shared + prompt_tail) as u32).collect();
            let mut other: Vec<u32> = prompt[..shared].to_vec();
            other.extend([u32::MAX; 7]);
            let view = PrefillView { tokens: &other, final_until };
            let waits = waits_for_prefill(&prompt, cached_blocks, bs, [view]);
            let common = shared.min(prompt.len() - 1);
            prop_assert_eq!(waits, common / bs > cached_blocks && final_until < common);
            prop_assert!(!waits_for_prefill(&prompt, cached_blocks, bs, []));
        }
    }

    #[test]
    fn the_last_token_is_never_shared() {
        // The same 8-token prompt running: only 7 tokens count, one whole block of 4.
        let prompt: Vec<u32> = (0..8).collect();
        let view = PrefillView {
            tokens: &prompt,
            final_until: 0,
        };
        assert!(waits_for_prefill(&prompt, 0, 4, [view]));
        assert!(!waits_for_prefill(&prompt, 1, 4, [view]));
        assert!(!waits_for_prefill(&[], 0, 4, [view]));
    }
}
