//! The K/V seam's promises, as properties over layouts: a run stored from a runtime's cache and
//! written back (into a cache of either order) gives the same values; a moved chunk's keys,
//! re-rotated on the host, equal the keys computed at the new positions within rounding.

use half::{bf16, f16};
use kvb_hash::Namespace;
use kvb_store::seam::rope::{rerotate_chunk, rerotate_keys, RopePairs, RopeScaling, RopeSpec};
use kvb_store::seam::{
    chunk_from_runtime, write_chunk_into, ChunkKeys, KvDtype, KvLayout, KvOrder, KvPart, RuntimeKv,
    SeamError,
};
use kvb_store::{ChunkStore, KvData, KvFormat, StoreConfig};
use proptest::prelude::*;
use std::ops::Range;

/// A runtime's cache: per layer, K and V of `slots` tokens in its layout, as bytes.
struct Cache {
    layout: KvLayout,
    slots: usize,
    data: Vec<[Vec<u8>; 2]>,
}

impl Cache {
    fn new(layout: KvLayout, slots: usize) -> Cache {
        let bytes = layout.run_bytes(slots);
        Cache {
            layout,
            slots,
            data: (0..layout.layers)
                .map(|_| [vec![0; bytes], vec![0; bytes]])
                .collect(),
        }
    }

    /// Byte offset of (head, slot) in one layer's K or V.
    fn at(&self, h: usize, t: usize) -> usize {
        let l = &self.layout;
        let row = match l.order {
            KvOrder::TokenMajor => t * l.kv_heads + h,
            KvOrder::HeadMajor => h * self.slots + t,
        };
        row * l.head_dim * l.dtype.bytes()
    }

    /// The value at (layer, part, head, slot, element) as f32.
    fn value(&self, layer: usize, part: usize, h: usize, t: usize, e: usize) -> f32 {
        let w = self.layout.dtype.bytes();
        let b = &self.data[layer][part][self.at(h, t) + e * w..][..w];
        match self.layout.dtype {
            KvDtype::F32 => f32::from_le_bytes(b.try_into().unwrap()),
            KvDtype::F16 => f16::from_le_bytes([b[0], b[1]]).to_f32(),
            KvDtype::Bf16 => bf16::from_le_bytes([b[0], b[1]]).to_f32(),
        }
    }

    fn set(&mut self, layer: usize, part: usize, h: usize, t: usize, e: usize, x: f32) {
        let w = self.layout.dtype.bytes();
        let at = self.at(h, t) + e * w;
        let bytes = match self.layout.dtype {
            KvDtype::F32 => x.to_le_bytes().to_vec(),
            KvDtype::F16 => f16::from_f32(x).to_le_bytes().to_vec(),
            KvDtype::Bf16 => bf16::from_f32(x).to_le_bytes().to_vec(),
        };
        self.data[layer][part][at..at + w].copy_from_slice(&bytes);
    }

    fn check(&self, layer: usize, tokens: &Range<usize>) -> Result<(), SeamError> {
        if layer >= self.layout.layers || tokens.end > self.slots {
            return Err(SeamError::Runtime(format!(
                "layer {layer}, slots {tokens:?}"
            )));
        }
        Ok(())
    }
}

impl RuntimeKv for Cache {
    fn layout(&self) -> KvLayout {
        self.layout
    }

    fn read(&self, layer: usize, part: KvPart, tokens: Range<usize>) -> Result<Vec<u8>, SeamError> {
        self.check(layer, &tokens)?;
        let (l, p) = (&self.layout, part as usize);
        let row = l.head_dim * l.dtype.bytes();
        let mut out = Vec::new();
        match l.order {
            KvOrder::TokenMajor => out.extend_from_slice(
                &self.data[layer][p][self.at(0, tokens.start)..self.at(0, tokens.end)],
            ),
            KvOrder::HeadMajor => {
                for h in 0..l.kv_heads {
                    let at = self.at(h, tokens.start);
                    out.extend_from_slice(&self.data[layer][p][at..at + tokens.len() * row]);
                }
            }
        }
        Ok(out)
    }

