//! The journal: one task per sidecar that keeps its sessions' records in the store
//! (`store/sessions.rs`), off the hot path, so that a session can be resumed on another
//! sidecar if this one dies.
//!
//! Sessions tell the journal when a grant is handed out, when a lock leaves them and
//! when they end; the journal gathers the changes and writes a grant once it has been
//! held for [`FLUSH_EVERY`], all sessions' writes of a flush in one store call
//! (pipelined). A lock granted and released within that time costs the store nothing,
//! and a session that never holds a lock writes nothing. The price: a lock granted
//! less than about twice that before the sidecar died may be missing from the record;
//! a resumed client treats a lock it held that did not come back as lost.
//!
//! While some session of this sidecar has a record, the journal keeps the sidecar's
//! attachment alive (refreshed every third of its TTL), written before the first record
//! names the sidecar; an idle sidecar writes nothing. Each record lives twice its
//! longest lock TTL and is extended every such TTL, so it outlives every lock it lists.
//!
//! This file has the handle and the task's loop (what it tracks, when it writes);
//! `flush.rs` turns the gathered changes into record writes and reads the answers.

mod flush;
#[cfg(test)]
mod tests;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::store::{RecordLine, Store};

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
}

/// Keys are the session's own (`Arc<str>`): the journal lists every held lock, and a
/// copy of each key would cost as much as the session's.
enum Entry {
    Granted(Arc<SessionRef>, Arc<str>, RecordLine),
    Dropped(Arc<SessionRef>, Arc<str>),
    Ended(Arc<SessionRef>),
    /// A resumed session: the store's record lists these and is already this
    /// sidecar's.
    Adopted(Arc<SessionRef>, Vec<(String, RecordLine)>),
    Flush(oneshot::Sender<()>),
}

/// The handle sessions use. Does nothing on a store that keeps no session records.
#[derive(Clone, Debug)]
pub(crate) struct Journal {
    tx: Option<mpsc::UnboundedSender<Entry>>,
}

impl Journal {
    /// Spawns the journal of sidecar `sidecar` on `store`; its attachment lives
    /// `attachment`.
    pub(crate) fn spawn(store: Arc<dyn Store>, sidecar: String, attachment: Duration) -> Self {
        if !store.keeps_sessions() {
            return Self { tx: None };
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let task = Task {
            store,
            sidecar,
            attachment,
            rx,
            tracked: HashMap::new(),
            refreshes: BTreeSet::new(),
            dirty: HashSet::new(),
            flush_at: None,
            attach_at: None,
        };
        tokio::spawn(task.run());
        Self { tx: Some(tx) }
    }

    fn send(&self, entry: Entry) {
        if let Some(tx) = &self.tx {
            // The task lives as long as any sender: it cannot be gone.
            let _ = tx.send(entry);
        }
    }

    /// A grant was handed out.
    pub(crate) fn granted(&self, session: &Arc<SessionRef>, key: Arc<str>, line: RecordLine) {
        self.send(Entry::Granted(session.clone(), key, line));
    }

    /// A lock left the session (released, lost).
    pub(crate) fn dropped(&self, session: &Arc<SessionRef>, key: Arc<str>) {
        self.send(Entry::Dropped(session.clone(), key));
    }

    /// The session ended: its record goes.
    pub(crate) fn ended(&self, session: &Arc<SessionRef>) {
        self.send(Entry::Ended(session.clone()));
    }

    /// A resumed session, whose record lists `lines` and names this sidecar.
    pub(crate) fn adopted(&self, session: &Arc<SessionRef>, lines: Vec<(String, RecordLine)>) {
        self.send(Entry::Adopted(session.clone(), lines));
    }

    /// Writes every change made so far, then completes (at shutdown, once every
    /// session has ended: their records go with them).
    pub(crate) async fn flush(&self) {
        let (done, flushed) = oneshot::channel();
        self.send(Entry::Flush(done));
        let _ = flushed.await;
    }
}

/// One session's record as the journal knows it.
#[derive(Default)]
struct Tracked {
    session: Option<Arc<SessionRef>>,
    /// What the store's record lists (as far as the journal knows).
    listed: HashMap<Arc<str>, RecordLine>,
    /// Changes not written yet: a line to list (with when it was granted), or `None`
    /// to take the key off. Emptied by a flush, it gives its table back (`flush.rs`).
    pending: HashMap<Arc<str>, Option<(RecordLine, Instant)>>,
    ended: bool,
    /// The record is another generation's: never written again.
    foreign: bool,
    /// When the record's TTL is next extended (in `Task::refreshes`).
    refresh_at: Option<Instant>,
}

impl Tracked {
    /// The longest TTL of the locks listed or about to be.
    fn longest_ttl(&self) -> Duration {
        let pending = self.pending.values().flatten().map(|(line, _)| line);
        (self.listed.values().chain(pending))
            .map(|l| l.ttl)
            .max()
            .unwrap_or_default()
    }

