//! One session: one `Lease` stream at a time and everything asked and held on it,
//! written once for every client on this core.
//!
//! - `mod.rs`: the session's state, its opening and its end.
//! - `acquire.rs`: taking a lock, and giving up on one that a caller stopped waiting for.
//! - `acquire_all.rs`: taking several keys at once (`AcquireAll`), all or none.
//! - `release.rs`: giving a lock back (without waiting for the answer), a proclaim,
//!   closing the session.
//! - `reader.rs`: the task that reads the stream and routes each message: answers to
//!   their requests by id, `Lost`, `Jeopardy` and `Restored` to the holder's grants.
//! - `resume.rs`: a broken stream: every lock suspended at once, the session resumed on
//!   a new stream or ended, each lock lost when the store has surely let it go.
//! - `reconcile.rs`: what a resumed session's greeting says, squared with what is
//!   held and asked here.
//!
//! Callers write to the stream themselves (with the bookkeeping locked); only the
//! reader reads it. A release returns once its `Release` is on the stream.

mod acquire;
mod acquire_all;
mod reader;
mod reconcile;
mod release;
mod resume;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use lockside_proto::lease_request::Command;
use lockside_proto::lease_response::Event;
use lockside_proto::{self as proto, LeaseRequest};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::Instant;

use crate::holders::Holders;
use crate::lock::{Listener, LockCell, LockState};
use crate::{ClientError, Grpc, releasing};

/// A holder and a key: reentrancy and every event are per (session, holder, key).
pub(crate) type SlotKey = (String, String);

static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

/// What a session needs of its client.
#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) resume: bool,
    pub(crate) listener: Option<Listener>,
}

/// Where a session stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Open,
    Resuming,
    Ended(String),
}

/// A request sent and not answered yet.
pub(crate) struct Pending {
    pub(crate) kind: Kind,
    pub(crate) key: String,
    pub(crate) holder: String,
    /// What was sent: a release or a proclaim goes again on a resumed stream.
    pub(crate) request: LeaseRequest,
    pub(crate) reply: Option<oneshot::Sender<Result<Answer, ClientError>>>,
    pub(crate) ttl_asked: Option<Duration>,
}

pub(crate) enum Kind {
    Acquire,
    /// A release of this grant (nobody waits for its answer).
    Release(Arc<LockCell>),
    Proclaim,
}

/// An answer as a waiting caller gets it.
pub(crate) enum Answer {
    Granted(Arc<LockCell>),
    /// The grants of an `AcquireAll`, one per key in the order asked.
    GrantedAll(Vec<Arc<LockCell>>),
    Other(Event),
}

/// The grants one holder has of one key (reentrant grants share the slot), those
/// given back and not answered yet included.
#[derive(Default)]
pub(crate) struct Slot {
    pub(crate) cells: Vec<Arc<LockCell>>,
    /// When the store lets the key go unless a renewal succeeds (`Jeopardy`).
    pub(crate) jeopardy_until: Option<Instant>,
}

pub(crate) struct State {
    pub(crate) phase: Phase,
    pub(crate) session_id: String,
    pub(crate) token: String,
    pub(crate) default_ttl: Duration,
    pub(crate) tx: mpsc::UnboundedSender<LeaseRequest>,
    pub(crate) next_id: u64,
    pub(crate) pending: BTreeMap<u64, Pending>,
    pub(crate) slots: HashMap<SlotKey, Slot>,
    pub(crate) holders: Holders,
    pub(crate) closing: bool,
}

impl State {
    pub(crate) fn id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Writes `command` to the stream; dropped unless the session is open (a resume
    /// sends again what was not answered).
    pub(crate) fn send(&self, command: Command) {
        if self.phase == Phase::Open {
            let _ = self.tx.send(LeaseRequest {
                command: Some(command),
            });
        }
    }
}

/// One session of a client.
pub struct Session {
    /// Its number in the process (the releases in flight are counted by it).
    pub(crate) number: u64,
    pub(crate) grpc: Grpc,
    pub(crate) settings: Settings,
    pub(crate) state: Mutex<State>,
    /// Woken when the session resumed or ended.
    pub(crate) settled: Notify,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("number", &self.number)
            .finish()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // Gone with releases unanswered (its clients and locks dropped): the sidecar
        // releases everything when the stream's sender goes.
        releasing::remove_session(self.number);
    }
}

/// Why a session could not be opened.
pub(crate) enum OpenError {
    /// The call failed before any sidecar answered: nobody may listen there.
    NotAnswered(tonic::Status),
    Failed(ClientError),
}

