//! The remote tier against a real Redis (Debian's redis-server, started by each test on a free
//! loopback port): what one store writes another reads; corrupt values, other namespaces, a dead,
//! silent or babbling server never yield a wrong chunk or an error, and hits resume after an
//! outage.

mod common;

use common::{chunk, chunk_after, ns};
use kvb_hash::Namespace;
use kvb_store::remote::test_server::RedisServer;
use kvb_store::{ChunkStore, KvChunk, RemoteConfig, RemoteStats, StoreConfig};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

fn remote_store(url: &str) -> ChunkStore {
    ChunkStore::new(StoreConfig {
        remote: Some(RemoteConfig {
            timeout: Duration::from_millis(300),
            retry_interval: Duration::from_millis(200),
            ..RemoteConfig::new(url)
        }),
        ..StoreConfig::ram(64 << 20)
    })
    .unwrap()
}

fn remote(s: &ChunkStore) -> RemoteStats {
    s.stats().remote.expect("a remote tier")
}

/// Stores `value` under `key` behind the tier's back (to corrupt or forge an entry).
fn set_raw(conn: &mut redis::Connection, key: &str, value: &[u8]) {
    let _: () = redis::cmd("SET").arg(key).arg(value).query(conn).unwrap();
}

/// Three chained chunks of one prompt.
fn prompt_chunks(ns: &Namespace) -> Vec<KvChunk> {
    let mut parent = ns.root();
    (0..3u32)
        .map(|i| {
            let tokens: Vec<u32> = (0..8).map(|t| 100 + 8 * i + t).collect();
            let c = chunk_after(ns, parent, &tokens, 8 * i);
            parent = c.prefix_key;
            c
        })
        .collect()
}

#[test]
fn chunks_written_by_one_store_are_read_by_another() {
    let redis = RedisServer::start().unwrap();
    let ns = ns();
    let chunks = prompt_chunks(&ns);
    let a = remote_store(&redis.url());
    for c in &chunks {
        a.insert(c.clone()).unwrap();
    }
    assert!(a.wait_remote_writes(WAIT));
    assert_eq!(remote(&a).writes, 3);

    let b = remote_store(&redis.url());
    let keys: Vec<_> = chunks.iter().map(|c| c.prefix_key).collect();
    assert_eq!(b.prefetch(&keys, &[]).unwrap(), 3);
    let tokens: Vec<u32> = chunks.iter().flat_map(|c| c.tokens.clone()).collect();
    let hit = b.longest_prefix(ns.root(), &tokens).unwrap().unwrap();
    assert_eq!(hit.matched_tokens, 24);
    for ((got, _), want) in hit.chunks.iter().zip(&chunks) {
        assert_eq!(**got, *want);
    }
    let st = remote(&b);
    assert_eq!((st.hits, st.misses, st.corrupt), (3, 0, 0));
    assert!(st.connected);
    // What B read came from the remote tier: it is not written back.
    assert!(b.wait_remote_writes(WAIT));
    assert_eq!(remote(&b).writes, 0);
    // A second prefetch asks nothing: B has them now.
    assert_eq!(b.prefetch(&keys, &[]).unwrap(), 0);
    assert_eq!(remote(&b).hits, 3);
}

#[test]
fn a_moved_chunk_is_found_through_the_content_index() {
    let redis = RedisServer::start().unwrap();
    let ns = ns();
    let first = chunk(&ns, &[1, 2, 3, 4]);
    let moved = chunk_after(&ns, first.prefix_key, &[7, 8, 9, 10], 4);
    let a = remote_store(&redis.url());
    a.insert(first).unwrap();
    a.insert(moved.clone()).unwrap();
    assert!(a.wait_remote_writes(WAIT));

    let b = remote_store(&redis.url());
    // Looked up by its tokens alone, as a prompt that holds them elsewhere would.
    assert_eq!(b.prefetch(&[], &[moved.content_key]).unwrap(), 1);
    let m = b.get_by_content(&moved.content_key).unwrap().unwrap();
    assert!(m.approximate);
    assert_eq!(*m.chunk, moved);
}

