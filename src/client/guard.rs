//! A held lock on the client's side: its token, its loss, its release.

use tokio::sync::{mpsc, watch};

use super::{ClientError, send};
use crate::proto::{self, lease_request};

/// A held lock. Dropping it releases the lock (its stream ends).
#[derive(Debug)]
pub struct LockGuard {
    pub(super) key: String,
    pub(super) token: u64,
    pub(super) tx: mpsc::Sender<proto::LeaseRequest>,
    /// Why the lock was lost, once it is.
    pub(super) lost: watch::Receiver<Option<String>>,
    pub(super) released: watch::Receiver<Option<u32>>,
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

    /// Whether the lock is already lost.
    pub fn is_lost(&self) -> bool {
        self.lost.borrow().is_some()
    }

    /// Why the lock was lost (the `Lost` event's reason, or how the stream broke), once
    /// it is.
    pub fn lost_reason(&self) -> Option<String> {
        self.lost.borrow().clone()
    }

    /// Completes when the lock is lost (a `Lost` event, or the stream broke or ended).
    /// Stop using the resource then.
    pub async fn lost(&self) {
        let mut lost = self.lost.clone();
        // An error means the reader is gone without a verdict: treat it as lost.
        let _ = lost.wait_for(Option::is_some).await;
    }

    /// Releases the lock and waits for the sidecar to confirm.
    pub async fn release(mut self) -> Result<(), ClientError> {
        if self.is_lost() {
            return Err(ClientError::Lost);
        }
        let release = proto::Release {
            request_id: 2,
            key: self.key.clone(),
        };
        send(&self.tx, lease_request::Command::Release(release)).await?;
        let mut lost = self.lost.clone();
        tokio::select! {
            // The reader ends (closing both channels) right after a Released: look at
            // the answer first, and count only a real Lost, not a closed channel.
            biased;
            answer = self.released.wait_for(Option::is_some) => {
                answer.map_err(|_| ClientError::Lost)?;
                Ok(())
            }
            Ok(_) = lost.wait_for(Option::is_some) => Err(ClientError::Lost),
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        // Ending the stream is the release; the reader has nothing left to report.
        self.reader.abort();
    }
}
