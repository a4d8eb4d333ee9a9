//! One renewer per sidecar. It renews every grant of every session about every TTL/3,
//! in batches: at each tick it takes every grant due within half a renewal period and
//! sends them all in one store call (one round trip, whatever the number of locks).
//!
//! A successful renewal moves the grant's [`LeaseClock`] forward without waking its
//! session; sessions hear from the renewer only on transitions: renewals failing
//! (Jeopardy), succeeding again (Restored), or the store no longer holding the grant.
//! The renewer never decides that a lock is lost by time: the session's own deadline
//! timer does, so a renewal stuck in a slow store cannot delay a `Lost`.
//!
//! The renewer hears of a grant only when it would first renew it: sessions post their
//! grants in a [`Mailbox`] that wakes the renewer only for a grant due before the time
//! it armed, and give a grant up by marking its [`LeaseClock`] released, which wakes
//! no one. A grant taken and given back within TTL/3, the common case, costs the
//! renewer one look at its mark; a released grant is never renewed again (a renewal
//! already under way when it is released is undone).
//!
//! The store answers per grant: only the grants whose part of the batch failed (a
//! frozen Cluster node, too few Redlock masters) go failing and are retried soon; the
//! rest of the batch is renewed as usual.
//!
//! Files: this one has the handle and the task; `clock.rs` a grant's [`LeaseClock`].

mod clock;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::mailbox::Mailbox;
use super::session::Note;
use crate::metrics::{Metrics, Renewed as Counted};
use crate::store::drift_margin;
use crate::store::{Renewal, Renewed, Store, StoreError};
pub(crate) use clock::LeaseClock;

/// Shortest pause before retrying a failed renewal.
const MIN_RETRY: Duration = Duration::from_millis(50);

/// What the renewer tells a session about one of its grants (its lease id and key: the
/// session finds the grant by its key, so it keeps no map of lease ids).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RenewEvent {
    /// A renewal failed after the previous one succeeded.
    Failing(u64, Arc<str>),
    /// A renewal succeeded after failures.
    Restored(u64, Arc<str>),
    /// The store no longer holds the grant.
    NotHeld(u64, Arc<str>),
}

/// A grant to keep alive. Its key and owner are the session's own strings, shared: at
/// 100,000 grants each copy would cost about 10 MB.
pub(crate) struct Renewable {
    pub(crate) id: u64,
    pub(crate) key: Arc<str>,
    pub(crate) owner: Arc<str>,
    pub(crate) ttl: Duration,
    /// When the write that last confirmed the grant was sent.
    pub(crate) confirmed_at: Instant,
    pub(crate) clock: Arc<LeaseClock>,
    pub(crate) events: mpsc::UnboundedSender<Note>,
}

/// Handle to the renewer task.
#[derive(Clone)]
pub(crate) struct Renewer {
    mailbox: Arc<Mailbox<Renewable>>,
    /// Ends the task when the last handle goes (an engine dropped without a shutdown).
    _alive: Arc<DropGuard>,
}

/// Grants the mailbox holds before it drops those released while waiting (see
/// [`Mailbox::post_compacting`]).
const MAILBOX_FLOOR: usize = 64;

impl Renewer {
    pub(crate) fn spawn(
        store: Arc<dyn Store>,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
        drift: f64,
    ) -> Self {
        let mailbox = Arc::new(Mailbox::new());
        let alive = CancellationToken::new();
        tokio::spawn(
            Task {
                store,
                metrics,
                drift,
                mailbox: mailbox.clone(),
                entries: HashMap::new(),
                schedule: BTreeMap::new(),
                ttls: BTreeMap::new(),
            }
            .run(shutdown, alive.clone()),
        );
        Self {
            mailbox,
            _alive: Arc::new(alive.drop_guard()),
        }
    }

    /// Hands the renewer a grant. It reads it at its first renewal, TTL/3 after the
    /// write that confirmed it, and is woken now only if that is earlier than the time
    /// it armed; a grant released before then ([`LeaseClock::release`]) costs it
    /// nothing more than being dropped.
    pub(crate) fn add(&self, lease: Renewable) {
        let due = lease.confirmed_at + period(lease.ttl);
        (self.mailbox).post_compacting(lease, due, MAILBOX_FLOOR, |l| !l.clock.released());
    }
}