#[test]
fn a_corrupted_value_is_dropped_counted_and_deleted() {
    let redis = RedisServer::start().unwrap();
    let ns = ns();
    let good = chunk(&ns, &[1, 2, 3, 4]);
    let other = chunk(&ns, &[5, 6, 7, 8]);
    let a = remote_store(&redis.url());
    a.insert(good.clone()).unwrap();
    a.insert(other.clone()).unwrap();
    assert!(a.wait_remote_writes(WAIT));

    let mut conn = redis.connection().unwrap();
    let key = format!("kvb:p:{}", good.prefix_key.0.hex());
    let mut value: Vec<u8> = redis::cmd("GET").arg(&key).query(&mut conn).unwrap();
    let last = value.len() - 1;
    value[last] ^= 0x01; // one bit of the last K/V value
    set_raw(&mut conn, &key, &value);
    // The content index of `other` forged to name `good`'s key: tokens that do not match.
    let forged = format!("kvb:c:{}", other.content_key.0.hex());
    set_raw(&mut conn, &forged, good.prefix_key.bytes().as_slice());

    let b = remote_store(&redis.url());
    assert_eq!(b.prefetch(&[good.prefix_key], &[]).unwrap(), 0);
    assert!(b.get(&good.prefix_key).unwrap().is_none());
    assert_eq!(remote(&b).corrupt, 1);
    assert!(b.wait_remote_writes(WAIT));
    let exists: u32 = redis::cmd("EXISTS").arg(&key).query(&mut conn).unwrap();
    assert_eq!(exists, 0, "the corrupt value is deleted");

    // Restore the real chunk under `good`'s key: the forged index entry still names a chunk
    // whose tokens are not `other`'s.
    a.invalidate(&good.prefix_key).unwrap();
    a.insert(good.clone()).unwrap();
    assert!(a.wait_remote_writes(WAIT));
    set_raw(&mut conn, &forged, good.prefix_key.bytes().as_slice());
    let c = remote_store(&redis.url());
    assert_eq!(c.prefetch(&[], &[other.content_key]).unwrap(), 0);
    assert!(c.get_by_content(&other.content_key).unwrap().is_none());
    assert_eq!(remote(&c).corrupt, 1);
}

#[test]
fn two_namespaces_never_read_each_others_entries() {
    let redis = RedisServer::start().unwrap();
    let int8 = Namespace::builder()
        .model_fingerprint(b"store-tests")
        .extra("kv_precision", "int8")
        .build();
    let f32 = Namespace::builder()
        .model_fingerprint(b"store-tests")
        .extra("kv_precision", "f32")
        .build();
    let tokens = [1, 2, 3, 4];
    let a = remote_store(&redis.url());
    a.insert(chunk(&int8, &tokens)).unwrap();
    assert!(a.wait_remote_writes(WAIT));

    let b = remote_store(&redis.url());
    let theirs = chunk(&f32, &tokens);
    assert_eq!(
        b.prefetch(&[theirs.prefix_key], &[theirs.content_key])
            .unwrap(),
        0
    );
    assert_eq!(remote(&b).misses, 2);
    // The same tokens under the writer's namespace are there.
    let mine = chunk(&int8, &tokens);
    assert_eq!(b.prefetch(&[mine.prefix_key], &[]).unwrap(), 1);
}

