//! A flush: the gathered changes become one [`RecordWrite`] per session (what to list,
//! what to take off, whether the record ends), all sessions' writes go in one store
//! call, and each answer updates what the journal knows of the store's record.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::{FLUSH_EVERY, RETRY, Task};
use crate::store::{RecordWrite, Recorded, StoreError};
use crate::telemetry::Streak;

/// The journal's writes that fail and are retried (every [`RETRY`] or so), as the log
/// tells them: one line when the attachment's or the records' writes start failing and
/// one when they work again, not one per retry.
#[derive(Debug, Default)]
pub(super) struct Failing {
    attachment: Streak,
    records: Streak,
    /// Whether the records' writes fail now, for the sessions (`Journal::granted`).
    shared: Arc<AtomicBool>,
}

impl Failing {
    pub(super) fn new(shared: Arc<AtomicBool>) -> Self {
        Self {
            shared,
            ..Self::default()
        }
    }

    /// Logs an attachment write that starts or ends a streak of failures.
    pub(super) fn attachment(&mut self, result: &Result<(), StoreError>) {
        match result {
            Ok(()) => {
                if let Some((failures, took)) = self.attachment.recovered() {
                    tracing::info!(
                        failures,
                        ?took,
                        "writing this sidecar's attachment works again"
                    );
                }
            }
            Err(error) => {
                if self.attachment.failed() {
                    tracing::warn!(%error, "writing this sidecar's attachment failed; retrying until it works");
                }
            }
        }
    }

    #[cfg(test)]
    pub(super) fn shared_failing(&self) -> bool {
        self.shared.load(Ordering::Acquire)
    }

    #[cfg(test)]
    pub(super) fn force_records_failing(&mut self) {
        self.records.failed();
        self.shared.store(true, Ordering::Release);
    }

    /// Logs a flush whose record writes (`failed` of `writes` not made, `error` when
    /// the whole call failed) start or end a streak of failures.
    fn records(&mut self, failed: usize, writes: usize, error: Option<&StoreError>) {
        self.shared.store(failed > 0, Ordering::Release);
        if failed == 0 {
            if let Some((failures, took)) = self.records.recovered() {
                tracing::info!(failures, ?took, "writing session records works again");
            }
        } else if self.records.failed() {
            // A store that answers per write logs each write's error at debug.
            let error = error.map(ToString::to_string);
            tracing::warn!(
                failed,
                writes,
                error,
                "writing session records failed; retrying until it works"
            );
        }
    }
}

impl Task {
    /// Writes what has gathered, and the records due for extending. A grant is
    /// written once it has been held for [`FLUSH_EVERY`] (`all`: at once, with every
    /// other change): one taken and given back sooner costs the store nothing.
    pub(super) async fn flush(&mut self, all: bool) {
        // Whoever waits for a grant posted before now is answered once this flush is
        // done (written, or failed: a grant is not held back longer than one try).
        let waiting = std::mem::take(&mut self.waiting);
        self.write(all).await;
        for done in waiting {
            let _ = done.send(());
        }
    }

