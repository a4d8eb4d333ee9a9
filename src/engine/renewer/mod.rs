//! One renewer per sidecar. It renews every grant of every session about every TTL/3,
//! in batches: at each tick it takes every grant due within half a renewal period and
//! sends them all in one store call (which Redis cuts into script calls of 1,000 grants,
//! two in flight at a time). Grants renewed together are due together again, so the
//! schedule keeps them in groups by due time: a tick takes whole groups, and 100,000
//! locks cost it no map operation per grant.
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
//! Files: this one has the handle and the task; `tick.rs` one renewal round; `entry.rs`
//! a grant as it keeps it; `clock.rs` a grant's [`LeaseClock`];
//! `failing.rs` what the log says of failing renewals.

mod clock;
mod entry;
mod failing;
mod tick;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::mailbox::Mailbox;
use super::session::Note;
use crate::metrics::Metrics;
use crate::store::Store;
pub(crate) use clock::LeaseClock;
use entry::Entry;

/// Shortest pause before retrying a failed renewal.
const MIN_RETRY: Duration = Duration::from_millis(50);

/// What the renewer tells a session about one of its grants (its lease id and name: the
/// session finds the grant by its name, so it keeps no map of lease ids).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RenewEvent {
    /// A renewal failed after the previous one succeeded.
    Failing(u64, Arc<str>),
    /// A renewal succeeded after failures.
    Restored(u64, Arc<str>),
    /// The store no longer holds the grant.
    NotHeld(u64, Arc<str>),
}

/// A grant to keep alive. Its name (the key, and the holder inside the session:
/// `store::names`) and owner are the session's own strings, shared: at 100,000 grants
/// each copy would cost about 10 MB.
pub(crate) struct Renewable {
    pub(crate) id: u64,
    pub(crate) name: Arc<str>,
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
                hold_offs: store.hold_offs(),
                store,
                metrics,
                drift,
                mailbox: mailbox.clone(),
                schedule: BTreeMap::new(),
                ttls: BTreeMap::new(),
                failing: 0,
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

/// Waits for a hold-off to begin (`true`); `false` when the store can tell no more.
async fn began(hold_offs: &mut Option<tokio::sync::watch::Receiver<u64>>) -> bool {
    match hold_offs {
        Some(rx) => rx.changed().await.is_ok(),
        None => std::future::pending().await,
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
    /// Every grant, in groups by when it is due. The grants renewed in one batch are
    /// due again together (when they share a TTL, the common case): a tick takes whole
    /// groups and puts each renewed grant in one group again, so 100,000 locks make a
    /// few groups and a renewal costs no map operation per grant (a map entry per
    /// grant cost a `BTreeMap` and a `HashMap` operation each, most of them cache
    /// misses, and about 100 bytes).
    schedule: BTreeMap<Instant, Vec<Entry>>,
    /// How many grants have each TTL: the longest tells [`Task::tick`] how far ahead
    /// of now a grant can be due and still be renewed early (half its period).
    ttls: BTreeMap<Duration, usize>,
    /// How many grants' renewals are failing: the log tells when a streak of failures
    /// starts (none failed before) and when it ends (see `failing.rs`).
    failing: usize,
    /// Changes when the store lost its data and holds off new grants: every grant is
    /// renewed at once, so that those it lost are written back by their sessions well
    /// before the hold-off ends, whatever their TTL (`store/redis/restarts/`).
    hold_offs: Option<tokio::sync::watch::Receiver<u64>>,
}

impl Task {
    async fn run(mut self, shutdown: CancellationToken, alive: CancellationToken) {
        loop {
            let own = self.schedule.first_key_value().map(|(due, _)| *due);
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
                began = began(&mut self.hold_offs) => {
                    if !began {
                        self.hold_offs = None;
                        continue;
                    }
                    self.collect();
                    let now = Instant::now();
                    for entry in std::mem::take(&mut self.schedule).into_values().flatten() {
                        self.schedule(now, entry, 1);
                    }
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
            *self.ttls.entry(lease.ttl).or_default() += 1;
            let due = lease.confirmed_at + period(lease.ttl);
            let entry = Entry {
                id: lease.id,
                name: lease.name,
                owner: lease.owner,
                ttl: lease.ttl,
                clock: lease.clock,
                events: lease.events,
                failing: false,
            };
            // A new grant joins a group due a little earlier (by at most a sixteenth of
            // its period: renewed that much early) rather than make a group of its own:
            // 100,000 grants taken over a few seconds made as many one-grant vectors
            // (320 bytes each) until their first renewal.
            let joined = (due.checked_sub(period(lease.ttl) / 16))
                .and_then(|from| self.schedule.range(from..=due).next_back())
                .map_or(due, |(at, _)| *at);
            self.schedule(joined, entry, 1);
        }
    }

    /// Takes a forgotten grant's TTL out of `ttls`.
    fn forget(&mut self, entry: &Entry) {
        if entry.failing {
            self.failing = self.failing.saturating_sub(1);
        }
        if let Some(n) = self.ttls.get_mut(&entry.ttl) {
            *n -= 1;
            if *n == 0 {
                self.ttls.remove(&entry.ttl);
            }
        }
    }

    /// Takes out of the schedule every grant due within half its renewal period,
    /// forgetting those released since they were scheduled (their sessions never woke
    /// the renewer to say so).
    fn due(&mut self, now: Instant) -> Vec<Entry> {
        // No grant due later than half the longest period from now can be renewed
        // early: the walk stops there (with one TTL for all, it takes exactly the
        // groups it renews).
        let horizon = now
            + self
                .ttls
                .last_key_value()
                .map_or(Duration::ZERO, |(ttl, _)| period(*ttl) / 2);
        let mut due = Vec::new();
        let mut later = Vec::new();
        while let Some(group) = self.schedule.first_entry() {
            if *group.key() > horizon {
                break;
            }
            let (at, entries) = group.remove_entry();
            due.reserve(entries.len());
            for entry in entries {
                if entry.clock.released() {
                    self.forget(&entry);
                } else if at <= now + period(entry.ttl) / 2 {
                    due.push(entry);
                } else {
                    later.push((at, entry));
                }
            }
        }
        for (at, entry) in later {
            self.schedule(at, entry, 1);
        }
        due
    }

    /// Puts `entry` in the group due at `at`; a new group gets room for `room` grants
    /// (the rest of its batch, which mostly follows).
    fn schedule(&mut self, at: Instant, entry: Entry, room: usize) {
        (self.schedule.entry(at))
            .or_insert_with(|| Vec::with_capacity(room))
            .push(entry);
    }
}

#[cfg(test)]
mod tests;
