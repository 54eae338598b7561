//! The remote tier's promises that need no server, over an in-memory [`RemoteBackend`]: any
//! damage to a stored value is caught, never used; a full or refusing store and an over-budget
//! backlog drop writes without failing the insert; chunks of every format round-trip.

mod common;

use common::{chunk, ns};
use kvb_store::{
    ChunkStore, KvChunk, KvData, RemoteBackend, RemoteConfig, RemoteError, StoreConfig,
};
use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A shared map; `refuse_writes` answers every put as a full Redis would.
#[derive(Default)]
struct MemoryBackend {
    map: Mutex<HashMap<String, Vec<u8>>>,
    refuse_writes: bool,
}

impl RemoteBackend for MemoryBackend {
    fn get_many(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, RemoteError> {
        let map = self.map.lock().unwrap();
        Ok(keys.iter().map(|k| map.get(k).cloned()).collect())
    }
    fn put_many(&self, entries: &[(String, Vec<u8>)]) -> Result<(), RemoteError> {
        if self.refuse_writes {
            return Err(RemoteError::Refused("OOM command not allowed".into()));
        }
        let mut map = self.map.lock().unwrap();
        for (k, v) in entries {
            map.insert(k.clone(), v.clone());
        }
        Ok(())
    }
    fn delete(&self, keys: &[String]) -> Result<(), RemoteError> {
        let mut map = self.map.lock().unwrap();
        keys.iter().for_each(|k| {
            map.remove(k);
        });
        Ok(())
    }
    fn describe(&self) -> String {
        "memory".into()
    }
}

fn store(backend: &Arc<MemoryBackend>, config: RemoteConfig) -> ChunkStore {
    let b: Arc<dyn RemoteBackend> = backend.clone();
    ChunkStore::with_remote_backend(
        StoreConfig {
            remote: Some(config),
            ..StoreConfig::ram(64 << 20)
        },
        b,
    )
    .unwrap()
}

fn written(c: &KvChunk) -> (Arc<MemoryBackend>, String) {
    let backend = Arc::new(MemoryBackend::default());
    let a = store(&backend, RemoteConfig::new("memory"));
    a.insert(c.clone()).unwrap();
    assert!(a.wait_remote_writes(Duration::from_secs(10)));
    (backend, format!("kvb:p:{}", c.prefix_key.0.hex()))
}

fn with_format(c: &KvChunk, format: u8) -> KvChunk {
    let mut c = c.clone();
    for l in &mut c.layers {
        for d in [&mut l.k, &mut l.v] {
            let v = d.to_f32();
            *d = match format {
                0 => KvData::F32(v),
                1 => KvData::F16(v.iter().map(|&x| half::f16::from_f32(x)).collect()),
                _ => KvData::Bf16(v.iter().map(|&x| half::bf16::from_f32(x)).collect()),
            };
        }
    }
    c
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn any_damage_to_a_value_is_caught_and_never_used(
        tokens in prop::collection::vec(0u32..50_000, 1..24),
        at in any::<prop::sample::Index>(),
        mask in 1u8..=255,
        truncate in any::<bool>(),
    ) {
        let c = chunk(&ns(), &tokens);
        let (backend, key) = written(&c);
        {
            let mut map = backend.map.lock().unwrap();
            let v = map.get_mut(&key).unwrap();
            let i = at.index(v.len());
            if truncate { v.truncate(i) } else { v[i] ^= mask }
        }
        let b = store(&backend, RemoteConfig::new("memory"));
        prop_assert_eq!(b.prefetch(&[c.prefix_key], &[c.content_key]).unwrap(), 0);
        prop_assert!(b.get(&c.prefix_key).unwrap().is_none());
        prop_assert_eq!(b.stats().remote.unwrap().corrupt, 1);
    }

    #[test]
    fn chunks_of_every_format_round_trip(
        tokens in prop::collection::vec(0u32..50_000, 1..24),
        format in 0u8..3,
    ) {
        let c = with_format(&chunk(&ns(), &tokens), format);
        let (backend, _) = written(&c);
        let b = store(&backend, RemoteConfig::new("memory"));
        prop_assert_eq!(b.prefetch(&[c.prefix_key], &[]).unwrap(), 1);
        prop_assert_eq!(&*b.get(&c.prefix_key).unwrap().unwrap(), &c);
    }
}

#[test]
fn a_refusing_store_drops_writes_without_an_outage() {
    let backend = Arc::new(MemoryBackend {
        refuse_writes: true,
        ..Default::default()
    });
    let a = store(&backend, RemoteConfig::new("memory"));
    let c = chunk(&ns(), &[1, 2, 3]);
    assert_eq!(a.insert(c.clone()).unwrap(), kvb_store::Inserted::Ram);
    assert!(a.wait_remote_writes(Duration::from_secs(10)));
    let st = a.stats().remote.unwrap();
    assert_eq!((st.writes, st.writes_dropped, st.errors), (0, 1, 1));
    assert!(st.connected, "an error answer is not an outage");
    assert!(a.get(&c.prefix_key).unwrap().is_some());
}

#[test]
fn a_backlog_over_its_budget_drops_the_write_at_once() {
    let backend = Arc::new(MemoryBackend::default());
    let a = store(
        &backend,
        RemoteConfig {
            max_pending_bytes: 1,
            ..RemoteConfig::new("memory")
        },
    );
    a.insert(chunk(&ns(), &[1, 2, 3])).unwrap();
    assert!(a.wait_remote_writes(Duration::from_secs(10)));
    let st = a.stats().remote.unwrap();
    assert_eq!((st.writes, st.writes_dropped), (0, 1));
    assert!(backend.map.lock().unwrap().is_empty());
}
