//! One granted lock as the core keeps it (`LockCell`: its grant and its states), and
//! the Rust client's handles on it: [`LockGuard`] and [`Leader`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;

use crate::ClientError;
use crate::session::Session;

/// Where a held lock stands, as its client knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockState {
    /// Held: use it.
    Held,
    /// The stream to the sidecar broke: stop using the lock now. It becomes `Held`
    /// again if the resumed session lists it, `Lost` otherwise.
    Suspended,
    /// Gone, and why: never use it again.
    Lost(String),
}

/// Called after each change of a lock's state (suspended, restored, lost): how the
/// Python and Node packages hear of it. It runs on the client's I/O, with the session's
/// bookkeeping locked: it must only hand the news on (a queue, a wake-up).
pub type Listener = Arc<dyn Fn(&Arc<LockCell>) + Send + Sync>;

static NEXT_CELL: AtomicU64 = AtomicU64::new(1);

/// One grant of a key to a holder of a session: what the sidecar said of it, and its
/// state. The session changes it (with its bookkeeping locked); anyone may read it.
#[derive(Debug)]
pub struct LockCell {
    id: u64,
    key: String,
    holder: String,
    fencing_token: u64,
    ttl: Duration,
    hold_count: u32,
    session_id: String,
    /// The TTL the store keeps the lock for without renewals (asked, else the
    /// sidecar's default): once it has passed since a break, the store has let it go.
    pub(crate) ttl_asked: Duration,
    state: watch::Sender<LockState>,
    /// The application gave it back (or its client closed): nothing more to report.
    released: AtomicBool,
    /// Its holder's name was handed back to the session's names (`holders.rs`).
    pub(crate) name_returned: AtomicBool,
    /// How the stream broke, the last time it was suspended.
    suspended_why: std::sync::Mutex<String>,
}

impl LockCell {
    pub(crate) fn new(
        key: String,
        holder: String,
        granted: &lockside_proto::Granted,
        session_id: String,
        ttl_asked: Duration,
    ) -> Arc<Self> {
        let ttl = granted
            .ttl
            .and_then(|d| Duration::try_from(d).ok())
            .unwrap_or_default();
        Arc::new(Self {
            id: NEXT_CELL.fetch_add(1, Ordering::Relaxed),
            key,
            holder,
            fencing_token: granted.fencing_token,
            ttl,
            hold_count: granted.hold_count,
            session_id,
            ttl_asked,
            state: watch::channel(LockState::Held).0,
            released: AtomicBool::new(false),
            name_returned: AtomicBool::new(false),
            suspended_why: std::sync::Mutex::new(String::new()),
        })
    }

    /// A number of its own in the process (bindings find their objects by it).
    pub fn id(&self) -> u64 {
        self.id
    }
    /// The lock's key.
    pub fn key(&self) -> &str {
        &self.key
    }
    /// Who in the session holds it.
    pub fn holder(&self) -> &str {
        &self.holder
    }
    /// The fencing token of the grant.
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }
    /// The validity the sidecar reported with the grant.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }
    /// How many times the holder held the key after this grant.
    pub fn hold_count(&self) -> u32 {
        self.hold_count
    }
    /// The session that holds it (the same across a resume).
    pub fn session_id(&self) -> &str {
        &self.session_id
    }
    /// Where it stands now.
    pub fn state(&self) -> LockState {
        self.state.borrow().clone()
    }
    /// Its states as they change.
    pub fn states(&self) -> watch::Receiver<LockState> {
        self.state.subscribe()
    }
    /// Whether the application gave it back (or its client closed).
    pub fn released(&self) -> bool {
        self.released.load(Ordering::Relaxed)
    }
    /// Why it was lost, once it is.
    pub fn lost_reason(&self) -> Option<String> {
        match &*self.state.borrow() {
            LockState::Lost(why) => Some(why.clone()),
            _ => None,
        }
    }
    /// How the stream broke, while it is suspended.
    pub fn suspended_reason(&self) -> Option<String> {
        match &*self.state.borrow() {
            LockState::Suspended => self.suspended_why.lock().ok().map(|w| w.clone()),
            _ => None,
        }
    }
    /// Suspends it, saying how the stream broke; false when it was suspended (or lost).
    pub(crate) fn suspend(&self, why: &str) -> bool {
        if let Ok(mut w) = self.suspended_why.lock() {
            why.clone_into(&mut w);
        }
        self.set(LockState::Suspended)
    }
    pub(crate) fn is_lost(&self) -> bool {
        matches!(*self.state.borrow(), LockState::Lost(_))
    }
    pub(crate) fn mark_released(&self) {
        self.released.store(true, Ordering::Relaxed);
    }

    /// Changes the state (session bookkeeping locked); false when it was that already.
    pub(crate) fn set(&self, to: LockState) -> bool {
        self.state.send_if_modified(|state| {
            let change = match (&*state, &to) {
                (LockState::Lost(_), _) => false,
                (a, b) => a != b,
            };
            if change {
                *state = to.clone();
            }
            change
        })
    }
}

