//! The journal: one task per sidecar that keeps its sessions' records in the store
//! (`store/sessions.rs`), off the hot path, so that a session can be resumed on another
//! sidecar if this one dies.
//!
//! Sessions tell the journal when a grant is handed out, when a lock leaves them and
//! when they end, by posts in a mailbox (`engine/mailbox.rs`). **No grant without a way
//! back:** a new grant is written at once, and its session tells its client `Granted`
//! only once the write is done ([`Journal::granted`] answers then), so that a sidecar
//! that dies right after a `Granted` leaves that lock resumable. Grants that arrive
//! while a flush is under way go together in the next one: under load one store call
//! (pipelined) carries many sessions' writes. A key the record names already (granted
//! before, its removal not written yet) is told at once: a resume finds the session's
//! grant of it by its owner's prefix, whatever grant the line names, and the line is
//! brought up to date in the background. Everything else (a lock that left, the end
//! of a session) is read [`FLUSH_EVERY`] after the first of it: a busy session wakes
//! the journal once per window for those, and a key given back and taken again within
//! it costs no write at all. A session that never holds a lock writes
//! nothing. When the records' writes fail (the store, or the master that holds them,
//! does not answer), grants are told at once rather than made to wait on them: until
//! the writes work again, a lock granted meanwhile may be missing from its record, and
//! a resumed client treats a lock that did not come back as lost.
//!
//! While some session of this sidecar has a record, the journal keeps the sidecar's
//! attachment alive (refreshed every third of its TTL), written before the first record
//! names the sidecar; an idle sidecar writes nothing. The attachment lives at most two
//! fifths of the shortest TTL of the locks its records list (and `--attachment-ttl`),
//! so that after this sidecar died another can resume its sessions within half of any
//! lock's TTL. Each record is extended every longest lock TTL and lives, after its sidecar
//! died, at least 30 s or three of that TTL (`flush.rs`): it outlives every lock it
//! lists, and a session whose locks expired can still be resumed to hear `Lost`.
//! An extension sends no line (one small call per session per TTL, whatever the number
//! of its locks); a record the store no longer has (expired in an outage, lost in a
//! restart) answers `Recorded::Missing`, and the journal writes every line again.
//!
//! This file has the handle and the task's loop (what it tracks, when it writes);
//! `flush.rs` turns the gathered changes into record writes and reads the answers;
//! `posts.rs` applies what sessions post; `attachment.rs` keeps the sidecar's attachment;
//! `tracked.rs` is a record as the journal knows it.

mod attachment;
mod flush;
mod posts;
#[cfg(test)]
mod tests;
mod tracked;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::mailbox::Mailbox;
use crate::store::{RecordLine, Store};
use tracked::Tracked;

/// How long changes gather before they are written.
pub(crate) const FLUSH_EVERY: Duration = Duration::from_millis(50);

/// Shortest pause before trying a failed attachment again.
const RETRY: Duration = Duration::from_millis(100);

/// A session as its record knows it. Shared by the session and its journal messages.
/// Not `Debug`: it holds the session's secret.
pub(crate) struct SessionRef {
    /// Tells apart sessions of one sidecar, even two generations of one session id.
    pub(crate) serial: u64,
    pub(crate) id: String,
    pub(crate) secret: String,
    pub(crate) client_name: String,
    /// A resumed session: a sidecar it left may still write its record under an old
    /// secret, so its record leaves a spent mark when it goes ([`RecordWrite::spent`]).
    pub(crate) resumed: bool,
}

/// Keys are the session's own (`Arc<str>`): the journal lists every held lock, and a
/// copy of each key would cost as much as the session's. The `Instant` is when the
/// session posted the change: the journal reads its mail up to [`FLUSH_EVERY`] later.
enum Entry {
    /// A grant, and who waits for it to be written.
    Granted(Arc<SessionRef>, Arc<str>, RecordLine, oneshot::Sender<()>),
    /// A grant the store listed in the session's record as it granted it.
    Listed(Arc<SessionRef>, Arc<str>, RecordLine),
    Dropped(Arc<SessionRef>, Arc<str>, Instant),
    Ended(Arc<SessionRef>, Instant),
    /// A resumed session: the store's record lists these and is already this
    /// sidecar's.
    Adopted(Arc<SessionRef>, Vec<(String, RecordLine)>),
    Flush(oneshot::Sender<()>),
}

