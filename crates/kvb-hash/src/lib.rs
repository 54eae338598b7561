//! # kvb-hash: keys for cached K/V chunks
//!
//! Every cached chunk gets two 32-byte blake3 keys:
//! - a **prefix key** = hash(parent prefix key, chunk tokens), chained from a root. It names the
//!   chunk *in its context*: equal prefix keys mean equal tokens from position 0 up to the chunk's
//!   end, cut at the same boundaries, so the K/V computed for one can be used for the other exactly.
//! - a **content key** = hash(namespace, chunk tokens). It names the tokens alone, for reusing a
//!   chunk found elsewhere in another prompt (approximately, with repair).
//!
//! Both are derived from a [`Namespace`]: the hash of the model's fingerprint (config and weights
//! identity), the K/V dtype, the chunking settings and the quantization bits. Two models, or two
//! settings, can never produce the same key.
//!
//! Promises (proved by `tests/key_properties.rs`):
//! - keys are deterministic;
//! - changing any token, the order of tokens, a chunk boundary, or any namespace field changes
//!   the key;
//! - prompts that share their first k chunks share their first k prefix keys.
//!
//! Token ids are hashed as fixed-width little-endian `u32`s, and every variable-length field is
//! length-prefixed, so no two different inputs can serialise to the same bytes.
//!
//! ```
//! use kvb_hash::Namespace;
//! let ns = Namespace::builder().model_fingerprint(b"smollm2-135m sha256:...").dtype("f32")
//!     .chunking("fixed:128:32").kv_bits(16).build();
//! let first = ns.prefix_key(&ns.root(), &[1, 2, 3]);
//! let second = ns.prefix_key(&first, &[4, 5]);
//! assert_ne!(first, second);
//! assert_eq!(ns.chain([&[1u32, 2, 3][..], &[4, 5][..]]), vec![first, second]);
//! println!("{}", second.short()); // 16 hex digits for logs
//! ```
#![warn(missing_docs)]

/// The README's example, run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

use std::fmt;

/// A 32-byte key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(pub [u8; 32]);

impl Key {
    /// The full 64-digit hex form.
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The first 8 bytes as 16 hex digits, for logs.
    pub fn short(&self) -> String {
        self.0[..8].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses the 64-digit hex form.
    pub fn from_hex(s: &str) -> Option<Key> {
        if s.len() != 64 || !s.is_ascii() {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Key(out))
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({})", self.short())
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.short())
    }
}

macro_rules! key_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub Key);

        impl $name {
            /// The key's bytes.
            pub fn bytes(&self) -> &[u8; 32] {
                &self.0 .0
            }
            /// 16 hex digits, for logs.
            pub fn short(&self) -> String {
                self.0.short()
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0.short())
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0.short())
            }
        }
    };
}

key_type!(
    /// Names a chunk in its context: its tokens and every token before it, cut at the same
    /// chunk boundaries, under one namespace.
    PrefixKey
);
key_type!(
    /// Names a chunk's tokens alone, under one namespace.
    ContentKey
);

/// Domain separation: each kind of hash has its own blake3 derive-key context, so a prefix key
/// can never equal a content key or a namespace root computed from the same bytes.
const NAMESPACE_CONTEXT: &str = "kvb 2026-11 namespace";
const PREFIX_CONTEXT: &str = "kvb 2026-11 prefix key";
const CONTENT_CONTEXT: &str = "kvb 2026-11 content key";
const SCOPE_CONTEXT: &str = "kvb 2026-11 namespace scope";

/// Feeds token ids as length-prefixed little-endian u32s.
fn hash_tokens(hasher: &mut blake3::Hasher, tokens: &[u32]) {
    hasher.update(&(tokens.len() as u64).to_le_bytes());
    #[cfg(target_endian = "little")]
    {
        // In memory, u32s already are little-endian bytes: hash them without a copy.
        hasher.update(bytemuck::cast_slice::<u32, u8>(tokens));
    }
    #[cfg(not(target_endian = "little"))]
    for t in tokens {
        hasher.update(&t.to_le_bytes());
    }
}

/// Everything a cached K/V depends on besides the tokens. Build one with [`Namespace::builder`].
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Namespace {
    root: Key,
}

impl fmt::Debug for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Namespace({})", self.root.short())
    }
}