    fn write(
        &mut self,
        layer: usize,
        part: KvPart,
        at: usize,
        bytes: &[u8],
    ) -> Result<(), SeamError> {
        let n = bytes.len() / self.layout.run_bytes(1);
        self.check(layer, &(at..at + n))?;
        let (row, heads, p) = (
            self.layout.head_dim * self.layout.dtype.bytes(),
            self.layout.kv_heads,
            part as usize,
        );
        for (i, chunk) in bytes.chunks_exact(row).enumerate() {
            let (h, t) = match self.layout.order {
                KvOrder::TokenMajor => (i % heads, i / heads),
                KvOrder::HeadMajor => (i / n, i % n),
            };
            let to = self.at(h, at + t);
            self.data[layer][p][to..to + row].copy_from_slice(chunk);
        }
        Ok(())
    }
}

fn layout() -> impl Strategy<Value = KvLayout> {
    (
        1usize..4,
        1usize..5,
        prop_oneof![Just(2usize), Just(4), Just(8), Just(64)],
        prop_oneof![Just(KvOrder::TokenMajor), Just(KvOrder::HeadMajor)],
        prop_oneof![Just(KvDtype::F32), Just(KvDtype::F16), Just(KvDtype::Bf16)],
    )
        .prop_map(|(layers, kv_heads, head_dim, order, dtype)| KvLayout {
            layers,
            kv_heads,
            head_dim,
            order,
            dtype,
        })
}

fn other(order: KvOrder) -> KvOrder {
    match order {
        KvOrder::TokenMajor => KvOrder::HeadMajor,
        KvOrder::HeadMajor => KvOrder::TokenMajor,
    }
}

