//! The block manager's promises, by a model-based property test: random sequences start (reusing
//! resident prefixes), compute, finish, are cancelled; the tree is evicted and cleared. Each
//! block carries shadow "K/V" (the token and position written in each slot), so a write that
//! reached a block another sequence reads would show up as wrong content for that reader. Each
//! sequence belongs to one of a few tenants (scopes), and the shadow K/V records whose it is, so a
//! block that crossed from one tenant to another would too.

use kvb_blocks::{BlockId, BlockManager, IndexCursor, Insertion, Removed, Scope, ROOT};

use proptest::prelude::*;
use std::collections::HashMap;

#[derive(Debug, Clone)]
enum Op {
    /// A new sequence: the first `keep` tokens of an earlier sequence's tokens (if any), then
    /// `fresh` new ones from `seed`; reads approximate blocks when `approx_ok`; for `tenant`.
    Start {
        tenant: u8,
        from: usize,
        keep: usize,
        fresh: usize,
        seed: u32,
        approx_ok: bool,
        approximate_from: Option<usize>,
    },
    /// Compute `n` more slots of a running sequence.
    Advance {
        seq: usize,
        n: usize,
    },
    /// Finish: index every block, release the table.
    Finish {
        seq: usize,
    },
    /// Cancel: release the table, index nothing more.
    Cancel {
        seq: usize,
    },
    Evict {
        n: usize,
    },
    Clear,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..3, 0usize..8, 0usize..40, 0usize..30, 0u32..4, any::<bool>(), prop::option::of(0usize..40))
            .prop_map(|(tenant, from, keep, fresh, seed, approx_ok, approximate_from)| Op::Start { tenant, from, keep, fresh, seed, approx_ok, approximate_from }),
        4 => (0usize..8, 1usize..12).prop_map(|(seq, n)| Op::Advance { seq, n }),
        2 => (0usize..8).prop_map(|seq| Op::Finish { seq }),
        1 => (0usize..8).prop_map(|seq| Op::Cancel { seq }),
        1 => (1usize..6).prop_map(|n| Op::Evict { n }),
        1 => Just(Op::Clear),
    ]
}

/// A running sequence of the model.
#[derive(Debug)]
struct Seq {
    tenant: u8,
    tokens: Vec<u32>,
    table: Vec<BlockId>,
    /// Slots with K/V (read from the tree, copied, or computed).
    computed: usize,
    /// How far the table is indexed by the tree (or was read from it).
    cursor: IndexCursor,
    /// Slots from here on are approximate.
    approximate_from: usize,
}

struct World {
    m: BlockManager,
    bs: usize,
    /// Shadow K/V: per block, per slot, the (token, position, tenant) written there.
    content: HashMap<BlockId, Vec<Option<(u32, usize, u8)>>>,
    seqs: Vec<Option<Seq>>,
    /// Every sequence's tokens ever started (what new sequences extend).
    history: Vec<Vec<u32>>,
    /// Every block the allocator ever handed out.
    handed_out: std::collections::HashSet<BlockId>,
}

fn fresh_tokens(seed: u32, n: usize, salt: usize) -> Vec<u32> {
    // A small alphabet, so prompts share prefixes and partial blocks often.
    (0..n)
        .map(|i| (seed * 7 + (i * 3 + salt) as u32 % 5) % 6)
        .collect()
}

/// A tenant's scope: tenant 0 is the shared one.
fn scope(tenant: u8) -> Scope {
    if tenant == 0 {
        Scope::SHARED
    } else {
        Scope([tenant; 32])
    }
}

fn tenant_of(scope: Scope) -> u8 {
    scope.0[0]
}

impl World {
    fn write(
        &mut self,
        block: BlockId,
        slot_in_block: usize,
        (token, position, tenant): (u32, usize, u8),
    ) -> Result<(), TestCaseError> {
        prop_assert_eq!(
            self.m.refcount(block),
            1,
            "a write to block {} that another reader holds",
            block
        );
        let c = self
            .content
            .entry(block)
            .or_insert_with(|| vec![None; self.bs]);
        c[slot_in_block] = Some((token, position, tenant));
        Ok(())
    }