/// The handle sessions use. Does nothing on a store that keeps no session records.
#[derive(Clone)]
pub(crate) struct Journal {
    mailbox: Option<Arc<Mailbox<Entry>>>,
    /// The records' writes fail now: a new grant is told at once rather than made to
    /// wait for the next try (which may be stuck behind a write to a frozen master).
    failing: Arc<AtomicBool>,
    /// Ends the task, after a last flush, when the last handle goes.
    _alive: Option<Arc<DropGuard>>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("keeps_records", &self.mailbox.is_some())
            .finish()
    }
}

impl Journal {
    /// Spawns the journal of sidecar `sidecar` on `store`; its attachment lives
    /// `attachment`.
    pub(crate) fn spawn(store: Arc<dyn Store>, sidecar: String, attachment: Duration) -> Self {
        if !store.resumes_sessions() {
            return Self {
                mailbox: None,
                failing: Arc::default(),
                _alive: None,
            };
        }
        let mailbox = Arc::new(Mailbox::new());
        let alive = CancellationToken::new();
        let failing = Arc::new(AtomicBool::new(false));
        let task = Task {
            store,
            sidecar,
            attachment,
            mailbox: mailbox.clone(),
            tracked: HashMap::new(),
            refreshes: BTreeSet::new(),
            dirty: HashSet::new(),
            flush_at: None,
            attach_at: None,
            attached_ttl: Duration::ZERO,
            failing: flush::Failing::new(failing.clone()),
            waiting: Vec::new(),
        };
        tokio::spawn(task.run(alive.clone()));
        Self {
            mailbox: Some(mailbox),
            failing,
            _alive: Some(Arc::new(alive.drop_guard())),
        }
    }

    /// Posts `entry`, to be read by `by`: the task is woken only if that is earlier
    /// than the time it armed (see `engine/mailbox.rs`).
    fn send(&self, entry: Entry, by: Instant) {
        if let Some(mailbox) = &self.mailbox {
            mailbox.post(entry, by);
        }
    }

    /// A grant was handed out: written at once. The answer comes once the session's
    /// record names it (or its write failed, or writes fail already); `None` on a store
    /// that keeps no records, and for a grant the store `listed` in the record as it
    /// granted it (`Store::acquire_listed`): nothing to write, and the journal reads
    /// the news with its next window's mail.
    pub(crate) fn granted(
        &self,
        session: &Arc<SessionRef>,
        key: Arc<str>,
        line: RecordLine,
        listed: bool,
    ) -> Option<oneshot::Receiver<()>> {
        let mailbox = self.mailbox.as_ref()?;
        if listed {
            let entry = Entry::Listed(session.clone(), key, line);
            mailbox.post(entry, Instant::now() + FLUSH_EVERY);
            return None;
        }
        let (done, written) = oneshot::channel();
        mailbox.post(
            Entry::Granted(session.clone(), key, line, done),
            Instant::now(),
        );
        (!self.failing.load(Ordering::Acquire)).then_some(written)
    }

    /// A lock left the session (released, lost).
    pub(crate) fn dropped(&self, session: &Arc<SessionRef>, key: Arc<str>) {
        let now = Instant::now();
        self.send(Entry::Dropped(session.clone(), key, now), now + FLUSH_EVERY);
    }

    /// The session ended: its record goes.
    pub(crate) fn ended(&self, session: &Arc<SessionRef>) {
        let now = Instant::now();
        self.send(Entry::Ended(session.clone(), now), now + FLUSH_EVERY);
    }