fn keys(tokens: &[u32]) -> ChunkKeys {
    let ns = Namespace::builder().model_fingerprint(b"seam").build();
    ChunkKeys {
        prefix_key: ns.prefix_key(&ns.root(), tokens),
        content_key: ns.content_key(tokens),
        parent: ns.root(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A run stored in the store's layout (as f32, or in the cache's own 16-bit type) and written
    /// back into a cache of the same or the other order, at another slot, gives the same values.
    #[test]
    fn stored_runs_come_back_as_they_were(
        layout in layout(), slots in 4usize..24, start in 0usize..4, len in 1usize..8,
        to in 0usize..8, same_order in any::<bool>(), as_f32 in any::<bool>(), seed in any::<u32>(),
    ) {
        let (start, len) = (start.min(slots - 1), len.min(slots - start.min(slots - 1)));
        let mut cache = Cache::new(layout, slots);
        let value = |i: usize| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 20001) as f32 / 97.0 - 100.0;
        let mut i = 0;
        for layer in 0..layout.layers {
            for part in 0..2 {
                for h in 0..layout.kv_heads {
                    for t in 0..slots {
                        for e in 0..layout.head_dim {
                            cache.set(layer, part, h, t, e, value(i));
                            i += 1;
                        }
                    }
                }
            }
        }
        let tokens: Vec<u32> = (0..len as u32).map(|t| t + 100).collect();
        let positions: Vec<u32> = (start as u32..(start + len) as u32).collect();
        let format = match (as_f32, layout.dtype) {
            (true, _) | (_, KvDtype::F32) => KvFormat::F32,
            (_, KvDtype::F16) => KvFormat::F16,
            (_, KvDtype::Bf16) => KvFormat::Bf16,
        };
        let chunk = chunk_from_runtime(&cache, start..start + len, &tokens, &positions, keys(&tokens), format).unwrap();
        prop_assert!(chunk.check().is_ok());
        let target_layout = KvLayout { order: if same_order { layout.order } else { other(layout.order) }, ..layout };
        let mut target = Cache::new(target_layout, to + len);
        write_chunk_into(&chunk, 0..len, &mut target, to).unwrap();
        for layer in 0..layout.layers {
            for part in 0..2 {
                for h in 0..layout.kv_heads {
                    for t in 0..len {
                        for e in 0..layout.head_dim {
                            let (want, got) = (cache.value(layer, part, h, start + t, e), target.value(layer, part, h, to + t, e));
                            prop_assert_eq!(want.to_bits(), got.to_bits(), "layer {} part {} head {} token {} element {}", layer, part, h, t, e);
                        }
                    }
                }
            }
        }
    }

    /// A key rotated at `from` and turned to `to` on the host equals the key rotated at `to`,
    /// within a few f32 roundings of the head's size.
    #[test]
    fn moved_keys_equal_keys_at_the_new_positions(
        head_dim in prop_oneof![Just(2usize), Just(64), Just(128)],
        theta in prop_oneof![Just(10000f32), Just(500000f32)],
        scaling in 0usize..3, interleaved in any::<bool>(),
        heads in 1usize..4, moves in prop::collection::vec((0u32..8192, 0u32..8192), 1..6),
        seed in any::<u32>(),
    ) {
        let spec = RopeSpec {
            head_dim,
            theta,
            scaling: match scaling {
                0 => RopeScaling::None,
                1 => RopeScaling::Linear { factor: 4.0 },
                _ => RopeScaling::Llama3 { factor: 32.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: 8192.0 },
            },
            pairs: if interleaved { RopePairs::Interleaved } else { RopePairs::HalfSplit },
        };
        let inv = spec.inv_freq();
        let (from, to): (Vec<u32>, Vec<u32>) = moves.iter().copied().unzip();
        let tokens = from.len();
        let raw: Vec<f32> = (0..heads * tokens * head_dim)
            .map(|i| ((i as u32).wrapping_mul(2246822519).wrapping_add(seed) % 2001) as f32 / 400.0 - 2.5)
            .collect();
        let at = |positions: &[u32]| {
            let mut k = raw.clone();
            for (n, head) in k.chunks_exact_mut(head_dim).enumerate() {
                spec.apply(head, positions[n % tokens], &inv);
            }
            k
        };
        let mut moved = at(&from);
        rerotate_keys(&mut moved, heads, &spec, &from, &to).unwrap();
        let want = at(&to);
        for (n, (m, w)) in moved.chunks_exact(head_dim).zip(want.chunks_exact(head_dim)).enumerate() {
            let norm = w.iter().map(|x| x * x).sum::<f32>().sqrt();
            for (a, b) in m.iter().zip(w) {
                prop_assert!((a - b).abs() <= 4.0 * f32::EPSILON * norm, "head-token {}: {} vs {}", n, a, b);
            }
        }
    }
}

