//! Preemption's rule: which running sequences a full pool preempts so that every decoding
//! sequence left gets the block its next token needs. `step.rs` carries it out.

use kvb_blocks::BlockId;
use std::collections::HashMap;

/// A running sequence, as preemption sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Holder<'a> {
    /// Admission order: larger is newer.
    pub order: u64,
    /// It decodes and its table is full: its next token needs a fresh block.
    pub needs_block: bool,
    /// Its block table.
    pub blocks: &'a [BlockId],
}

/// The sequences to preempt, newest first, by index into `running`: the fewest of the newest
/// after which the pool's `available` blocks, and the blocks the preempted ones free, cover every
/// sequence left that needs a block. A block is freed once every sequence holding it is
/// preempted (`holders(b)`: the running tables that list it). Empty when `available` covers
/// them now.
pub(crate) fn preemption_victims(
    running: &[Holder<'_>],
    available: usize,
    holders: impl Fn(BlockId) -> u32,
) -> Vec<usize> {
    let mut newest_first: Vec<usize> = (0..running.len()).collect();
    newest_first.sort_unstable_by_key(|&i| std::cmp::Reverse(running[i].order));
    let mut room = available;
    let mut needs = running.iter().filter(|h| h.needs_block).count();
    let mut released: HashMap<BlockId, u32> = HashMap::new();
    let mut victims = Vec::new();
    for i in newest_first {
        if needs <= room {
            break;
        }
        for &b in running[i].blocks {
            let n = released.entry(b).or_insert(0);
            *n += 1;
            if *n == holders(b) {
                room += 1;
            }
        }
        needs -= usize::from(running[i].needs_block);
        victims.push(i);
    }
    victims
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Running sequences: tables drawn from a few blocks (so they share some), distinct orders.
    fn running() -> impl Strategy<Value = Vec<(u64, bool, Vec<BlockId>)>> {
        proptest::collection::vec(
            (
                any::<bool>(),
                proptest::collection::btree_set(0 as BlockId..12, 0..5),
            ),
            0..8,
        )
        .prop_flat_map(|seqs| {
            let n = seqs.len();
            (
                Just(seqs),
                Just((0..n as u64).collect::<Vec<_>>()).prop_shuffle(),
            )
        })
        .prop_map(|(seqs, orders)| {
            seqs.into_iter()
                .zip(orders)
                .map(|((needs, blocks), order)| (order, needs, blocks.into_iter().collect()))
                .collect()
        })
    }

    /// Blocks all of whose holders are in `preempted`.
    fn freed(seqs: &[(u64, bool, Vec<BlockId>)], preempted: &[usize]) -> usize {
        let mut blocks: Vec<BlockId> = seqs.iter().flat_map(|s| s.2.clone()).collect();
        blocks.sort_unstable();
        blocks.dedup();
        blocks
            .into_iter()
            .filter(|b| {
                (0..seqs.len())
                    .filter(|i| seqs[*i].2.contains(b))
                    .all(|i| preempted.contains(&i))
            })
            .count()
    }

    /// Blocks the survivors of `preempted` need.
    fn needed(seqs: &[(u64, bool, Vec<BlockId>)], preempted: &[usize]) -> usize {
        (0..seqs.len())
            .filter(|i| seqs[*i].1 && !preempted.contains(i))
            .count()
    }

    proptest! {
        /// Preemption frees what the decoders left need, takes the newest, and takes no more
        /// than it must.
        #[test]
        fn preemption_frees_what_the_decoders_need(seqs in running(), available in 0usize..4) {
            let holders = |b: BlockId| seqs.iter().filter(|s| s.2.contains(&b)).count() as u32;
            let views: Vec<Holder> = seqs
                .iter()
                .map(|(order, needs_block, blocks)| Holder {
                    order: *order,
                    needs_block: *needs_block,
                    blocks,
                })
                .collect();
            let victims = preemption_victims(&views, available, holders);
            prop_assert!(
                needed(&seqs, &victims) <= available + freed(&seqs, &victims),
                "victims {:?} leave too little room",
                victims
            );
            // Newest first, and newer than every sequence left.
            for w in victims.windows(2) {
                prop_assert!(seqs[w[0]].0 > seqs[w[1]].0);
            }
            let oldest_victim = victims.last().map(|&v| seqs[v].0);
            for i in (0..seqs.len()).filter(|i| !victims.contains(i)) {
                prop_assert!(oldest_victim.is_none_or(|o| seqs[i].0 < o));
            }
            // The fewest: sparing the last one taken would not have been enough.
            if let Some((_, fewer)) = victims.split_last() {
                prop_assert!(needed(&seqs, fewer) > available + freed(&seqs, fewer));
            }
        }
    }

    /// A prefix two newest sequences share is freed only when both go.
    #[test]
    fn a_shared_block_is_freed_when_its_last_holder_goes() {
        let (shared, own_a, own_b) = ([7], [7, 8], [7, 9]);
        let views = [
            Holder {
                order: 0,
                needs_block: true,
                blocks: &[1, 2],
            },
            Holder {
                order: 1,
                needs_block: false,
                blocks: &own_a,
            },
            Holder {
                order: 2,
                needs_block: false,
                blocks: &own_b,
            },
            Holder {
                order: 3,
                needs_block: false,
                blocks: &shared,
            },
        ];
        let holders = |b: BlockId| if b == 7 { 3 } else { 1 };
        // The newest frees nothing (block 7 is shared); the next frees block 9, enough.
        assert_eq!(preemption_victims(&views, 0, holders), [3, 2]);
        assert_eq!(preemption_victims(&views, 1, holders), Vec::<usize>::new());
    }
}