    /// A resumed session, whose record lists `lines` and names this sidecar.
    pub(crate) fn adopted(&self, session: &Arc<SessionRef>, lines: Vec<(String, RecordLine)>) {
        self.send(Entry::Adopted(session.clone(), lines), Instant::now());
    }

    /// Writes every change made so far, then completes (at shutdown, once every
    /// session has ended: their records go with them).
    pub(crate) async fn flush(&self) {
        let (done, flushed) = oneshot::channel();
        self.send(Entry::Flush(done), Instant::now());
        let _ = flushed.await;
    }
}

struct Task {
    store: Arc<dyn Store>,
    sidecar: String,
    attachment: Duration,
    /// What sessions posted since the last look.
    mailbox: Arc<Mailbox<Entry>>,
    tracked: HashMap<u64, Tracked>,
    /// Records to extend, by when.
    refreshes: BTreeSet<(Instant, u64)>,
    /// Sessions with changes not written yet.
    dirty: HashSet<u64>,
    /// When gathered changes are written (`None`: none gathered).
    flush_at: Option<Instant>,
    /// When the attachment is written next (`None`: not written yet, or no record).
    attach_at: Option<Instant>,
    /// The TTL the attachment was last written with.
    attached_ttl: Duration,
    /// The writes that fail and are retried, for the log (`flush.rs`).
    failing: flush::Failing,
    /// Sessions that wait for their grants to be written, answered after the next
    /// flush.
    waiting: Vec<oneshot::Sender<()>>,
}

impl Task {
    async fn run(mut self, alive: CancellationToken) {
        // Whether the last pass read at once; a time still due after it waits for the
        // timer, so that something always due cannot keep the thread spinning.
        let mut read_at_once = false;
        loop {
            let own = [
                self.flush_at,
                self.attach_at,
                self.refreshes.first().map(|(at, _)| *at),
            ]
            .into_iter()
            .flatten()
            .min();
            let next = self.mailbox.arm(own);
            let due = next.is_some_and(|at| at <= Instant::now());
            if due && !read_at_once && !alive.is_cancelled() {
                // Due now (a grant waits for its `Granted`): read at once. A timer would
                // wait for tokio's next millisecond tick: 0.5 ms per grant on average,
                // 1.1 ms measured, most of an uncontended cycle (1.7 ms, 0.44 ms
                // without it).
                read_at_once = true;
                self.collect().await;
                self.tick().await;
                continue;
            }
            read_at_once = false;
            tokio::select! {
                _ = alive.cancelled() => {
                    self.collect().await;
                    self.flush(true).await;
                    return;
                }
                // A post wanted before `next`: arm again.
                _ = self.mailbox.earlier() => {}
                _ = tokio::time::sleep_until(next.unwrap_or_else(Instant::now)), if next.is_some() => {
                    self.collect().await;
                    self.tick().await;
                }
            }
        }
    }

    async fn tick(&mut self) {
        let now = Instant::now();
        if self.attach_at.is_some_and(|at| at <= now) {
            self.attach_at = None;
            if self.needs_attachment() {
                self.attach().await;
            }
        }
        let refresh_due = self.refreshes.first().is_some_and(|(at, _)| *at <= now);
        if self.flush_at.is_some_and(|at| at <= now) || refresh_due {
            self.flush(false).await;
        }
    }

    fn schedule_refresh(&mut self, serial: u64) {
        let Some(tracked) = self.tracked.get_mut(&serial) else {
            return;
        };
        if let Some(at) = tracked.refresh_at.take() {
            self.refreshes.remove(&(at, serial));
        }
        if tracked.listed.is_empty() || tracked.foreign {
            return;
        }
        // The record lives twice its longest TTL: extended every TTL, it always
        // outlives its locks by at least one TTL.
        let at = Instant::now() + tracked.longest_ttl().max(Duration::from_secs(1));
        tracked.refresh_at = Some(at);
        self.refreshes.insert((at, serial));
    }
}
