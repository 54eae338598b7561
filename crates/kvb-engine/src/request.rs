//! Requests in, events out: what [`crate::Engine::submit`] takes and returns.

use crate::config::GenerateOptions;
use crate::result::{GenerationResult, Started};
use crate::EngineError;
use crossbeam::channel::{Receiver, RecvTimeoutError, Sender};
use kvb_model::generate::TokenLogprobs;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A request for the engine.
#[derive(Debug, Clone)]
pub struct Request {
    /// The prompt's token ids.
    pub tokens: Vec<u32>,
    /// How to generate and use the cache.
    pub options: GenerateOptions,
    /// When the request arrived: TTFT is counted from here (a server passes the moment the HTTP
    /// request came in; tokenization and any wait in the queue count).
    pub arrival: Instant,
}

impl Request {
    /// A request for `tokens`, arriving now.
    pub fn new(tokens: Vec<u32>, options: GenerateOptions) -> Self {
        Request {
            tokens,
            options,
            arrival: Instant::now(),
        }
    }
}

/// What a running request reports.
#[derive(Debug)]
pub enum Event {
    /// The first token is known (sent just before it): TTFT and what the cache gave.
    Started(Started),
    /// A generated token and the text it made final (possibly empty).
    Token {
        /// The token.
        token: u32,
        /// Text that became final with it.
        text: String,
        /// Its log-probability and the most likely tokens, when the request asks
        /// ([`crate::GenerateOptions::logprobs`]). `None` on the last event of a request whose
        /// held-back text is released at its end (it repeats the last token).
        logprobs: Option<TokenLogprobs>,
    },
    /// The request ended: its result, or why it failed (`Cancelled` when cancelled). Boxed: a
    /// result is large, and every token event would otherwise be as large.
    Finished(Box<Result<GenerationResult, EngineError>>),
}

const RUNNING: u8 = 0;
const CANCELLED: u8 = 1;
const FINISHED: u8 = 2;

/// Whether a request still runs; shared by its handle and the scheduler.
#[derive(Debug, Default)]
pub(crate) struct RequestState(AtomicU8);

impl RequestState {
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire) == CANCELLED
    }

    /// Marks the request finished (no cancel can land after this).
    pub fn finish(&self) {
        self.0.store(FINISHED, Ordering::Release);
    }

    fn cancel(&self) -> Result<(), EngineError> {
        match self
            .0
            .compare_exchange(RUNNING, CANCELLED, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Ok(()),
            Err(CANCELLED) => Err(EngineError::AlreadyCancelled),
            Err(_) => Err(EngineError::AlreadyFinished),
        }
    }
}

/// Where a request's events go ([`crate::Engine::submit_to`]): the scheduler pushes each one as
/// it happens, from its own thread, so a sink must not block (an unbounded channel's sender, as
/// a server's async one). `false` says nobody listens any more: the request is then cancelled
/// and its blocks freed at the scheduler's next step.
pub trait EventSink: Send + Sync {
    /// Delivers `event`; `false` when its listener is gone.
    fn push(&self, event: Event) -> bool;
}

impl<S: EventSink + ?Sized> EventSink for Box<S> {
    fn push(&self, event: Event) -> bool {
        (**self).push(event)
    }
}

impl EventSink for Sender<Event> {
    fn push(&self, event: Event) -> bool {
        self.send(event).is_ok()
    }
}

/// The scheduler's side of a request: where events go.
pub(crate) struct Sink {
    pub events: Box<dyn EventSink>,
    pub state: Arc<RequestState>,
}

impl Sink {
    /// Sends an event; a listener that is gone cancels the request (not an error: a client may
    /// leave).
    pub fn send(&self, event: Event) {
        if !self.events.push(event) {
            let _ = self.state.cancel();
        }
    }
}

/// A queued request's id and the means to cancel it, without its events (they go to the
/// [`EventSink`] given to [`crate::Engine::submit_to`]). Dropping it cancels a request that
/// still runs, at once: a client that went away frees its blocks even while it waits in the
/// queue.
pub struct RequestTicket {
    pub(crate) id: u64,
    pub(crate) state: Arc<RequestState>,
    /// Wakes the scheduler so a cancel is acted on at its next step.
    pub(crate) wake: Box<dyn Fn() + Send + Sync>,
}

impl std::fmt::Debug for RequestTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestTicket")
            .field("id", &self.id)
            .finish()
    }
}

impl RequestTicket {
    /// The request's id (unique within the engine).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Cancels the request: its sequence stops at the scheduler's next step and its blocks are
    /// freed. Cancelling twice, or a request that has finished, is an error saying so.
    pub fn cancel(&self) -> Result<(), EngineError> {
        self.state.cancel()?;
        (self.wake)();
        Ok(())
    }
}

impl Drop for RequestTicket {
    fn drop(&mut self) {
        if self.state.cancel().is_ok() {
            (self.wake)();
        }
    }
}

/// A submitted request: its events as they happen, and a way to cancel it. Dropping the handle
/// of a request that still runs cancels it (a client that went away frees its blocks at once).
#[derive(Debug)]
pub struct RequestHandle {
    pub(crate) ticket: RequestTicket,
    pub(crate) events: Receiver<Event>,
}

impl RequestHandle {
    /// The request's id (unique within the engine).
    pub fn id(&self) -> u64 {
        self.ticket.id()
    }

    /// The next event, waiting for it; `None` once the last one was taken.
    pub fn next_event(&self) -> Option<Event> {
        self.events.recv().ok()
    }

    /// The next event if one comes within `timeout`.
    pub fn next_event_timeout(&self, timeout: Duration) -> Result<Option<Event>, EngineError> {
        match self.events.recv_timeout(timeout) {
            Ok(e) => Ok(Some(e)),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => Err(EngineError::Stopped),
        }
    }

    /// The event channel itself (to select over several requests).
    pub fn events(&self) -> &Receiver<Event> {
        &self.events
    }

    /// Cancels the request: its sequence stops at the scheduler's next step and its blocks are
    /// freed. Cancelling twice, or a request that has finished, is an error saying so.
    pub fn cancel(&self) -> Result<(), EngineError> {
        self.ticket.cancel()
    }

    /// Waits for the end, calling `on_token` for each token, and returns the result.
    pub fn wait_streaming(
        self,
        on_token: &mut dyn FnMut(kvb_model::generate::StreamEvent<'_>),
    ) -> Result<GenerationResult, EngineError> {
        loop {
            match self.events.recv() {
                Ok(Event::Token { token, text, .. }) => {
                    on_token(kvb_model::generate::StreamEvent { token, text: &text })
                }
                Ok(Event::Started(_)) => {}
                Ok(Event::Finished(result)) => return *result,
                Err(_) => return Err(EngineError::Stopped),
            }
        }
    }

    /// Waits for the end and returns the result.
    pub fn wait(self) -> Result<GenerationResult, EngineError> {
        self.wait_streaming(&mut |_| {})
    }
}
