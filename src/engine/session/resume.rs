//! A session's side of resuming: its token, what it tells the journal about its
//! grants, and a resumed session taking back the grants its record listed.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{Held, Session, Slot};
use crate::engine::journal::{FLUSH_EVERY, SessionRef};
use crate::engine::renewer::{LeaseClock, Renewable};
use crate::engine::{Event, ResumeToken, Shared, validate_holder, validate_key};
use crate::metrics::Loss;
use crate::store::{RecordLine, ResumedLock, drift_margin, names};

/// The reason of a `Lost` for a lock that did not survive until its session resumed.
const EXPIRED: &str = "the lock expired, or the store lost it, before the session was resumed";

impl Session {
    /// The session's resume token, when its store keeps session records.
    pub(super) fn resume_token(&self) -> Option<ResumeToken> {
        self.shared
            .store
            .resumes_sessions()
            .then(|| ResumeToken(format!("{}.{}", self.id, self.secret)))
    }

    /// Tells the journal that the grant `name` was made to `owner` (`session.secret.n`);
    /// the answer comes once the session's record names it (`None`: no record to wait
    /// for, or `listed`: the store listed it with the grant).
    pub(super) fn journal_granted(
        &mut self,
        name: &Arc<str>,
        owner: &str,
        ttl: Duration,
        fence: u64,
        listed: bool,
    ) -> Option<tokio::sync::oneshot::Receiver<()>> {
        let grant = owner.rsplit('.').next().and_then(|n| n.parse().ok())?;
        self.journaled = true;
        let line = RecordLine { grant, ttl, fence };
        self.shared
            .journal
            .granted(&self.record, name.clone(), line, listed)
    }

    /// Tells the journal that the grant `name` left the session.
    pub(super) fn journal_dropped(&mut self, name: Arc<str>) {
        let now = Instant::now();
        if self.dropped_at.len() >= 64 {
            self.dropped_at.retain(|_, at| *at + FLUSH_EVERY > now);
        }
        self.dropped_at.insert(name.clone(), now);
        self.shared.journal.dropped(&self.record, name);
    }

    /// The session, for an acquire of `name` that the store may list in its record as
    /// it grants it: once the session has a record, and unless the record still names
    /// `name` (given up within the journal's window: the journal tells such a grant at
    /// once, and listing it again would cost the store four calls for nothing).
    pub(super) fn lists(&self, name: &str) -> Option<Arc<SessionRef>> {
        let listed = (self.dropped_at.get(name)).is_some_and(|at| at.elapsed() < FLUSH_EVERY);
        (self.journaled && !listed).then(|| self.record.clone())
    }

    /// A resumed session: id `id`, new secret `secret`, holding again every grant of
    /// `locks` that survived. `sent_at` is when the resume was sent to the store: the
    /// re-keyed grants were extended by their TTL after it.
    pub(crate) fn resumed(
        shared: Arc<Shared>,
        client_name: String,
        out: mpsc::Sender<Event>,
        id: String,
        secret: String,
        sent_at: Instant,
        mut locks: Vec<ResumedLock>,
    ) -> Self {
        let mut session = Self::with_identity(shared, client_name, out, id, secret, true);
        // The client hears the locks it keeps first, then those it lost, by key.
        locks.sort_by(|a, b| (a.held.is_none(), &a.key).cmp(&(b.held.is_none(), &b.key)));
        // Past every grant number the session used: a line may name an earlier grant
        // of its key than the one held.
        let used = |l: &ResumedLock| l.held.as_ref().map_or(0, |g| g.grant).max(l.line.grant);
        session.grants = locks.iter().map(used).max().unwrap_or(0);
        session.journaled = !locks.is_empty();
        let listed = locks
            .iter()
            .map(|l| (l.key.clone(), l.line.clone()))
            .collect();
        session.shared.journal.adopted(&session.record, listed);
        for lock in locks {
            session.take_back(lock, sent_at);
        }
        session
    }

    /// Holds one resumed grant again, or says it is lost.
    fn take_back(&mut self, lock: ResumedLock, sent_at: Instant) {
        let ResumedLock {
            key: name,
            line,
            held,
        } = lock;
        let (key, holder) = names::split(&name);
        let (key, holder) = (key.to_owned(), holder.to_owned());
        let grant_number = held.as_ref().map_or(line.grant, |g| g.grant);
        let owner = format!("{}.{}.{}", self.id, self.secret, grant_number);
        let ttl = line.ttl;
        let margin = drift_margin(ttl, self.shared.config.clock_drift);
        let now = Instant::now();
        let valid_until = (sent_at + ttl).checked_sub(margin).unwrap_or(now);
        let grant = match held {
            Some(grant)
                if valid_until > now
                    && validate_key(&key).is_ok()
                    && validate_holder(&holder).is_ok()
                    && self.slots.len() < self.shared.config.max_locks_per_session =>
            {
                grant
            }
            other => {
                if other.is_some() {
                    // Answered too late to be safe (or not a lock this sidecar takes):
                    // let the others in now rather than at its expiry.
                    self.release_in_background(key.clone(), owner, ttl);
                }
                self.shared.metrics.lost(Loss::NotHeld);
                self.shared
                    .journal
                    .dropped(&self.record, name.as_str().into());
                self.greeting.push(Event::Lost {
                    key,
                    reason: EXPIRED.to_owned(),
                    fence: line.fence,
                    holder,
                });
                return;
            }
        };
        let lease_id = self.shared.next_lease_id();
        let clock = Arc::new(LeaseClock::new(valid_until));
        let (shared_name, owner): (Arc<str>, Arc<str>) = (name.as_str().into(), owner.into());
        self.shared.renewer.add(Renewable {
            id: lease_id,
            name: shared_name.clone(),
            owner: owner.clone(),
            ttl,
            confirmed_at: sent_at,
            clock: clock.clone(),
            events: self.notes_tx.clone(),
        });
        self.shared.metrics.locks_held.inc();
        self.watch_deadline(valid_until);
        self.slots.insert(
            shared_name,
            Slot::Held(Box::new(Held {
                lease_id,
                owner,
                fence: grant.fence,
                ttl,
                sharing: grant.sharing,
                limit: grant.limit,
                count: grant.count.max(1),
                clock,
                granted_at: now,
                jeopardy: false,
                busy: false,
                gone: false,
                queue: VecDeque::new(),
                value: Box::default(),
            })),
        );
        log!(self, DEBUG, %key, %holder, fence = grant.fence, "resumed");
        self.greeting.push(Event::Granted {
            request_id: 0,
            key,
            fence: grant.fence,
            ttl: Duration::ZERO,
            hold_count: grant.count.max(1),
            holder,
        });
    }

    /// Sends what a resumed session says right after `SessionStarted`: `Granted` with
    /// the validity left at the moment of sending, and `Lost`.
    pub(super) fn greet(&mut self) {
        for mut event in std::mem::take(&mut self.greeting) {
            if let Event::Granted {
                key, ttl, holder, ..
            } = &mut event
                && let Some(Slot::Held(h)) = self.slots.get(&*names::name(key, holder))
            {
                *ttl = h.clock.get().saturating_duration_since(Instant::now());
            }
            self.send(event);
        }
    }
}

/// 128 random bits in URL-safe base64 (22 characters): a secret as strong as 32 hex
/// digits in two thirds of the bytes, which every held lock carries in the store.
pub(crate) fn random_secret() -> Result<String, crate::engine::EngineError> {
    use base64::Engine as _;
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| crate::engine::EngineError::Random(e.to_string()))?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}
