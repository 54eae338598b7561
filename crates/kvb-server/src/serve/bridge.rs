//! From the engine's blocking event channel to an async one. A thread per request waits on the
//! engine's events and forwards them; when the async side is dropped (the client went away, the
//! request timed out) the thread drops the request's handle, which cancels its sequence: its
//! blocks are freed at the scheduler's next step.

use kvb_engine::{EngineError, Event, RequestHandle};
use std::time::Duration;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// How often a waiting forwarder checks whether anyone still listens (a request queued behind
/// others sends nothing for a while).
const POLL: Duration = Duration::from_millis(50);

/// The events of `handle`, as an async channel that ends after `Finished`.
pub fn forward(handle: RequestHandle) -> UnboundedReceiver<Event> {
    let (tx, rx) = unbounded_channel();
    tokio::task::spawn_blocking(move || loop {
        match handle.next_event_timeout(POLL) {
            Ok(Some(event)) => {
                let last = matches!(event, Event::Finished(_));
                if tx.send(event).is_err() || last {
                    return; // dropping `handle` cancels a request still running
                }
            }
            Ok(None) if tx.is_closed() => return,
            Ok(None) => {}
            Err(_) => {
                let _ = tx.send(Event::Finished(Box::new(Err(EngineError::Stopped))));
                return;
            }
        }
    });
    rx
}
