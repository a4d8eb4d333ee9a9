//! A session's record as the journal knows it: what the store lists, what is to be
//! written, and whether the record still is this sidecar's to write.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::SessionRef;
use crate::store::RecordLine;

/// One session's record as the journal knows it.
#[derive(Default)]
pub(super) struct Tracked {
    pub(super) session: Option<Arc<SessionRef>>,
    /// What the store's record lists (as far as the journal knows).
    pub(super) listed: HashMap<Arc<str>, RecordLine>,
    /// Changes not written yet: a line to list, or `None` to take the key off, with
    /// when the change was made. Emptied by a flush, it gives its table back
    /// (`flush.rs`).
    pub(super) pending: HashMap<Arc<str>, (Option<RecordLine>, Instant)>,
    pub(super) ended: bool,
    /// The record is another generation's: never written again.
    pub(super) foreign: bool,
    /// When the record's TTL is next extended (in `Task::refreshes`).
    pub(super) refresh_at: Option<Instant>,
}

impl Tracked {
    /// The longest TTL of the locks listed or about to be.
    pub(super) fn longest_ttl(&self) -> Duration {
        let pending = self.pending.values().filter_map(|(line, _)| line.as_ref());
        (self.listed.values().chain(pending))
            .map(|l| l.ttl)
            .max()
            .unwrap_or_default()
    }

    /// Whether the store has, or is about to have, a record of this session.
    pub(super) fn has_record(&self) -> bool {
        !self.foreign
            && (!self.listed.is_empty() || self.pending.values().any(|(line, _)| line.is_some()))
    }
}
