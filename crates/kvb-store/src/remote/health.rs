//! Whether the remote store is up: an outage begins at a failed call and ends at the next call
//! that succeeds; during one, calls are tried again only every `retry_interval`, so requests are
//! not each charged a timeout.

use super::RemoteError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug)]
struct State {
    /// When the current outage began (`None`: up).
    down_since: Option<Instant>,
    /// No call before this.
    next_try: Instant,
}

/// Outage tracking shared by the tier's reader and writer.
pub(crate) struct Health {
    name: String,
    retry_interval: Duration,
    state: Mutex<State>,
    pub errors: AtomicU64,
    pub outages: AtomicU64,
}

impl Health {
    pub fn new(name: String, retry_interval: Duration) -> Self {
        Health {
            name,
            retry_interval,
            state: Mutex::new(State {
                down_since: None,
                next_try: Instant::now(),
            }),
            errors: AtomicU64::new(0),
            outages: AtomicU64::new(0),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is two fields written together; a panic elsewhere cannot leave it torn.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a call may be tried now.
    pub fn may_call(&self) -> bool {
        let s = self.state();
        s.down_since.is_none() || Instant::now() >= s.next_try
    }

    /// Whether no outage is under way.
    pub fn is_up(&self) -> bool {
        self.state().down_since.is_none()
    }

    /// A call succeeded: an outage, if any, is over.
    pub fn succeeded(&self) {
        let mut s = self.state();
        if let Some(since) = s.down_since.take() {
            tracing::info!(
                "remote cache {} is back after {:.1} s",
                self.name,
                since.elapsed().as_secs_f64()
            );
        }
    }

    /// A call failed. An unavailable store begins an outage (logged once); an error answer does
    /// not, but is counted.
    pub fn failed(&self, err: &RemoteError) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let RemoteError::Unavailable(why) = err else {
            tracing::debug!("remote cache {}: {err}", self.name);
            return;
        };
        let mut s = self.state();
        let now = Instant::now();
        s.next_try = now + self.retry_interval;
        if s.down_since.is_none() {
            s.down_since = Some(now);
            self.outages.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                "remote cache {} unavailable ({why}); going on with the local tiers and \
                 retrying every {:.1} s",
                self.name,
                self.retry_interval.as_secs_f64()
            );
        }
    }
}