/// Through a real store: a chunk taken from one cache is found by its prefix, then by its content
/// after a move, re-rotated, and written into another cache; f16 keys stay f16.
#[test]
fn a_moved_chunk_reaches_another_cache_through_the_store() {
    let layout = KvLayout {
        layers: 2,
        kv_heads: 2,
        head_dim: 4,
        order: KvOrder::TokenMajor,
        dtype: KvDtype::F16,
    };
    let mut cache = Cache::new(layout, 6);
    for layer in 0..2 {
        for part in 0..2 {
            for h in 0..2 {
                for t in 0..6 {
                    for e in 0..4 {
                        cache.set(
                            layer,
                            part,
                            h,
                            t,
                            e,
                            (layer * 100 + part * 50 + h * 10 + t) as f32 + e as f32 / 8.0,
                        );
                    }
                }
            }
        }
    }
    let tokens = [7u32, 8, 9, 10];
    let chunk = chunk_from_runtime(
        &cache,
        2..6,
        &tokens,
        &[2, 3, 4, 5],
        keys(&tokens),
        KvFormat::F16,
    )
    .unwrap();
    let store = ChunkStore::new(StoreConfig::ram(1 << 20)).unwrap();
    let ns = Namespace::builder().model_fingerprint(b"seam").build();
    store.insert(chunk).unwrap();
    let hit = store
        .longest_prefix(ns.root(), &[7, 8, 9, 10, 11])
        .unwrap()
        .unwrap();
    assert_eq!(hit.matched_tokens, 4);
    let found = store
        .get_by_content(&ns.content_key(&tokens))
        .unwrap()
        .unwrap();
    let mut moved = (*found.chunk).clone();
    let spec = RopeSpec {
        head_dim: 4,
        theta: 10000.0,
        scaling: RopeScaling::None,
        pairs: RopePairs::HalfSplit,
    };
    rerotate_chunk(&mut moved, &spec, &[40, 41, 42, 43]).unwrap();
    assert!(matches!(moved.layers[0].k, KvData::F16(_)));
    assert_eq!(moved.positions, vec![40, 41, 42, 43]);
    // Turning it back restores the keys within f16 rounding; values are untouched.
    let mut back = moved.clone();
    rerotate_chunk(&mut back, &spec, &[2, 3, 4, 5]).unwrap();
    for (a, b) in back.layers[1]
        .k
        .to_f32()
        .iter()
        .zip(found.chunk.layers[1].k.to_f32())
    {
        assert!((a - b).abs() <= 2e-3 * b.abs().max(1.0), "{a} vs {b}");
    }
    assert_eq!(moved.layers[1].v, found.chunk.layers[1].v);
    let mut other = Cache::new(
        KvLayout {
            order: KvOrder::HeadMajor,
            ..layout
        },
        50,
    );
    write_chunk_into(&moved, 1..4, &mut other, 41).unwrap();
    assert_eq!(other.value(1, 1, 1, 41, 3), cache.value(1, 1, 1, 3, 3));
    // A chunk that does not fit the cache is an error naming both shapes.
    let mut narrow = Cache::new(
        KvLayout {
            kv_heads: 1,
            ..layout
        },
        50,
    );
    let err = write_chunk_into(&moved, 0..4, &mut narrow, 0)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("2 K/V heads") && err.contains("1 x 4"),
        "{err}"
    );
}

/// The two pairings rotate the dimensions their names say, by `position * inv_freq`:
/// `theta^(-2i/d)`, divided by a linear factor.
#[test]
fn rope_pairs_and_frequencies_are_the_models() {
    let spec = |pairs, scaling| RopeSpec {
        head_dim: 4,
        theta: 10000.0,
        scaling,
        pairs,
    };
    let half = spec(RopePairs::HalfSplit, RopeScaling::None);
    assert_eq!(half.inv_freq(), vec![1.0, 0.01]);
    let linear = spec(RopePairs::HalfSplit, RopeScaling::Linear { factor: 4.0 });
    assert_eq!(linear.inv_freq(), vec![0.25, 0.0025]);
    let (s, c) = 1f64.sin_cos();
    let (s, c) = (s as f32, c as f32);
    let mut x = [1.0, 0.0, 0.0, 0.0];
    half.apply(&mut x, 1, &half.inv_freq());
    assert_eq!(x, [c, 0.0, s, 0.0]);
    let inter = spec(RopePairs::Interleaved, RopeScaling::None);
    let mut x = [1.0, 0.0, 0.0, 0.0];
    inter.apply(&mut x, 1, &inter.inv_freq());
    assert_eq!(x, [c, s, 0.0, 0.0]);
}