    async fn write(&mut self, all: bool) {
        let now = Instant::now();
        if all || self.flush_at.is_some_and(|at| at <= now) {
            self.flush_at = None;
        }
        let due: HashSet<u64> = (self.refreshes.iter())
            .take_while(|(at, _)| *at <= now)
            .map(|(_, serial)| *serial)
            .collect();
        let mut serials: Vec<u64> = self.dirty.drain().chain(due.iter().copied()).collect();
        serials.sort_unstable();
        serials.dedup();
        let mut writes = Vec::new();
        // Per write: its session, and the keys it takes from the pending changes.
        let mut written: Vec<(u64, Vec<Arc<str>>)> = Vec::new();
        let mut creates = false;
        // The shortest TTL of the lines this flush lists: the attachment must not
        // outlive two fifths of it (see `Task::attachment_ttl`).
        let mut shortest: Option<Duration> = None;
        let mut young: Option<Instant> = None;
        for serial in serials {
            let Some(tracked) = self.tracked.get_mut(&serial) else {
                continue;
            };
            let Some(session) = tracked.session.clone() else {
                continue;
            };
            if tracked.foreign || (tracked.ended && tracked.listed.is_empty()) {
                // Nothing in the store (or not ours): nothing to write.
                self.forget_if_ended(serial);
                self.schedule_refresh(serial);
                continue;
            }
            let mut write = RecordWrite {
                session_id: session.id.clone(),
                secret: session.secret.clone(),
                client_name: session.client_name.clone(),
                sidecar: self.sidecar.clone(),
                end: tracked.ended,
                listed: !tracked.listed.is_empty(),
                ttl: record_ttl(tracked.longest_ttl()),
                spent: session.resumed,
                ..RecordWrite::default()
            };
            let mut taken = Vec::new();
            let mut deferred = false;
            // A write with no line extends the record (its TTL only: a record the
            // store lost answers Missing and is written again whole).
            let extends = due.contains(&serial) && !tracked.listed.is_empty();
            let ready = |since: Instant| all || since + FLUSH_EVERY <= now;
            // A young removal rides along with whatever of its session is written
            // now; alone, it waits for its window. Written by any flush, as before,
            // the removals of every session went whenever one session's new grant was
            // written, and each of those sessions' next grants then waited for a write
            // of its own: two record writes and one more round trip per handoff.
            let rides = extends || tracked.pending.values().any(|(_, since)| ready(*since));
            if !tracked.ended {
                for (key, (line, since)) in &tracked.pending {
                    if !ready(*since) && (line.is_some() || !rides) {
                        let at = *since + FLUSH_EVERY;
                        young = Some(young.map_or(at, |y| y.min(at)));
                        deferred = true;
                        continue;
                    }
                    match line {
                        Some(line) => {
                            shortest = Some(shortest.map_or(line.ttl, |s| s.min(line.ttl)));
                            write.set.push((key.to_string(), line.clone()));
                        }
                        None => {
                            // The grant whose line goes (any, if none is known).
                            let grant = tracked.listed.get(key).map_or(u64::MAX, |l| l.grant);
                            write.remove.push((key.to_string(), grant));
                        }
                    }
                    taken.push(key.clone());
                }
            }
            if deferred {
                self.dirty.insert(serial);
            }
            if !write.end && write.set.is_empty() && write.remove.is_empty() && !extends {
                self.schedule_refresh(serial);
                continue;
            }
            creates |= tracked.listed.is_empty() && !write.set.is_empty();
            writes.push(write);
            written.push((serial, taken));
        }
        if let Some(ready) = young {
            self.flush_at = Some(self.flush_at.map_or(ready, |at| at.min(ready)));
        }
        if writes.is_empty() {
            return;
        }
        // The attachment exists before a record names this sidecar: else a resume
        // elsewhere could take a session that is still attached here. A line of a
        // shorter TTL than the attachment allows shortens it now, not at its refresh.
        let shorter = shortest.is_some_and(|ttl| ttl * 2 / 5 < self.attached_ttl);
        let unattached = creates && self.attach_at.is_none();
        if unattached || shorter {
            let attached = self.attach().await;
            if unattached && !attached {
                self.dirty
                    .extend(written.into_iter().map(|(serial, _)| serial));
                self.flush_at = Some(now + RETRY);
                return;
            }
        }
        let (answers, error) = match self.store.record(&writes).await {
            Ok(answers) if answers.len() == writes.len() => (answers, None),
            Ok(_) => (vec![None; writes.len()], None),
            Err(e) => (vec![None; writes.len()], Some(e)),
        };
        let failed = answers.iter().filter(|a| a.is_none()).count();
        self.failing.records(failed, writes.len(), error.as_ref());
        let mut retry = false;
        for (((serial, taken), write), answer) in written.into_iter().zip(&writes).zip(answers) {
            let Some(tracked) = self.tracked.get_mut(&serial) else {
                continue;
            };
            match answer {
                Some(Recorded::Written) => {
                    // Nothing changed `pending` while the call ran (this task made
                    // it): each change taken is the one written.
                    for key in taken {
                        match tracked.pending.remove(&key) {
                            Some((Some(line), _)) => {
                                tracked.listed.insert(key, line);
                            }
                            Some((None, _)) => {
                                tracked.listed.remove(&key);
                            }
                            None => {}
                        }
                    }
                    shrink(&mut tracked.pending);
                    shrink(&mut tracked.listed);
                }
                Some(Recorded::Missing) => {
                    // Gone from the store, and nothing written: every listed line is a
                    // change to write again (a change not written yet, this write's
                    // among them, stays the newer one).
                    tracing::info!(session = %write.session_id, "the session's record was gone; writing it again");
                    let written_at = now.checked_sub(FLUSH_EVERY).unwrap_or(now);
                    for (key, line) in tracked.listed.drain() {
                        tracked
                            .pending
                            .entry(key)
                            .or_insert((Some(line), written_at));
                    }
                    retry = true;
                    self.dirty.insert(serial);
                }
                Some(Recorded::Foreign) => {
                    // Resumed elsewhere: this sidecar's copy of the session is a
                    // zombie, and its grants were re-keyed away from it.
                    tracing::info!(session = %write.session_id, "the session was resumed on another sidecar");
                    tracked.foreign = true;
                    tracked.listed.clear();
                    tracked.pending.clear();
                }
                None => {
                    retry = true;
                    self.dirty.insert(serial);
                }
            }
            if tracked.ended && (answer.is_some() || tracked.foreign) {
                self.forget_if_ended(serial);
            } else {
                self.schedule_refresh(serial);
            }
        }
        if retry {
            self.flush_at.get_or_insert(Instant::now() + RETRY);
        }
    }

    fn forget_if_ended(&mut self, serial: u64) {
        if self.tracked.get(&serial).is_some_and(|t| t.ended)
            && let Some(tracked) = self.tracked.remove(&serial)
            && let Some(at) = tracked.refresh_at
        {
            self.refreshes.remove(&(at, serial));
        }
    }
}

/// Gives back most of a map's table once it holds far fewer entries than it has room
/// for: a hash table never shrinks by itself, and a session that took 1,000 locks at
/// once would keep a 2,048-bucket table of pending changes for as long as it lives.
fn shrink<K: Eq + Hash, V>(map: &mut HashMap<K, V>) {
    if map.capacity() > 4 * map.len() + 16 {
        map.shrink_to_fit();
    }
}

/// How long a record lives after a write: at least [`RESUMABLE_FOR`] or three of its
/// longest TTL (whichever is longer) after its sidecar died, so that a session whose
/// locks all expired can still be resumed and learn `Lost` for each of them rather
/// than be refused; it is extended every longest TTL, hence one more of it.
fn record_ttl(longest: Duration) -> Duration {
    let longest = longest.max(Duration::from_secs(1));
    RESUMABLE_FOR.max(longest * 3) + longest
}

/// The least time a session can be resumed for after its sidecar died.
const RESUMABLE_FOR: Duration = Duration::from_secs(30);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_outlives_its_sidecar_by_thirty_seconds_or_three_ttls() {
        let s = Duration::from_secs;
        assert_eq!(record_ttl(s(10)), s(40));
        assert_eq!(record_ttl(s(1)), s(31));
        assert_eq!(record_ttl(s(60)), s(240));
    }
}
