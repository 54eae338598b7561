//! The chunk codec round-trips every format and refuses corrupt bytes without panicking; merging
//! and slicing K/V along the token axis are inverse operations.

mod common;

use common::{chunk_after, ns};
use kvb_quant::{Bits, QuantConfig};
use kvb_store::codec::{decode, encode};
use kvb_store::kv_ops::{merge_kv, slice_chunk, slice_kv};
use kvb_store::{KvChunk, KvFormat, LayerKv};
use proptest::prelude::*;

fn encoded(chunk: &KvChunk, format: KvFormat) -> KvChunk {
    let shape = chunk.block_shape();
    KvChunk {
        layers: chunk
            .layers
            .iter()
            .map(|l| LayerKv {
                k: format.encode(l.k.to_f32(), shape, true).unwrap(),
                v: format.encode(l.v.to_f32(), shape, false).unwrap(),
            })
            .collect(),
        ..chunk.clone()
    }
}

fn formats() -> Vec<KvFormat> {
    vec![
        KvFormat::F32,
        KvFormat::F16,
        KvFormat::Bf16,
        KvFormat::Kivi(QuantConfig {
            bits: Bits::Eight,
            group_size: 32,
        }),
        KvFormat::Kivi(QuantConfig {
            bits: Bits::Two,
            group_size: 3,
        }),
    ]
}

proptest! {
    #[test]
    fn every_format_round_trips_through_the_codec(tokens in proptest::collection::vec(0u32..1000, 1..40)) {
        let n = ns();
        let base = chunk_after(&n, n.root(), &tokens, 7);
        for f in formats() {
            let c = encoded(&base, f);
            prop_assert_eq!(decode(&encode(&c)).unwrap(), c);
        }
    }

    #[test]
    fn corrupt_encodings_are_errors_not_panics(tokens in proptest::collection::vec(0u32..1000, 1..20), cut in any::<prop::sample::Index>(), flip in any::<prop::sample::Index>(), x in 1u8..) {
        let n = ns();
        let c = encoded(&chunk_after(&n, n.root(), &tokens, 0), KvFormat::Kivi(QuantConfig::default()));
        let bytes = encode(&c);
        prop_assert!(decode(&bytes[..cut.index(bytes.len())]).is_err());
        let mut bad = bytes.clone();
        bad[flip.index(bytes.len())] ^= x;
        if let Ok(d) = decode(&bad) {
            // A flip inside a value can still decode; it must then be a well-formed chunk.
            prop_assert!(d.check().is_ok());
        }
    }

    #[test]
    fn merging_slices_gives_back_the_chunk(tokens in proptest::collection::vec(0u32..1000, 2..40), at in any::<prop::sample::Index>()) {
        let n = ns();
        let c = chunk_after(&n, n.root(), &tokens, 0);
        let cut = 1 + at.index(tokens.len() - 1);
        let (a, b) = (slice_chunk(&c, 0, cut).unwrap(), slice_chunk(&c, cut, tokens.len()).unwrap());
        prop_assert_eq!(merge_kv(&[&a, &b]), slice_kv(&c, 0, tokens.len()).unwrap());
        prop_assert!(slice_kv(&c, cut, tokens.len() + 1).is_none());
    }
}

#[test]
fn kivi_chunks_are_smaller_and_accounted_exactly() {
    let n = ns();
    let c = chunk_after(&n, n.root(), &(0..128).collect::<Vec<_>>(), 0);
    let kv_bytes =
        |c: &KvChunk| -> usize { c.layers.iter().map(|l| l.k.bytes() + l.v.bytes()).sum() };
    let q = encoded(
        &c,
        KvFormat::Kivi(QuantConfig {
            bits: Bits::Four,
            group_size: 32,
        }),
    );
    // Per layer: K = 512 4-bit codes (256 B) + 16 channel groups x 4 B; V = 256 B + 128 token
    // groups (a 4-wide head is one group per token) x 4 B.
    assert_eq!(kv_bytes(&q), 2 * ((256 + 16 * 4) + (256 + 128 * 4)));
    assert!(kv_bytes(&q) * 3 < kv_bytes(&c));
    assert_eq!(q.bytes(), kv_bytes(&q) + 8 * 128 + 96);
}