    fn check_content(
        &self,
        block: BlockId,
        tokens: &[u32],
        first_position: usize,
        tenant: u8,
    ) -> Result<(), TestCaseError> {
        let c = self.content.get(&block).cloned().unwrap_or_default();
        for (i, &t) in tokens.iter().enumerate() {
            prop_assert_eq!(
                c.get(i).copied().flatten(),
                Some((t, first_position + i, tenant)),
                "block {} slot {}",
                block,
                i
            );
        }
        Ok(())
    }

    fn start(
        &mut self,
        tenant: u8,
        tokens: Vec<u32>,
        approx_ok: bool,
        approximate_from: Option<usize>,
    ) -> Result<(), TestCaseError> {
        let bs = self.bs;
        if tokens.is_empty() {
            return Ok(());
        }
        // The last token is always computed: look up all but it.
        let m = self
            .m
            .lookup(scope(tenant), &tokens[..tokens.len() - 1], approx_ok);
        let mut table: Vec<BlockId> = m.blocks.clone();
        for (i, &b) in m.blocks.iter().enumerate() {
            self.check_content(b, &tokens[i * bs..(i + 1) * bs], i * bs, tenant)?;
        }
        self.m.retain(&table);
        let mut computed = m.blocks.len() * bs;
        let node = m.nodes.last().copied().unwrap_or(ROOT);
        let needed = (tokens.len() + 1).div_ceil(bs) - table.len();
        let Some(fresh) = self.m.allocate(needed, &mut |_: &Removed| {}) else {
            self.m.release(&table);
            return Ok(());
        };
        table.extend(&fresh);
        self.handed_out.extend(&fresh);
        if let Some((_, block, used)) = m.partial {
            // Copy-on-write of a block matched in part: its first `used` slots into our own.
            let src = self.content.get(&block).cloned().unwrap_or_default();
            self.check_content(block, &tokens[computed..computed + used], computed, tenant)?;
            let dst = table[computed / bs];
            for (i, v) in src.into_iter().take(used).enumerate() {
                self.write(dst, i, v.expect("matched slots hold K/V"))?;
            }
            computed += used;
        }
        let exact_until = if m.exact_blocks == m.blocks.len()
            && !(m.partial.is_some() && m.partial_approximate)
        {
            usize::MAX
        } else {
            m.exact_blocks * bs
        };
        self.history.push(tokens.clone());
        self.seqs.push(Some(Seq {
            tenant,
            tokens,
            table,
            computed,
            cursor: IndexCursor {
                scope: scope(tenant),
                node,
                indexed: m.blocks.len(),
            },
            approximate_from: approximate_from
                .map_or(usize::MAX, |a| a.max(computed))
                .min(exact_until),
        }));
        Ok(())
    }

    /// Indexes the seq's full computed blocks (and, `finish`ing, the partial last one).
    fn index(&mut self, i: usize, finish: bool) -> Result<(), TestCaseError> {
        let bs = self.bs;
        let Some(mut s) = self.seqs.get_mut(i).and_then(Option::take) else {
            return Ok(());
        };
        let limit = s.computed.min(s.tokens.len());
        // Every block about to be indexed holds its tokens' K/V.
        for b in s.cursor.indexed..limit.div_ceil(bs).min(s.table.len()) {
            self.check_content(
                s.table[b],
                &s.tokens[b * bs..((b + 1) * bs).min(limit)],
                b * bs,
                s.tenant,
            )?;
        }
        self.m.index_sequence(
            &mut s.cursor,
            &s.tokens,
            &mut s.table,
            limit,
            s.approximate_from,
            finish,
        );
        // A table entry switched to the tree's copy holds the same tokens' K/V, the tenant's own.
        for b in 0..limit.div_ceil(bs).min(s.table.len()) {
            self.check_content(
                s.table[b],
                &s.tokens[b * bs..((b + 1) * bs).min(limit)],
                b * bs,
                s.tenant,
            )?;
        }
        self.seqs[i] = Some(s);
        Ok(())
    }