/// One grant as the renewer keeps it: a [`Renewable`] without its `id` (the map's key)
/// and `confirmed_at` (read once, for the first `due`). At 100,000 grants the map has
/// 131,072 buckets: every byte of an entry costs 128 KB.
struct Entry {
    key: Arc<str>,
    owner: Arc<str>,
    ttl: Duration,
    clock: Arc<LeaseClock>,
    events: mpsc::UnboundedSender<Note>,
    due: Instant,
    failing: bool,
}

impl Entry {
    fn event(&self, id: u64, event: fn(u64, Arc<str>) -> RenewEvent) {
        let _ = self.events.send(Note::Renew(event(id, self.key.clone())));
    }
}

fn period(ttl: Duration) -> Duration {
    ttl / 3
}

struct Task {
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    /// The configured clock drift (`EngineConfig::clock_drift`).
    drift: f64,
    /// Grants handed over since the last look (see [`Renewer::add`]).
    mailbox: Arc<Mailbox<Renewable>>,
    entries: HashMap<u64, Entry>,
    /// Every entry by when it is due, with its TTL: a tick decides which grants to
    /// renew from here alone, without reading the entries (at 100,000 grants each read
    /// is a cache miss).
    schedule: BTreeMap<(Instant, u64), Duration>,
    /// How many entries have each TTL: the longest tells [`Task::tick`] how far ahead
    /// of now a grant can be due and still be renewed early (half its period).
    ttls: BTreeMap<Duration, usize>,
}