/// Llama 3.2's scaled frequencies (theta 500000, head 64, factor 32, low 1, high 4, context
/// 8192) equal those of transformers' formula, evaluated in f64 apart from this code: pairs kept
/// (0, 14), blended (15, 16, 17) and divided (20, 31).
#[test]
fn llama3_frequencies_are_transformers() {
    let spec = RopeSpec {
        head_dim: 64,
        theta: 500000.0,
        scaling: RopeScaling::Llama3 {
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192.0,
        },
        pairs: RopePairs::HalfSplit,
    };
    let inv = spec.inv_freq();
    let want = [
        (0, 1.0),
        (14, 0.0032114459947525913),
        (15, 0.001290547928209264),
        (16, 0.00042955679655936815),
        (17, 9.70828780262767e-05),
        (20, 8.570255489881478e-06),
        (31, 9.418306725434909e-08),
    ];
    for (i, w) in want {
        let got = inv[i] as f64;
        assert!((got - w).abs() <= 2e-6 * w, "pair {i}: {got} vs {w}");
    }
}

/// Inputs that do not fit are errors that name the problem, and leave the chunk as it was.
#[test]
fn misfits_are_errors() {
    let layout = KvLayout {
        layers: 2,
        kv_heads: 1,
        head_dim: 4,
        order: KvOrder::HeadMajor,
        dtype: KvDtype::F32,
    };
    let cache = Cache::new(layout, 8);
    let tokens = [1u32, 2, 3];
    let err = |r: Result<kvb_store::KvChunk, SeamError>| r.unwrap_err().to_string();
    let k = keys(&tokens);
    assert!(err(chunk_from_runtime(
        &cache,
        0..3,
        &tokens,
        &[0, 1],
        k,
        KvFormat::F32
    ))
    .contains("2 positions"));
    #[allow(clippy::reversed_empty_ranges)]
    let backwards = 3..0;
    assert!(err(chunk_from_runtime(
        &cache,
        backwards,
        &[],
        &[],
        k,
        KvFormat::F32
    ))
    .contains("backwards"));
    assert!(err(chunk_from_runtime(
        &cache,
        6..9,
        &tokens,
        &[0, 1, 2],
        k,
        KvFormat::F32
    ))
    .contains("runtime"));
    /// A runtime that hands back one value too few.
    struct Short(Cache);
    impl RuntimeKv for Short {
        fn layout(&self) -> KvLayout {
            self.0.layout()
        }
        fn read(&self, l: usize, p: KvPart, t: Range<usize>) -> Result<Vec<u8>, SeamError> {
            let mut b = self.0.read(l, p, t)?;
            b.truncate(b.len() - 4);
            Ok(b)
        }
        fn write(&mut self, l: usize, p: KvPart, at: usize, b: &[u8]) -> Result<(), SeamError> {
            self.0.write(l, p, at, b)
        }
    }
    let short = Short(Cache::new(layout, 8));
    assert!(err(chunk_from_runtime(
        &short,
        0..3,
        &tokens,
        &[0, 1, 2],
        k,
        KvFormat::F32
    ))
    .contains("gave 44 bytes"));
    let mut chunk =
        chunk_from_runtime(&cache, 0..3, &tokens, &[0, 1, 2], k, KvFormat::F32).unwrap();
    let before = chunk.clone();
    let spec = RopeSpec {
        head_dim: 4,
        theta: 10000.0,
        scaling: RopeScaling::None,
        pairs: RopePairs::HalfSplit,
    };
    assert!(rerotate_chunk(&mut chunk, &spec, &[5, 6])
        .unwrap_err()
        .to_string()
        .contains("2 new positions"));
    let factors = RopeSpec {
        scaling: RopeScaling::FreqFactors(vec![1.0]),
        ..spec.clone()
    };
    assert!(rerotate_chunk(&mut chunk, &factors, &[5, 6, 7])
        .unwrap_err()
        .to_string()
        .contains("1 frequency factors"));
    chunk.layers[1].k = KvData::F32(vec![0.0; 5]);
    let broken = chunk.clone();
    assert!(rerotate_chunk(&mut chunk, &spec, &[5, 6, 7]).is_err());
    assert_eq!(chunk, broken, "a failed move leaves the chunk as it was");
    let mut target = Cache::new(layout, 8);
    assert!(write_chunk_into(&before, 2..5, &mut target, 0)
        .unwrap_err()
        .to_string()
        .contains("tokens 2..5"));
}