#[test]
fn an_outage_is_survived_and_hits_resume_after_a_restart() {
    let mut redis = RedisServer::start().unwrap();
    let ns = ns();
    let a = remote_store(&redis.url());
    let b = remote_store(&redis.url());
    let before = chunk(&ns, &[1, 2, 3, 4]);
    a.insert(before.clone()).unwrap();
    assert!(a.wait_remote_writes(WAIT));

    redis.kill();
    let during = chunk(&ns, &[5, 6, 7, 8]);
    assert_eq!(
        a.insert(during.clone()).unwrap(),
        kvb_store::Inserted::Ram,
        "the local tier takes it"
    );
    assert!(a.wait_remote_writes(WAIT));
    let st = remote(&a);
    assert_eq!(st.writes_dropped, 1);
    assert_eq!(st.outages, 1);
    assert!(!st.connected);
    assert_eq!(b.prefetch(&[before.prefix_key], &[]).unwrap(), 0);
    // Within the retry interval nothing is sent: the next request pays no timeout.
    assert_eq!(b.prefetch(&[before.prefix_key], &[]).unwrap(), 0);
    let st = remote(&b);
    assert_eq!((st.outages, st.skipped_lookups), (1, 1));
    assert!(a.get(&during.prefix_key).unwrap().is_some());

    redis.restart().unwrap();
    std::thread::sleep(Duration::from_millis(400)); // past the retry interval
    let after = chunk(&ns, &[9, 10, 11, 12]);
    a.insert(after.clone()).unwrap();
    assert!(a.wait_remote_writes(WAIT));
    assert_eq!(b.prefetch(&[after.prefix_key], &[]).unwrap(), 1);
    assert!(remote(&a).connected && remote(&b).connected);
    assert_eq!(remote(&b).outages, 1, "one outage, counted once");
}

/// A store whose remote "server" is `serve`, run on every connection of a loopback listener.
fn store_against(serve: fn(std::net::TcpStream)) -> ChunkStore {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().map_while(Result::ok) {
            std::thread::spawn(move || serve(conn));
        }
    });
    remote_store(&format!("redis://127.0.0.1:{port}/0"))
}

#[test]
fn a_server_that_never_answers_costs_one_timeout_and_no_error() {
    let s = store_against(|mut conn| {
        let mut buf = [0u8; 4096];
        while conn.read(&mut buf).is_ok_and(|n| n > 0) {}
    });
    let c = chunk(&ns(), &[1, 2, 3, 4]);
    let start = std::time::Instant::now();
    assert_eq!(s.prefetch(&[c.prefix_key], &[c.content_key]).unwrap(), 0);
    // Correctness, not speed: the call gave up (300 ms timeout) instead of hanging.
    assert!(start.elapsed() < Duration::from_secs(30));
    let st = remote(&s);
    assert_eq!((st.errors, st.outages, st.hits), (1, 1, 0));
    assert_eq!(s.insert(c.clone()).unwrap(), kvb_store::Inserted::Ram);
    assert!(s.wait_remote_writes(WAIT));
    assert!(s.get(&c.prefix_key).unwrap().is_some());
}

#[test]
fn a_server_answering_garbage_is_an_outage_not_a_crash() {
    let s = store_against(|mut conn| {
        let mut buf = [0u8; 4096];
        while conn.read(&mut buf).is_ok_and(|n| n > 0) {
            let _ = conn.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n\x00\xff garbage");
        }
    });
    let c = chunk(&ns(), &[1, 2, 3, 4]);
    assert_eq!(s.prefetch(&[c.prefix_key], &[]).unwrap(), 0);
    let st = remote(&s);
    assert_eq!((st.outages, st.hits, st.corrupt), (1, 0, 0));
    assert!(st.errors >= 1);
}

#[test]
fn a_full_redis_refuses_writes_without_an_outage() {
    let redis = RedisServer::start().unwrap();
    let mut conn = redis.connection().unwrap();
    // Nothing may be evicted and there is no room: every SET answers OOM.
    for (k, v) in [("maxmemory-policy", "noeviction"), ("maxmemory", "1")] {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(k)
            .arg(v)
            .query(&mut conn)
            .unwrap();
    }
    let s = remote_store(&redis.url());
    let c = chunk(&ns(), &[1, 2, 3, 4]);
    assert_eq!(s.insert(c.clone()).unwrap(), kvb_store::Inserted::Ram);
    assert!(s.wait_remote_writes(WAIT));
    let st = remote(&s);
    assert_eq!(
        (st.writes, st.writes_dropped, st.outages),
        (0, 1, 0),
        "{st:?}"
    );
    assert!(st.errors >= 1 && st.connected);
    // Reads still work while it is full.
    assert_eq!(
        s.prefetch(&[chunk(&ns(), &[9]).prefix_key], &[]).unwrap(),
        0
    );
    assert_eq!(remote(&s).misses, 1);
}
