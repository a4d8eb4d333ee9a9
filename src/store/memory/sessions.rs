//! Session records, attachments and resuming in the memory store: the rules of
//! `lua/record.lua`, `lua/resume.lua` and `lua/rekey.lua`, in one process. A sidecar
//! on the memory store that restarts has lost every lock and record, so its sessions
//! cannot be resumed; within one process (two engines on one store, as tests do) they
//! behave as on Redis.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::MemoryStore;
use crate::store::names;
use crate::store::{
    RecordLine, RecordWrite, Recorded, Refusal, ResumeClaim, ResumedGrant, ResumedLock, Resumption,
};

/// How often at most expired records and attachments are swept.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// One session's record.
#[derive(Debug)]
struct Record {
    /// The session's current secret (Redis keeps its SHA-1; this process keeps it).
    secret: String,
    /// The sidecar the session is attached to.
    sidecar: String,
    lines: HashMap<String, RecordLine>,
    expires: Instant,
    /// A spent mark (see [`RecordWrite::spent`]): no write or resume opens it.
    spent: bool,
}

/// Every record and attachment of the store.
#[derive(Debug, Default)]
pub(super) struct Sessions {
    records: HashMap<String, Record>,
    /// Sidecar id → until when it is attached.
    attached: HashMap<String, Instant>,
    last_sweep: Option<Instant>,
}

impl Sessions {
    fn sweep(&mut self, now: Instant) {
        if self.last_sweep.is_some_and(|t| now - t < SWEEP_EVERY) {
            return;
        }
        self.last_sweep = Some(now);
        self.records.retain(|_, r| r.expires > now);
        self.attached.retain(|_, until| *until > now);
    }

    /// The record of `session_id`, unless it expired.
    fn live(&mut self, session_id: &str, now: Instant) -> Option<&mut Record> {
        if self.records.get(session_id)?.expires <= now {
            self.records.remove(session_id);
            return None;
        }
        self.records.get_mut(session_id)
    }

    fn write(&mut self, write: &RecordWrite, now: Instant) -> Recorded {
        if self.live(&write.session_id, now).is_none() {
            if write.listed && !write.end {
                return Recorded::Missing;
            }
            if write.end || write.set.is_empty() {
                return Recorded::Written;
            }
            self.records.insert(
                write.session_id.clone(),
                Record {
                    secret: write.secret.clone(),
                    sidecar: write.sidecar.clone(),
                    lines: HashMap::new(),
                    expires: now,
                    spent: false,
                },
            );
        }
        let Some(record) = self.records.get_mut(&write.session_id) else {
            return Recorded::Written;
        };
        if record.spent || record.secret != write.secret {
            return Recorded::Foreign;
        }
        if !write.end {
            for (key, line) in &write.set {
                record.lines.insert(key.clone(), line.clone());
            }
            for (key, grant) in &write.remove {
                // A line of a later grant stays (as in `lua/record.lua`).
                if record
                    .lines
                    .get(key)
                    .is_some_and(|line| line.grant <= *grant)
                {
                    record.lines.remove(key);
                }
            }
        }
        // As in `lua/record.lua`: a resumed session's record leaves a mark no secret
        // opens when it ends, and stays (empty) when its last line goes.
        if write.end && write.spent {
            record.spent = true;
            record.lines.clear();
            record.expires = now + write.ttl;
        } else if write.end || (record.lines.is_empty() && !write.spent) {
            self.records.remove(&write.session_id);
        } else {
            record.expires = now + write.ttl;
        }
        Recorded::Written
    }
}

impl MemoryStore {
    fn sessions(&self) -> std::sync::MutexGuard<'_, Sessions> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn write_records(&self, writes: &[RecordWrite]) -> Vec<Option<Recorded>> {
        let now = Instant::now();
        let mut sessions = self.sessions();
        sessions.sweep(now);
        writes
            .iter()
            .map(|w| Some(sessions.write(w, now)))
            .collect()
    }

    pub(super) fn write_attachment(&self, sidecar: &str, ttl: Duration) {
        let now = Instant::now();
        let mut sessions = self.sessions();
        sessions.sweep(now);
        sessions.attached.insert(sidecar.to_owned(), now + ttl);
    }

    /// Checks and claims the record, then re-keys each lock it lists.
    pub(super) fn resume_session(&self, claim: &ResumeClaim) -> Resumption {
        let now = Instant::now();
        let lines = {
            let mut sessions = self.sessions();
            let Some(attached) = sessions
                .live(&claim.session_id, now)
                .filter(|r| !r.spent && r.secret == claim.secret)
                .map(|r| r.sidecar.clone())
            else {
                return Resumption::Refused(Refusal::Unknown);
            };
            // As on Redis: a record attached to the resuming sidecar itself is its
            // predecessor's.
            if attached != claim.sidecar
                && sessions.attached.get(&attached).is_some_and(|t| *t > now)
            {
                return Resumption::Refused(Refusal::Attached);
            }
            let Some(record) = sessions.records.get_mut(&claim.session_id) else {
                return Resumption::Refused(Refusal::Unknown);
            };
            record.secret = claim.new_secret.clone();
            record.sidecar = claim.sidecar.clone();
            record.lines.clone()
        };
        let locks = lines
            .into_iter()
            .map(|(key, line)| {
                let held = self.rekey(&key, claim, &line);
                ResumedLock { key, line, held }
            })
            .collect();
        Resumption::Claimed(locks)
    }

    /// Moves the session's grant of `key` (the name's holder; `line.grant`, or a later
    /// one: see [`ResumedGrant::grant`]) from the old secret (or, made again, the new
    /// one) to the new secret and extends it by its TTL (see `lua/rekey.lua`).
    fn rekey(&self, name: &str, claim: &ResumeClaim, line: &RecordLine) -> Option<ResumedGrant> {
        let (old, new) = claim.owner_prefixes();
        let holder_name = names::split(name).1;
        self.with_lock(names::key_of(name), |lock, now| {
            let (sharing, limit) = (lock.sharing?, lock.limit);
            let grant_of = |owner: &str| {
                let n = owner
                    .strip_prefix(&old)
                    .or_else(|| owner.strip_prefix(&new))?;
                n.parse::<u64>().ok()
            };
            let holder = lock
                .holders
                .iter_mut()
                .find(|h| h.holder == holder_name && grant_of(&h.owner).is_some())?;
            let grant = grant_of(&holder.owner).unwrap_or(line.grant);
            holder.owner = claim.new_owner(grant);
            holder.expires = now + line.ttl;
            Some(ResumedGrant {
                grant,
                count: holder.count,
                fence: holder.fence,
                sharing,
                limit,
                value: holder.value.clone(),
            })
        })
        .flatten()
    }
}