impl Session {
    /// Opens a session: its stream, its `SessionStarted`, and the reader.
    pub(crate) async fn open(grpc: &Grpc, settings: Settings) -> Result<Arc<Self>, OpenError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut client = grpc.clone();
        let request = tokio_stream::wrappers::UnboundedReceiverStream::new(rx);
        let mut events = match client.lease(request).await {
            Ok(response) => response.into_inner(),
            Err(status) => return Err(OpenError::NotAnswered(status)),
        };
        use tokio_stream::StreamExt;
        let started = match events.next().await {
            Some(Ok(proto::LeaseResponse {
                event: Some(Event::Started(started)),
            })) => started,
            Some(Ok(other)) => {
                return Err(OpenError::Failed(ClientError::Unavailable(format!(
                    "protocol error: the stream opened with {other:?}, not SessionStarted"
                ))));
            }
            Some(Err(status)) => return Err(OpenError::Failed(crate::error::from_status(&status))),
            None => {
                return Err(OpenError::Failed(ClientError::Unavailable(
                    "the sidecar ended the stream before it started the session".into(),
                )));
            }
        };
        let session = Arc::new(Self {
            number: NEXT_SESSION.fetch_add(1, Ordering::Relaxed),
            grpc: grpc.clone(),
            settings,
            state: Mutex::new(State {
                phase: Phase::Open,
                session_id: started.session_id,
                token: started.resume_token,
                default_ttl: started
                    .default_ttl
                    .and_then(|d| Duration::try_from(d).ok())
                    .unwrap_or_default(),
                tx,
                next_id: 1,
                pending: BTreeMap::new(),
                slots: HashMap::new(),
                holders: Holders::default(),
                closing: false,
            }),
            settled: Notify::new(),
        });
        tokio::spawn(reader::follow(Arc::downgrade(&session), events));
        Ok(session)
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere with the lock held leaves plain data: go on with it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The session's id, while it has not ended.
    pub fn session_id(&self) -> Option<String> {
        let state = self.lock();
        match state.phase {
            Phase::Ended(_) => None,
            _ => Some(state.session_id.clone()),
        }
    }

    /// Why the session ended, once it has.
    pub fn ended(&self) -> Option<String> {
        match &self.lock().phase {
            Phase::Ended(why) => Some(why.clone()),
            _ => None,
        }
    }

    /// Tells the listener that `cell` changed.
    pub(crate) fn tell(&self, cell: &Arc<LockCell>) {
        if let Some(listener) = &self.settings.listener {
            listener(cell);
        }
    }

    /// Hands the name of `cell`'s holder back (once) when nothing else of it is used.
    pub(crate) fn name_done(state: &mut State, cell: &LockCell) {
        if !cell.name_returned.swap(true, Ordering::Relaxed) {
            state.holders.done(cell.holder());
        }
    }

    /// Waits while the session resumes; `Err` with why it ended, if it did.
    async fn ready(&self) -> Result<(), String> {
        loop {
            let settled = self.settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            match &self.lock().phase {
                Phase::Open => return Ok(()),
                Phase::Ended(why) => return Err(why.clone()),
                Phase::Resuming => {}
            }
            settled.await;
        }
    }

    /// The session is over: what waits fails, what is held is lost (let go, when the
    /// client closed); one log line however many locks.
    pub(crate) fn end(&self, state: &mut State, reason: String) {
        if matches!(state.phase, Phase::Ended(_)) {
            return;
        }
        state.phase = Phase::Ended(reason.clone());
        state.tx = mpsc::unbounded_channel().0;
        for (_, pending) in std::mem::take(&mut state.pending) {
            if let Some(reply) = pending.reply {
                let _ = reply.send(Err(ClientError::Unavailable(format!(
                    "lease stream ended: {reason}"
                ))));
            }
        }
        let mut lost = Vec::new();
        for (_, slot) in std::mem::take(&mut state.slots) {
            for cell in slot.cells {
                let released = cell.released();
                if state.closing {
                    cell.mark_released();
                }
                if cell.set(LockState::Lost(reason.clone())) {
                    if !released {
                        lost.push(cell.key().to_owned());
                    }
                    self.tell(&cell);
                }
            }
        }
        releasing::remove_session(self.number);
        if state.closing {
            if !lost.is_empty() {
                tracing::debug!(session = %state.session_id, locks = lost.len(), "session closed with locks held: the sidecar releases them");
            }
        } else {
            log_lost(&lost, &reason);
        }
        self.settled.notify_waiters();
    }
}

/// One log line for locks lost together, however many they are.
pub(crate) fn log_lost(keys: &[String], reason: &str) {
    match keys {
        [] => {}
        [key] => tracing::warn!(%key, %reason, "lock lost"),
        keys => {
            let shown: Vec<&str> = keys.iter().take(3).map(String::as_str).collect();
            tracing::warn!(locks = keys.len(), keys = ?shown, %reason, "locks lost");
        }
    }
}