/// A held lock. Dropping it releases the lock.
#[derive(Debug)]
pub struct LockGuard {
    pub(crate) session: Arc<Session>,
    pub(crate) cell: Arc<LockCell>,
    pub(crate) done: bool,
}

impl LockGuard {
    /// The lock's key.
    pub fn key(&self) -> &str {
        self.cell.key()
    }

    /// The fencing token: pass it to the resource you protect.
    pub fn fencing_token(&self) -> u64 {
        self.cell.fencing_token()
    }

    /// Who in the client's session holds it (each `lock()` is a holder of its own).
    pub fn holder(&self) -> &str {
        self.cell.holder()
    }

    /// Where the lock stands now.
    pub fn state(&self) -> LockState {
        self.cell.state()
    }

    /// The lock's states as they change (a `tokio::sync::watch` receiver): suspended
    /// the moment the stream to the sidecar breaks, held again once the session is
    /// resumed with it, lost otherwise. Use the resource only while it is held.
    pub fn states(&self) -> watch::Receiver<LockState> {
        self.cell.states()
    }

    /// Whether the lock is suspended: the stream broke and it is not known yet whether
    /// the lock comes back. Do not use the resource now.
    pub fn is_suspended(&self) -> bool {
        self.cell.state() == LockState::Suspended
    }

    /// Whether the lock is already lost.
    pub fn is_lost(&self) -> bool {
        self.cell.is_lost()
    }

    /// Why the lock was lost (the `Lost` event's reason, or why the session could not
    /// be resumed), once it is.
    pub fn lost_reason(&self) -> Option<String> {
        self.cell.lost_reason()
    }

    /// Completes when the lock is lost (a `Lost` event, or a broken stream that could
    /// not be resumed with the lock). Stop using the resource then; stop already while
    /// it is suspended ([`LockGuard::states`]).
    pub async fn lost(&self) {
        let mut state = self.cell.states();
        let _ = state.wait_for(|s| matches!(s, LockState::Lost(_))).await;
    }

    /// Replaces the lock's value (`Describe` and `Watch` show it): a leader telling its
    /// followers where it now is, without giving up leadership. At most 4 KiB.
    pub async fn proclaim(&self, value: &[u8]) -> Result<(), ClientError> {
        self.session.proclaim(&self.cell, value.to_vec()).await
    }

    /// Releases the lock. Returns once the `Release` is on the session's stream: the
    /// sidecar orders whatever this process asks of the key later after it, and an
    /// error that comes later (the lock was lost meanwhile) is logged. `Lost` if the
    /// lock was lost before.
    pub async fn release(mut self) -> Result<(), ClientError> {
        self.done = true;
        self.session.release(&self.cell)
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.session.release(&self.cell);
        }
    }
}

/// Leadership of a key, from [`crate::Client::campaign`]: the lock the leader holds
/// (its methods: [`LockGuard::fencing_token`], [`LockGuard::proclaim`],
/// [`LockGuard::lost`]). Lead while it is held; when `lost()` completes, stop acting
/// as the leader at once: another candidate takes over. Dropping it, or
/// [`Leader::resign`], hands leadership to the next candidate.
#[derive(Debug)]
pub struct Leader(LockGuard);

impl Leader {
    pub(crate) fn new(lock: LockGuard) -> Self {
        Self(lock)
    }

    /// Gives up leadership.
    pub async fn resign(self) -> Result<(), ClientError> {
        self.0.release().await
    }

    /// The lock underneath, for code that takes any held lock.
    pub fn into_lock(self) -> LockGuard {
        self.0
    }
}

impl std::ops::Deref for Leader {
    type Target = LockGuard;

    fn deref(&self) -> &LockGuard {
        &self.0
    }
}
