//! A held lock on the client's side: its token, its value, its loss, its release; and
//! leadership, which is a held lock.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{mpsc, oneshot, watch};

use super::{Answers, ClientError, LockState, send};
use crate::proto::{self, lease_request, lease_response};

/// A held lock. Dropping it releases the lock (its stream ends).
#[derive(Debug)]
pub struct LockGuard {
    pub(super) key: String,
    pub(super) token: u64,
    pub(super) tx: mpsc::Sender<proto::LeaseRequest>,
    /// Where the lock stands: held, suspended (the stream broke), lost.
    pub(super) state: watch::Receiver<LockState>,
    /// Answers awaited on the stream (release, proclaim), by request id.
    pub(super) answers: Answers,
    /// The next request id (1 was the acquire).
    pub(super) next_id: AtomicU64,
    pub(super) reader: tokio::task::JoinHandle<()>,
}

impl LockGuard {
    /// The lock's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The fencing token: pass it to the resource you protect.
    pub fn fencing_token(&self) -> u64 {
        self.token
    }

    /// Where the lock stands now.
    pub fn state(&self) -> LockState {
        self.state.borrow().clone()
    }

    /// The lock's states as they change (a `tokio::sync::watch` receiver): suspended
    /// the moment the stream to the sidecar breaks, held again once the session is
    /// resumed with it, lost otherwise. Use the resource only while it is held.
    pub fn states(&self) -> watch::Receiver<LockState> {
        self.state.clone()
    }

    /// Whether the lock is suspended: the stream broke and it is not known yet whether
    /// the lock comes back. Do not use the resource now.
    pub fn is_suspended(&self) -> bool {
        *self.state.borrow() == LockState::Suspended
    }

    /// Whether the lock is already lost.
    pub fn is_lost(&self) -> bool {
        matches!(*self.state.borrow(), LockState::Lost(_))
    }

    /// Why the lock was lost (the `Lost` event's reason, or why the session could not
    /// be resumed), once it is.
    pub fn lost_reason(&self) -> Option<String> {
        match &*self.state.borrow() {
            LockState::Lost(why) => Some(why.clone()),
            _ => None,
        }
    }

    /// Completes when the lock is lost (a `Lost` event, or a broken stream that could
    /// not be resumed with the lock). Stop using the resource then; stop already while
    /// it is suspended ([`LockGuard::states`]).
    pub async fn lost(&self) {
        let mut state = self.state.clone();
        // An error means the reader is gone without a verdict: treat it as lost.
        let _ = state.wait_for(|s| matches!(s, LockState::Lost(_))).await;
    }

    /// Sends `command` (built with its request id) and waits for its answer.
    async fn ask(
        &self,
        command: impl FnOnce(u64) -> lease_request::Command,
    ) -> Result<lease_response::Event, ClientError> {
        if self.is_lost() {
            return Err(ClientError::Lost);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, answer) = oneshot::channel();
        match self.answers.lock() {
            Ok(mut answers) => answers.insert(id, tx),
            Err(_) => return Err(ClientError::Lost),
        };
        send(&self.tx, command(id)).await?;
        // The reader fails what is awaited when the lock is lost or the stream ends.
        answer.await.map_err(|_| ClientError::Lost)
    }

    /// Replaces the lock's value (`Describe` and `Watch` show it): a leader telling its
    /// followers where it now is, without giving up leadership. At most 4 KiB.
    pub async fn proclaim(&self, value: &[u8]) -> Result<(), ClientError> {
        let answer = self
            .ask(|request_id| {
                lease_request::Command::Proclaim(proto::Proclaim {
                    request_id,
                    key: self.key.clone(),
                    value: value.to_vec(),
                    holder: String::new(),
                })
            })
            .await?;
        match answer {
            lease_response::Event::Proclaimed(_) => Ok(()),
            // Not held any more: the Lost is on its way, or already here.
            lease_response::Event::Rejected(r)
                if r.code == tonic::Code::FailedPrecondition as i32 =>
            {
                Err(ClientError::Lost)
            }
            lease_response::Event::Rejected(r) => Err(ClientError::Rejected {
                code: r.code,
                message: r.message,
            }),
            other => Err(ClientError::Unavailable(format!(
                "protocol error: {other:?} answered a proclaim"
            ))),
        }
    }

    /// Releases the lock and waits for the sidecar to confirm.
    pub async fn release(self) -> Result<(), ClientError> {
        let answer = self
            .ask(|request_id| {
                lease_request::Command::Release(proto::Release {
                    request_id,
                    key: self.key.clone(),
                    holder: String::new(),
                })
            })
            .await?;
        match answer {
            lease_response::Event::Released(_) => Ok(()),
            // A Lost crossed the Release: the sidecar answers FAILED_PRECONDITION.
            _ => Err(ClientError::Lost),
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        // Ending the stream is the release; the reader has nothing left to report.
        self.reader.abort();
    }
}

/// Leadership of a key, from [`super::Client::campaign`]: the lock the leader holds
/// (its methods: [`LockGuard::fencing_token`], [`LockGuard::proclaim`],
/// [`LockGuard::lost`]). Lead while it is held; when `lost()` completes, stop acting
/// as the leader at once: another candidate takes over. Dropping it, or
/// [`Leader::resign`], hands leadership to the next candidate.
#[derive(Debug)]
pub struct Leader(LockGuard);

impl Leader {
    pub(super) fn new(lock: LockGuard) -> Self {
        Self(lock)
    }

    /// Gives up leadership and waits for the sidecar to confirm.
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
