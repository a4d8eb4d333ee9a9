//! One grant as the renewer keeps it.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::{LeaseClock, RenewEvent};
use crate::engine::session::Note;
use crate::store::names;

/// One grant as the renewer keeps it: a [`Renewable`] without `confirmed_at` (read
/// once, for its first due time), in the [`Task::schedule`] group of the time it is due.
pub(super) struct Entry {
    pub(super) id: u64,
    pub(super) name: Arc<str>,
    pub(super) owner: Arc<str>,
    pub(super) ttl: Duration,
    pub(super) clock: Arc<LeaseClock>,
    pub(super) events: mpsc::UnboundedSender<Note>,
    pub(super) failing: bool,
}

impl Entry {
    pub(super) fn event(&self, event: fn(u64, Arc<str>) -> RenewEvent) {
        let _ = self
            .events
            .send(Note::Renew(event(self.id, self.name.clone())));
    }

    /// The key the store knows the grant by.
    pub(super) fn key(&self) -> &str {
        names::key_of(&self.name)
    }
}