impl Task {
    async fn run(mut self, shutdown: CancellationToken, alive: CancellationToken) {
        loop {
            let own = self.schedule.first_key_value().map(|((due, _), _)| *due);
            let next = self.mailbox.arm(own);
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = alive.cancelled() => return,
                // A grant due before `next`: arm again.
                _ = self.mailbox.earlier() => {}
                _ = tokio::time::sleep_until(next.unwrap_or_else(Instant::now)), if next.is_some() => {
                    self.collect();
                    self.tick().await;
                }
            }
        }
    }

    /// Schedules the grants handed over since the last look, but those released
    /// meanwhile.
    fn collect(&mut self) {
        for lease in self.mailbox.take() {
            if lease.clock.released() {
                continue;
            }
            let due = lease.confirmed_at + period(lease.ttl);
            self.schedule.insert((due, lease.id), lease.ttl);
            *self.ttls.entry(lease.ttl).or_default() += 1;
            self.entries.insert(
                lease.id,
                Entry {
                    key: lease.key,
                    owner: lease.owner,
                    ttl: lease.ttl,
                    clock: lease.clock,
                    events: lease.events,
                    due,
                    failing: false,
                },
            );
        }
    }

    /// Takes an entry out of `entries` and its TTL out of `ttls` (not out of the
    /// schedule: the caller knows whether it is there).
    fn forget(&mut self, id: u64) -> Option<Entry> {
        let entry = self.entries.remove(&id)?;
        if let Some(n) = self.ttls.get_mut(&entry.ttl) {
            *n -= 1;
            if *n == 0 {
                self.ttls.remove(&entry.ttl);
            }
        }
        Some(entry)
    }

    /// Renews every grant due within half its renewal period, in one store call.
    async fn tick(&mut self) {
        let now = Instant::now();
        // No grant due later than half the longest period from now can be renewed
        // early: the walk stops there rather than going through every grant on every
        // tick (with one TTL for all, it reads exactly the grants it renews).
        let horizon = now
            + self
                .ttls
                .last_key_value()
                .map_or(Duration::ZERO, |(ttl, _)| period(*ttl) / 2);
        let mut ids = Vec::new();
        for (&(due, id), &ttl) in &self.schedule {
            if due > horizon {
                break;
            }
            if due <= now + period(ttl) / 2 {
                ids.push((due, id));
            }
        }
        for slot in &ids {
            self.schedule.remove(slot);
        }
        // Grants released since they were scheduled are forgotten here, unrenewed:
        // their sessions never woke the renewer to say so.
        let mut released = Vec::new();
        ids.retain(|(_, id)| match self.entries.get(id) {
            Some(e) if !e.clock.released() => true,
            Some(_) => {
                released.push(*id);
                false
            }
            None => false,
        });
        for id in released {
            self.forget(id);
        }
        let sent_at = Instant::now();
        let result = {
            // Every id left has its entry (checked just above).
            let batch: Vec<Renewal<'_>> = (ids.iter())
                .filter_map(|(_, id)| self.entries.get(id))
                .map(|e| Renewal {
                    key: &e.key,
                    owner: &e.owner,
                    ttl: e.ttl,
                })
                .collect();
            self.store.renew(&batch).await
        };
        let done = Instant::now();
        self.metrics
            .renewal_time
            .observe((done - sent_at).as_secs_f64());
        let answers = match result {
            Ok(answers) if answers.len() == ids.len() => answers,
            Ok(answers) => {
                let e = StoreError::Protocol(format!(
                    "{} renewal answers for a batch of {}",
                    answers.len(),
                    ids.len()
                ));
                vec![Renewed::Failed(Arc::new(e)); ids.len()]
            }
            Err(e) => vec![Renewed::Failed(Arc::new(e)); ids.len()],
        };
        self.count(&answers);
        for ((_, id), renewed) in ids.iter().zip(answers) {
            let Some(entry) = self.entries.get_mut(id) else {
                continue;
            };
            // Released while the call ran: the session hears nothing more of it, and a
            // renewal that landed is undone. A clock not released takes the extension.
            let ttl = entry.ttl;
            let released = match renewed {
                Renewed::Extended => {
                    !(entry.clock).extend(sent_at + ttl - drift_margin(ttl, self.drift))
                }
                _ => entry.clock.released(),
            };
            if released {
                if let Some(entry) = self.forget(*id)
                    && matches!(renewed, Renewed::Extended)
                {
                    self.undo(&entry);
                }
                continue;
            }
            match renewed {
                Renewed::Extended => {
                    entry.due = sent_at + period(ttl);
                    if entry.failing {
                        entry.failing = false;
                        entry.event(*id, RenewEvent::Restored);
                    }
                    self.schedule.insert((entry.due, *id), ttl);
                }
                Renewed::NotHeld => {
                    entry.event(*id, RenewEvent::NotHeld);
                    self.forget(*id);
                }
                // Only the grants whose part of the batch failed (one frozen Cluster
                // node, too few Redlock masters) are in jeopardy; the others go on.
                Renewed::Failed(e) => {
                    if !entry.failing {
                        tracing::warn!(key = %entry.key, error = %e, "renewal failed; retrying");
                        entry.failing = true;
                        entry.event(*id, RenewEvent::Failing);
                    }
                    entry.due = done + (ttl / 20).max(MIN_RETRY);
                    self.schedule.insert((entry.due, *id), ttl);
                }
            }
        }
    }

    /// Counts a batch's answers in the metrics: each failure once per store error (a
    /// failed node's chunk shares one), not once per grant.
    fn count(&self, answers: &[Renewed]) {
        // Failed calls themselves are counted by the metered store; these count grants.
        let mut counts = [0u64; 3];
        for answer in answers {
            match answer {
                Renewed::Extended => counts[0] += 1,
                Renewed::NotHeld => counts[1] += 1,
                Renewed::Failed(_) => counts[2] += 1,
            }
        }
        self.metrics.renewed(Counted::Ok, counts[0]);
        self.metrics.renewed(Counted::NotHeld, counts[1]);
        self.metrics.renewed(Counted::Failed, counts[2]);
    }

    /// Releases a grant whose renewal landed after its session dropped it, so the
    /// store does not keep it for a whole TTL.
    fn undo(&self, entry: &Entry) {
        super::release_in_background(&self.store, entry.key.to_string(), entry.owner.to_string());
    }
}

#[cfg(test)]
mod tests;