/// Collects the fields of a [`Namespace`]; unset fields hash as empty, and are still distinct
/// from any set value.
#[derive(Debug, Clone, Default)]
pub struct NamespaceBuilder {
    fields: Vec<(&'static str, Vec<u8>)>,
}

impl NamespaceBuilder {
    fn field(mut self, name: &'static str, value: &[u8]) -> Self {
        self.fields.retain(|(n, _)| *n != name);
        self.fields.push((name, value.to_vec()));
        self
    }

    /// The model's identity: a digest of its config and weights.
    pub fn model_fingerprint(self, fingerprint: &[u8]) -> Self {
        self.field("model", fingerprint)
    }

    /// The dtype K/V is computed in (e.g. `f32`).
    pub fn dtype(self, dtype: &str) -> Self {
        self.field("dtype", dtype.as_bytes())
    }

    /// The chunking settings (e.g. `fixed:128:32`): a different cut gives different chunks.
    pub fn chunking(self, chunking: &str) -> Self {
        self.field("chunking", chunking.as_bytes())
    }

    /// Bits of stored K/V (16 = unquantized).
    pub fn kv_bits(self, bits: u8) -> Self {
        self.field("kv_bits", &[bits])
    }

    /// Any other setting that changes stored K/V.
    pub fn extra(self, name: &'static str, value: &str) -> Self {
        self.field(name, value.as_bytes())
    }

    /// Hashes the fields (sorted by name, each length-prefixed) into a namespace.
    pub fn build(mut self) -> Namespace {
        self.fields.sort_by(|a, b| a.0.cmp(b.0));
        let mut h = blake3::Hasher::new_derive_key(NAMESPACE_CONTEXT);
        h.update(&(self.fields.len() as u64).to_le_bytes());
        for (name, value) in &self.fields {
            h.update(&(name.len() as u64).to_le_bytes());
            h.update(name.as_bytes());
            h.update(&(value.len() as u64).to_le_bytes());
            h.update(value);
        }
        Namespace {
            root: Key(*h.finalize().as_bytes()),
        }
    }
}

impl Namespace {
    /// Starts a namespace description.
    pub fn builder() -> NamespaceBuilder {
        NamespaceBuilder::default()
    }

    /// The namespace's own key (for logs and for stores that keep several namespaces apart).
    pub fn id(&self) -> Key {
        self.root
    }

    /// The namespace whose key is `id` (what [`Namespace::id`] gave).
    pub fn from_id(id: Key) -> Namespace {
        Namespace { root: id }
    }

    /// A namespace inside this one for `scope` (a tenant, a cache salt): every key under it
    /// differs from this namespace's and from any other scope's, so cached K/V is shared only
    /// among requests that name the same scope.
    pub fn scoped(&self, scope: &[u8]) -> Namespace {
        let mut h = blake3::Hasher::new_derive_key(SCOPE_CONTEXT);
        h.update(&self.root.0);
        h.update(&(scope.len() as u64).to_le_bytes());
        h.update(scope);
        Namespace {
            root: Key(*h.finalize().as_bytes()),
        }
    }

    /// The parent of the first chunk of every prompt.
    pub fn root(&self) -> PrefixKey {
        PrefixKey(self.root)
    }

    /// The prefix key of a chunk of `tokens` that follows the chunk keyed `parent`.
    pub fn prefix_key(&self, parent: &PrefixKey, tokens: &[u32]) -> PrefixKey {
        let mut h = blake3::Hasher::new_derive_key(PREFIX_CONTEXT);
        h.update(&self.root.0);
        h.update(parent.bytes());
        hash_tokens(&mut h, tokens);
        PrefixKey(Key(*h.finalize().as_bytes()))
    }

    /// The content key of a chunk of `tokens`, wherever it appears.
    pub fn content_key(&self, tokens: &[u32]) -> ContentKey {
        let mut h = blake3::Hasher::new_derive_key(CONTENT_CONTEXT);
        h.update(&self.root.0);
        hash_tokens(&mut h, tokens);
        ContentKey(Key(*h.finalize().as_bytes()))
    }

    /// The prefix keys of consecutive chunks from the start of a prompt.
    pub fn chain<'a>(&self, chunks: impl IntoIterator<Item = &'a [u32]>) -> Vec<PrefixKey> {
        let mut parent = self.root();
        chunks
            .into_iter()
            .map(|c| {
                parent = self.prefix_key(&parent, c);
                parent
            })
            .collect()
    }
}