    /// Whether the store has, or is about to have, a record of this session.
    fn has_record(&self) -> bool {
        !self.foreign && (!self.listed.is_empty() || self.pending.values().any(Option::is_some))
    }
}

struct Task {
    store: Arc<dyn Store>,
    sidecar: String,
    attachment: Duration,
    rx: mpsc::UnboundedReceiver<Entry>,
    tracked: HashMap<u64, Tracked>,
    /// Records to extend, by when.
    refreshes: BTreeSet<(Instant, u64)>,
    /// Sessions with changes not written yet.
    dirty: HashSet<u64>,
    /// When gathered changes are written (`None`: none gathered).
    flush_at: Option<Instant>,
    /// When the attachment is written next (`None`: not written yet, or no record).
    attach_at: Option<Instant>,
}

impl Task {
    async fn run(mut self) {
        loop {
            let next = [
                self.flush_at,
                self.attach_at,
                self.refreshes.first().map(|(at, _)| *at),
            ]
            .into_iter()
            .flatten()
            .min();
            tokio::select! {
                entry = self.rx.recv() => match entry {
                    Some(Entry::Flush(done)) => {
                        self.flush(true).await;
                        let _ = done.send(());
                    }
                    Some(entry) => self.apply(entry),
                    None => {
                        self.flush(true).await;
                        return;
                    }
                },
                _ = tokio::time::sleep_until(next.unwrap_or_else(Instant::now)), if next.is_some() => {
                    self.tick().await;
                }
            }
        }
    }

    fn apply(&mut self, entry: Entry) {
        let (session, change) = match entry {
            Entry::Granted(s, key, line) => (s, Some((key, Some(line)))),
            Entry::Dropped(s, key) => (s, Some((key, None))),
            Entry::Ended(s) => {
                if let Some(t) = self.tracked.get_mut(&s.serial) {
                    t.ended = true;
                    self.dirty.insert(s.serial);
                    self.flush_at.get_or_insert(Instant::now() + FLUSH_EVERY);
                }
                return;
            }
            Entry::Adopted(s, lines) => {
                let serial = s.serial;
                let tracked = self.tracked.entry(serial).or_default();
                tracked.session = Some(s);
                tracked
                    .listed
                    .extend(lines.into_iter().map(|(key, line)| (key.into(), line)));
                // The resume just wrote the attachment.
                self.attach_at
                    .get_or_insert(Instant::now() + self.attachment / 3);
                self.schedule_refresh(serial);
                return;
            }
            Entry::Flush(_) => return,
        };
        let Some((key, line)) = change else { return };
        let serial = session.serial;
        let tracked = self.tracked.entry(serial).or_default();
        tracked.session.get_or_insert(session);
        if tracked.foreign {
            return;
        }
        match line {
            Some(line) => {
                tracked.pending.insert(key, Some((line, Instant::now())));
            }
            None if tracked.listed.contains_key(&key) => {
                tracked.pending.insert(key, None);
            }
            // Granted and dropped within one window: the store never hears of it.
            None => {
                tracked.pending.remove(&key);
            }
        }
        self.dirty.insert(serial);
        self.flush_at.get_or_insert(Instant::now() + FLUSH_EVERY);
    }

    /// Whether some session of this sidecar has (or is about to have) a record.
    fn needs_attachment(&self) -> bool {
        self.tracked.values().any(|t| !t.ended && t.has_record())
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

    /// Writes the attachment; schedules the next write.
    async fn attach(&mut self) -> bool {
        match self.store.attach(&self.sidecar, self.attachment).await {
            Ok(()) => {
                self.attach_at = Some(Instant::now() + self.attachment / 3);
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "writing this sidecar's attachment failed; retrying");
                self.attach_at = Some(Instant::now() + RETRY);
                false
            }
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
