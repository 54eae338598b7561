//! A request's engine events as an async channel: the scheduler pushes each event into it as it
//! happens, so no thread waits per request. Dropping [`Events`] (the client went away, the
//! request timed out) drops the request's ticket, which cancels its sequence at once, queued or
//! running: its blocks are freed at the scheduler's next step.

use super::app::ServedEngine;
use kvb_engine::{EngineError, Event, EventSink, Request, RequestTicket};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// The engine's side: a send never blocks the scheduler.
struct PushTo(UnboundedSender<Event>);

impl EventSink for PushTo {
    fn push(&self, event: Event) -> bool {
        self.0.send(event).is_ok()
    }
}

/// One request's events, ending after `Finished`.
pub struct Events {
    events: UnboundedReceiver<Event>,
    /// Held so that dropping `Events` cancels the request.
    _ticket: RequestTicket,
    finished: bool,
}

impl Events {
    /// The next event; a `Finished` with [`EngineError::Stopped`] if the engine stopped before
    /// the request's end, and `None` after `Finished`.
    pub async fn recv(&mut self) -> Option<Event> {
        if self.finished {
            return None;
        }
        let event = self
            .events
            .recv()
            .await
            .unwrap_or_else(|| Event::Finished(Box::new(Err(EngineError::Stopped))));
        self.finished = matches!(event, Event::Finished(_));
        Some(event)
    }
}

/// Queues `request` with its events pushed to the returned channel (see
/// [`kvb_engine::Engine::submit`] for the checks that refuse it).
pub fn submit(engine: &dyn ServedEngine, request: Request) -> Result<Events, EngineError> {
    let (tx, events) = unbounded_channel();
    let ticket = engine.submit_to(request, Box::new(PushTo(tx)))?;
    Ok(Events {
        events,
        _ticket: ticket,
        finished: false,
    })
}
