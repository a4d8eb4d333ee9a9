//! The sidecar's attachment, as the journal keeps it: written before a record names this
//! sidecar, refreshed every third of its TTL while some session has a record, and no
//! longer than two fifths of the shortest TTL those records list.

use std::time::Duration;

use tokio::time::Instant;

use super::{RETRY, Task};

impl Task {
    /// Whether some session of this sidecar has (or is about to have) a record.
    pub(super) fn needs_attachment(&self) -> bool {
        self.tracked.values().any(|t| !t.ended && t.has_record())
    }

    /// How long the attachment may live: `--attachment-ttl`, and at most two fifths
    /// of the shortest TTL of the locks that this sidecar's records list, so that its
    /// sessions can be resumed elsewhere within half of any of their TTLs after it
    /// died (a tenth of the TTL is left for the resuming client's retries and round
    /// trips). A walk over every listed line, once per refresh (a third of the result).
    pub(super) fn attachment_ttl(&self) -> Duration {
        let lines = self.tracked.values().filter(|t| !t.ended && !t.foreign);
        let shortest = lines
            .flat_map(|t| {
                t.listed
                    .values()
                    .chain(t.pending.values().filter_map(|(line, _)| line.as_ref()))
            })
            .map(|line| line.ttl)
            .min();
        shortest.map_or(self.attachment, |ttl| self.attachment.min(ttl * 2 / 5))
    }

    /// Writes the attachment; schedules the next write.
    pub(super) async fn attach(&mut self) -> bool {
        let ttl = self.attachment_ttl();
        let result = self.store.attach(&self.sidecar, ttl).await;
        self.failing.attachment(&result);
        match result {
            Ok(()) => {
                self.attached_ttl = ttl;
                self.attach_at = Some(Instant::now() + ttl / 3);
                true
            }
            Err(_) => {
                self.attach_at = Some(Instant::now() + RETRY);
                false
            }
        }
    }
}
