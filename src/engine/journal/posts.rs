//! What sessions post, applied: grants (written at once, or told at once when the
//! record names them already or the store listed them), grants that left, sessions
//! that ended or were resumed, and flushes asked for.

use std::sync::Arc;

use tokio::time::Instant;

use super::{Entry, FLUSH_EVERY, SessionRef, Task};
use crate::store::RecordLine;

impl Task {
    /// Applies what sessions posted, in order; a flush asked for is done at once.
    pub(super) async fn collect(&mut self) {
        let mut flushed = Vec::new();
        for entry in self.mailbox.take() {
            match entry {
                Entry::Flush(done) => flushed.push(done),
                entry => self.apply(entry),
            }
        }
        if !flushed.is_empty() {
            self.flush(true).await;
            for done in flushed {
                let _ = done.send(());
            }
        }
    }

    pub(super) fn apply(&mut self, entry: Entry) {
        let (session, change, at) = match entry {
            Entry::Granted(s, key, line, done) => {
                let now = Instant::now();
                let listed = (self.tracked.get(&s.serial))
                    .is_some_and(|t| t.foreign || t.listed.contains_key(&key));
                if listed {
                    // The store's record names the key already (an earlier grant of it,
                    // its removal not written yet): a resume finds this grant by the
                    // owner's prefix (`lua/rekey.lua`). Told now; the line is brought up
                    // to date with the next window's writes.
                    let _ = done.send(());
                    (s, Some((key, Some(line))), now)
                } else {
                    // Written at the next flush, now: as if held for the window already.
                    self.flush_at = Some(now);
                    self.waiting.push(done);
                    let at = now.checked_sub(FLUSH_EVERY).unwrap_or(now);
                    (s, Some((key, Some(line))), at)
                }
            }
            Entry::Listed(s, key, line) => return self.listed(s, key, line),
            Entry::Dropped(s, key, at) => (s, Some((key, None)), at),
            Entry::Ended(s, at) => {
                if let Some(t) = self.tracked.get_mut(&s.serial) {
                    t.ended = true;
                    self.dirty.insert(s.serial);
                    self.flush_soon(at);
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
                // The resume just wrote the attachment (with the longest TTL allowed:
                // it knew no lock yet); shortened, if its locks say so, now.
                self.attached_ttl = self.attached_ttl.max(self.attachment);
                self.attach_at = Some(Instant::now());
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
                tracked.pending.insert(key, (Some(line), at));
            }
            None if tracked.listed.contains_key(&key) => {
                tracked.pending.insert(key, (None, at));
            }
            // Granted and dropped within one window: the store never hears of it.
            None => {
                tracked.pending.remove(&key);
            }
        }
        self.dirty.insert(serial);
        self.flush_soon(at);
    }

    /// The store listed a grant as it granted it: the record names it, nothing to write
    /// (a change of the key not written yet is outdated by it). A line that outlives
    /// the record's longest one has the record extended for it now, one that is shorter
    /// than the attachment allows shortens the attachment now (the store listed it only
    /// if the record lives three of its TTL: `lua/acquire.lua`).
    fn listed(&mut self, session: Arc<SessionRef>, key: Arc<str>, line: RecordLine) {
        let serial = session.serial;
        let tracked = self.tracked.entry(serial).or_default();
        tracked.session.get_or_insert(session);
        if tracked.foreign {
            return;
        }
        let longer = line.ttl > tracked.longest_ttl();
        let shorter = line.ttl * 2 / 5 < self.attached_ttl;
        tracked.pending.remove(&key);
        tracked.listed.insert(key, line);
        if longer {
            if let Some(at) = tracked.refresh_at.take() {
                self.refreshes.remove(&(at, serial));
            }
            let now = Instant::now();
            tracked.refresh_at = Some(now);
            self.refreshes.insert((now, serial));
        }
        if shorter {
            self.attach_at = Some(Instant::now());
        }
    }

    /// Gathered changes are written [`FLUSH_EVERY`] after the first one was made
    /// (`at`), unless a flush is already planned.
    fn flush_soon(&mut self, at: Instant) {
        self.flush_at.get_or_insert(at + FLUSH_EVERY);
    }
}