    fn advance(&mut self, i: usize, n: usize) -> Result<(), TestCaseError> {
        let bs = self.bs;
        let Some(mut s) = self.seqs.get_mut(i).and_then(Option::take) else {
            return Ok(());
        };
        for _ in 0..n {
            if s.computed >= s.tokens.len() {
                // Decoding: a new token.
                let t = (s.tokens.len() as u32 * 5 + 1) % 6;
                s.tokens.push(t);
            }
            let slot = s.computed;
            if slot / bs >= s.table.len() {
                match self.m.allocate(1, &mut |_: &Removed| {}) {
                    Some(b) => {
                        self.handed_out.extend(&b);
                        s.table.extend(b)
                    }
                    None => break,
                }
            }
            let block = s.table[slot / bs];
            let written = (s.tokens[slot], slot, s.tenant);
            self.seqs[i] = Some(s);
            self.write(block, slot % bs, written)?;
            s = self.seqs[i].take().expect("put back above");
            s.computed += 1;
        }
        self.seqs[i] = Some(s);
        self.index(i, false)
    }

    fn end(&mut self, i: usize, finish: bool) -> Result<(), TestCaseError> {
        if self.seqs.get(i).is_none_or(|s| s.is_none()) {
            return Ok(());
        }
        if finish {
            self.index(i, true)?;
        }
        let s = self.seqs[i].take().expect("checked above");
        self.m.release(&s.table);
        Ok(())
    }

    fn check(&mut self, max_blocks: usize) -> Result<(), TestCaseError> {
        let a = self.m.allocator();
        prop_assert!(a.capacity() <= max_blocks, "the pool grew past its budget");
        prop_assert!(a.used() <= max_blocks);
        // Counts: table occurrences plus the tree's one.
        let mut expected: HashMap<BlockId, u32> = HashMap::new();
        for s in self.seqs.iter().flatten() {
            for &b in &s.table {
                *expected.entry(b).or_default() += 1;
            }
        }
        let entries = self.m.tree().entries();
        for (_, b, _, _) in &entries {
            *expected.entry(*b).or_default() += 1;
            prop_assert!(a.is_in_tree(*b));
        }
        for b in 0..a.capacity() as BlockId {
            prop_assert_eq!(
                a.refcount(b),
                expected.get(&b).copied().unwrap_or(0),
                "count of block {}",
                b
            );
        }
        let in_use = expected.values().filter(|&&c| c > 0).count();
        prop_assert_eq!(a.used(), in_use);
        // Blocks reported never used (the scheduler overwrites them to back them with memory)
        // were never handed out, and are the last ones the pool created.
        let never = a.never_used();
        prop_assert_eq!(never.end as usize, a.capacity());
        for b in never {
            prop_assert!(!self.handed_out.contains(&b), "block {} was handed out", b);
            prop_assert_eq!(a.refcount(b), 0);
        }
        // Every node's block holds its tokens, written by its scope's tenant.
        for (scope, b, path, _) in &entries {
            let start = (path.len() - 1) / self.bs * self.bs;
            self.check_content(*b, &path[start..], start, tenant_of(*scope))?;
        }
        // A block a running sequence will write is its alone.
        for s in self.seqs.iter().flatten() {
            for &b in &s.table[(s.computed / self.bs).min(s.table.len())..] {
                prop_assert_eq!(a.refcount(b), 1, "a block still to be written is shared");
            }
        }
        Ok(())
    }

