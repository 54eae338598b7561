//! [`RemoteBackend`] over the Redis protocol (Redis and Valkey), with the `redis` crate's
//! synchronous connections: one for lookups and one for the writer, so a long write never delays
//! a request's read. A connection is opened on first use and again after any failure.

use super::{RemoteBackend, RemoteError};
use redis::{Client, Connection, ErrorKind, RedisError};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// A Redis or Valkey server.
pub struct RedisBackend {
    client: Client,
    timeout: Duration,
    described: String,
    reads: Mutex<Option<Connection>>,
    writes: Mutex<Option<Connection>>,
}

/// Whether the server answered with an error (`-OOM ...`, `-ERR ...`: `Extension` is the kind
/// of error codes the crate does not name), as opposed to not answering in a way we understand.
fn is_error_answer(e: &RedisError) -> bool {
    matches!(e.kind(), ErrorKind::Server(_) | ErrorKind::Extension)
}

fn classify(e: RedisError) -> RemoteError {
    // An error answer leaves the connection usable; anything else (I/O, timeout, a reply that
    // does not parse) may leave it mid-reply, so it is dropped and the store counted as down.
    if is_error_answer(&e) {
        RemoteError::Refused(e.to_string())
    } else {
        RemoteError::Unavailable(e.to_string())
    }
}

impl RedisBackend {
    /// A backend for `url` (`redis://HOST:PORT/DB`, `redis+unix:///path`); nothing is connected
    /// yet. `timeout` bounds every connect, read and write.
    pub fn open(url: &str, timeout: Duration) -> Result<Self, String> {
        let client = Client::open(url).map_err(|e| {
            format!("remote cache URL {url:?} (expected redis://HOST:PORT/DB): {e}")
        })?;
        let info = client.get_connection_info();
        let described = format!("{} db {}", info.addr(), info.redis_settings().db());
        Ok(RedisBackend {
            client,
            timeout,
            described,
            reads: Mutex::new(None),
            writes: Mutex::new(None),
        })
    }

    fn connect(&self) -> Result<Connection, RemoteError> {
        let c = self
            .client
            .get_connection_with_timeout(self.timeout)
            .map_err(classify)?;
        c.set_read_timeout(Some(self.timeout)).map_err(classify)?;
        c.set_write_timeout(Some(self.timeout)).map_err(classify)?;
        Ok(c)
    }

    /// Runs `call` on the connection in `slot`, opening one if needed; a failed call drops it.
    /// A connection kept from before may have been closed by the server since (a restart, an
    /// idle timeout): if it fails other than by timing out, the call is tried once more on a new one. Every call the tier
    /// makes is idempotent (MGET, SET, DEL), so trying twice is safe.
    fn with<T>(
        &self,
        slot: &Mutex<Option<Connection>>,
        call: impl Fn(&mut Connection) -> Result<T, RedisError>,
    ) -> Result<T, RemoteError> {
        let mut slot: MutexGuard<'_, Option<Connection>> =
            slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(kept) = slot.as_mut() {
            match call(kept) {
                Ok(v) => return Ok(v),
                Err(e) => {
                    *slot = None;
                    // A slow server would only be waited for twice.
                    if e.is_timeout() || is_error_answer(&e) {
                        return Err(classify(e));
                    }
                }
            }
        }
        let conn = slot.insert(self.connect()?);
        call(conn).map_err(|e| {
            *slot = None;
            classify(e)
        })
    }
}

impl RemoteBackend for RedisBackend {
    fn get_many(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, RemoteError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let values: Vec<Option<Vec<u8>>> =
            self.with(&self.reads, |c| redis::cmd("MGET").arg(keys).query(c))?;
        if values.len() != keys.len() {
            return Err(RemoteError::Unavailable(format!(
                "MGET of {} keys answered {} values",
                keys.len(),
                values.len()
            )));
        }
        Ok(values)
    }

    fn put_many(&self, entries: &[(String, Vec<u8>)]) -> Result<(), RemoteError> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for (k, v) in entries {
            pipe.cmd("SET").arg(k).arg(v.as_slice()).ignore();
        }
        self.with(&self.writes, |c| pipe.exec(c))
    }

    fn delete(&self, keys: &[String]) -> Result<(), RemoteError> {
        if keys.is_empty() {
            return Ok(());
        }
        self.with(&self.writes, |c| redis::cmd("DEL").arg(keys).exec(c))
    }

    fn describe(&self) -> String {
        self.described.clone()
    }
}
