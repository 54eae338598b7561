//! The promises of kvb-hash as properties.

use kvb_hash::{Key, Namespace};
use proptest::prelude::*;

fn ns(model: &[u8], bits: u8) -> Namespace {
    Namespace::builder()
        .model_fingerprint(model)
        .dtype("f32")
        .chunking("fixed:128:32")
        .kv_bits(bits)
        .build()
}

fn tokens() -> impl Strategy<Value = Vec<u32>> {
    proptest::collection::vec(any::<u32>(), 1..64)
}

proptest! {
    #[test]
    fn keys_are_deterministic(t in tokens()) {
        prop_assert_eq!(ns(b"m", 16).content_key(&t), ns(b"m", 16).content_key(&t));
        let n = ns(b"m", 16);
        prop_assert_eq!(n.prefix_key(&n.root(), &t), n.prefix_key(&n.root(), &t));
    }

    #[test]
    fn changing_any_token_changes_both_keys(t in tokens(), at in any::<usize>(), delta in 1u32..) {
        let n = ns(b"m", 16);
        let mut u = t.clone();
        let i = at % u.len();
        u[i] = u[i].wrapping_add(delta);
        prop_assert_ne!(n.content_key(&t), n.content_key(&u));
        prop_assert_ne!(n.prefix_key(&n.root(), &t), n.prefix_key(&n.root(), &u));
    }

    #[test]
    fn reordering_tokens_changes_the_key(t in proptest::collection::vec(any::<u32>(), 2..64), a in any::<usize>(), b in any::<usize>()) {
        let n = ns(b"m", 16);
        let (i, j) = (a % t.len(), b % t.len());
        prop_assume!(t[i] != t[j]);
        let mut u = t.clone();
        u.swap(i, j);
        prop_assert_ne!(n.content_key(&t), n.content_key(&u));
    }

    #[test]
    fn moving_a_chunk_boundary_changes_the_prefix_keys(t in proptest::collection::vec(any::<u32>(), 3..64), a in any::<usize>(), b in any::<usize>()) {
        let n = ns(b"m", 16);
        let (c1, c2) = (1 + a % (t.len() - 1), 1 + b % (t.len() - 1));
        prop_assume!(c1 != c2);
        let first = n.chain([&t[..c1], &t[c1..]]);
        let second = n.chain([&t[..c2], &t[c2..]]);
        prop_assert_ne!(first[1], second[1], "same tokens cut differently must not share a key");
        prop_assert_ne!(first[0], second[0]);
    }

    #[test]
    fn a_scope_changes_every_key_and_only_its_own_scope_shares_them(
        t in tokens(),
        a in proptest::collection::vec(any::<u8>(), 0..16),
        b in proptest::collection::vec(any::<u8>(), 0..16),
    ) {
        let n = ns(b"m", 16);
        let (sa, sb) = (n.scoped(&a), n.scoped(&b));
        // The same scope gives the same keys: a tenant's requests share their cache.
        prop_assert_eq!(sa, n.scoped(&a));
        prop_assert_eq!(sa.content_key(&t), n.scoped(&a).content_key(&t));
        // Scoped keys differ from the shared namespace's, even for an empty scope.
        prop_assert_ne!(sa.content_key(&t), n.content_key(&t));
        prop_assert_ne!(sa.prefix_key(&sa.root(), &t), n.prefix_key(&n.root(), &t));
        prop_assert_eq!(Namespace::from_id(sa.id()), sa);
        if a != b {
            prop_assert_ne!(sa.root(), sb.root());
            prop_assert_ne!(sa.content_key(&t), sb.content_key(&t));
            prop_assert_ne!(sa.prefix_key(&sa.root(), &t), sb.prefix_key(&sb.root(), &t));
        }
    }

    #[test]
    fn any_namespace_field_changes_every_key(t in tokens()) {
        let base = ns(b"model-a", 16);
        let others = [
            ns(b"model-b", 16),
            ns(b"model-a", 8),
            Namespace::builder().model_fingerprint(b"model-a").dtype("f16").chunking("fixed:128:32").kv_bits(16).build(),
            Namespace::builder().model_fingerprint(b"model-a").dtype("f32").chunking("fixed:64:32").kv_bits(16).build(),
        ];
        for other in others {
            prop_assert_ne!(base.id(), other.id());
            prop_assert_ne!(base.content_key(&t), other.content_key(&t));
            prop_assert_ne!(base.prefix_key(&base.root(), &t), other.prefix_key(&other.root(), &t));
        }
    }

    #[test]
    fn prompts_sharing_k_chunks_share_k_prefix_keys(
        shared in proptest::collection::vec(tokens(), 1..5),
        tail_a in tokens(),
        tail_b in tokens(),
    ) {
        prop_assume!(tail_a != tail_b);
        let n = ns(b"m", 16);
        let a: Vec<&[u32]> = shared.iter().map(Vec::as_slice).chain([tail_a.as_slice()]).collect();
        let b: Vec<&[u32]> = shared.iter().map(Vec::as_slice).chain([tail_b.as_slice()]).collect();
        let (ka, kb) = (n.chain(a), n.chain(b));
        let k = shared.len();
        prop_assert_eq!(&ka[..k], &kb[..k]);
        prop_assert_ne!(ka[k], kb[k]);
    }

    #[test]
    fn hex_round_trips(bytes in any::<[u8; 32]>()) {
        let k = Key(bytes);
        prop_assert_eq!(Key::from_hex(&k.hex()), Some(k));
        prop_assert_eq!(k.short().len(), 16);
    }
}

#[test]
fn prefix_and_content_keys_of_the_same_tokens_differ() {
    let n = ns(b"m", 16);
    assert_ne!(
        n.prefix_key(&n.root(), &[1, 2, 3]).0,
        n.content_key(&[1, 2, 3]).0
    );
}