    /// The tree's answer equals the longest prefix found by brute force over its entries in the
    /// tenant's scope.
    fn check_lookup(
        &mut self,
        tenant: u8,
        probe: &[u32],
        approx_ok: bool,
    ) -> Result<(), TestCaseError> {
        let bs = self.bs;
        let entries: Vec<_> = self
            .m
            .tree()
            .entries()
            .into_iter()
            .filter(|e| e.0 == scope(tenant))
            .map(|(_, b, p, a)| (b, p, a))
            .collect();
        let allowed = |approx: bool| approx_ok || !approx;
        let mut k = 0;
        while (k + 1) * bs <= probe.len()
            && entries
                .iter()
                .any(|(_, p, a)| allowed(*a) && p.as_slice() == &probe[..(k + 1) * bs])
        {
            k += 1;
        }
        let rest = &probe[k * bs..];
        let partial = entries
            .iter()
            .filter(|(_, p, a)| {
                allowed(*a)
                    && p.len() > k * bs
                    && p.len() <= (k + 1) * bs
                    && p[..k * bs] == probe[..k * bs]
            })
            .map(|(_, p, _)| {
                p[k * bs..]
                    .iter()
                    .zip(rest)
                    .take_while(|(x, y)| x == y)
                    .count()
            })
            .filter(|&c| c > 0 && !(c == bs && rest.len() >= bs))
            .max();
        let m = self.m.lookup(scope(tenant), probe, approx_ok);
        prop_assert_eq!(m.blocks.len(), k, "full blocks matched");
        prop_assert_eq!(m.partial.map(|p| p.2), partial, "partial match");
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn the_block_manager_keeps_every_promise(
        bs in prop::sample::select(vec![1usize, 2, 4]),
        max_blocks in 4usize..40,
        ops in prop::collection::vec(op(), 1..60),
        probes in prop::collection::vec((0u8..3, prop::collection::vec(0u32..6, 0..30), any::<bool>()), 1..4),
    ) {
        let mut w = World { m: BlockManager::new(bs, max_blocks), bs, content: HashMap::new(), seqs: Vec::new(), history: Vec::new(), handed_out: Default::default() };
        for op in ops {
            match op {
                Op::Start { tenant, from, keep, fresh, seed, approx_ok, approximate_from } => {
                    let mut tokens = w.history.get(from).map(|h| h[..keep.min(h.len())].to_vec()).unwrap_or_default();
                    tokens.extend(fresh_tokens(seed, fresh, w.history.len()));
                    w.start(tenant, tokens, approx_ok, approximate_from)?;
                }
                Op::Advance { seq, n } => w.advance(seq, n)?,
                Op::Finish { seq } => w.end(seq, true)?,
                Op::Cancel { seq } => w.end(seq, false)?,
                Op::Evict { n } => {
                    let before = w.m.allocator().used();
                    let mut seen = Vec::new();
                    let evicted = w.m.evict(n, &mut |r: &Removed| seen.push(r.block));
                    prop_assert_eq!(evicted, seen.len());
                    prop_assert_eq!(w.m.allocator().used(), before - evicted, "an evicted block was still read");
                }
                Op::Clear => w.m.clear(&mut |_: &Removed| {}),
            }
            w.check(max_blocks)?;
            for (tenant, probe, approx_ok) in &probes {
                w.check_lookup(*tenant, probe, *approx_ok)?;
            }
        }
        // Everything ends: every block comes back.
        for i in 0..w.seqs.len() {
            w.end(i, i % 2 == 0)?;
        }
        w.check(max_blocks)?;
        w.m.clear(&mut |_: &Removed| {});
        prop_assert_eq!(w.m.allocator().used(), 0, "references leaked");
        prop_assert_eq!(w.m.allocator().tree_only(), 0);
        prop_assert!(w.m.tree().is_empty());
    }
}

#[test]
fn allocation_beyond_the_budget_fails_without_side_effects() {
    let mut m = BlockManager::new(4, 3);
    let held = m.allocate(3, &mut |_: &Removed| {}).unwrap();
    assert!(m.allocate(1, &mut |_: &Removed| {}).is_none());
    m.release(&held);
    assert_eq!(m.allocator().used(), 0);
    // Tree blocks nobody else reads are evicted for room, least recently used first, and seen.
    let a = m.allocate(1, &mut |_: &Removed| {}).unwrap()[0];
    let b = m.allocate(1, &mut |_: &Removed| {}).unwrap()[0];
    let na = match m.insert(Scope::SHARED, ROOT, &[1, 2, 3, 4], a, false) {
        Insertion::Added(n) => n,
        other => panic!("{other:?}"),
    };
    m.insert(Scope::SHARED, ROOT, &[5, 6, 7, 8], b, false);
    m.release(&[a, b]);
    m.lookup(Scope::SHARED, &[5, 6, 7, 8, 9], false); // b used last
    let mut seen = Vec::new();
    let got = m
        .allocate(2, &mut |r: &Removed| {
            seen.push((r.block, r.path_tokens.clone()))
        })
        .unwrap();
    assert_eq!(
        seen,
        vec![(a, vec![1, 2, 3, 4])],
        "the least recently used leaf goes first"
    );
    assert_eq!(got.len(), 2);
    assert!(!m.tree().contains(na));
}
