//! What the client of a session is told: events, in order, with their metrics, and
//! refusals, which echo the key and the holder of the request they refuse.

use super::{Held, Session, grants};
use crate::engine::{EndReason, Event, NotAcquiredReason, RejectCode, Rejection};
use crate::metrics::Outcome as Counted;
use crate::store::{StoreError, names};

impl Session {
    /// Sends an event, ending the session if the client does not read its answers. The
    /// last slot of the buffer is kept for the `Ended` event that says so.
    pub(super) fn send(&mut self, event: Event) {
        if self.overflow {
            return;
        }
        if self.out.capacity() <= 1 {
            self.overflow = true;
            let _ = self.out.try_send(Event::Ended(EndReason::Overflow));
            return;
        }
        self.count(&event);
        if self.out.try_send(event).is_err() {
            self.overflow = true;
        }
    }

    /// Metrics of what the client is told.
    fn count(&self, event: &Event) {
        let metrics = &self.shared.metrics;
        match event {
            Event::Granted { .. } | Event::GrantedAll { .. } => metrics.acquired(Counted::Granted),
            Event::NotAcquired { reason, .. } => metrics.acquired(match reason {
                NotAcquiredReason::Busy => Counted::Busy,
                NotAcquiredReason::Timeout => Counted::Timeout,
                NotAcquiredReason::Cancelled => Counted::Cancelled,
            }),
            Event::Rejected(r) if r.code == RejectCode::Unavailable => {
                metrics.acquired(Counted::Unavailable)
            }
            Event::Rejected(_) => metrics.acquired(Counted::Rejected),
            Event::Jeopardy { .. } => {
                metrics.jeopardy.inc();
            }
            // Lost is counted where the lock is dropped, with its reason (`lose`).
            _ => {}
        }
    }

    /// A grant leaves the session: gauges and the hold-time histogram.
    pub(super) fn forget(&self, held: &Held) {
        grants::forget(&self.shared.metrics, held);
    }

    /// Refuses a request about the grant `name` (its key and holder are echoed).
    pub(super) fn reject(
        &mut self,
        request_id: u64,
        name: &str,
        code: RejectCode,
        message: impl Into<String>,
    ) {
        let (key, holder) = names::split(name);
        self.send(Event::Rejected(
            Rejection::new(request_id, key, code, message).of_holder(holder),
        ));
    }

    /// Answers UNAVAILABLE, or RESOURCE_EXHAUSTED when the store is out of memory. The
    /// client learns that the store cannot be reached or is full, not how: addresses
    /// and driver messages stay in the log.
    pub(super) fn store_failed(&mut self, request_id: u64, name: &str, error: &StoreError) {
        // Counted by the metered store (`lockside_store_calls_total`).
        let (key, holder) = names::split(name);
        log!(self, WARN, %key, %holder, %error, "store call failed");
        let (code, message) = Rejection::of_store(error);
        self.reject(request_id, name, code, message);
    }
}
