//! Giving a lock back: the `Release` goes on the stream and the caller goes on (the
//! answer is read when it comes: `releasing.rs` says why that is safe); a proclaim,
//! which waits for its answer; closing the session.

use std::sync::Arc;
use std::time::Duration;

use lockside_proto::lease_request::Command;
use lockside_proto::lease_response::Event;
use lockside_proto::{self as proto, LeaseRequest};
use tokio::sync::{mpsc, oneshot};

use super::{Answer, Kind, Pending, Phase, Session, State};
use crate::lock::LockCell;
use crate::{ClientError, releasing};

impl Session {
    /// Gives `cell` back. Returns once the `Release` is on the stream (or, while the
    /// session resumes, queued to go on the resumed one); `Lost` (once) for a lock
    /// lost before.
    pub(crate) fn release(&self, cell: &Arc<LockCell>) -> Result<(), ClientError> {
        let mut state = self.lock();
        if cell.released() {
            return Ok(());
        }
        cell.mark_released();
        Self::name_done(&mut state, cell);
        if cell.is_lost() || matches!(state.phase, Phase::Ended(_)) {
            return Err(ClientError::Lost);
        }
        self.send_release(&mut state, cell);
        Ok(())
    }

    /// Sends the release of `cell` (already marked released) and awaits its answer.
    pub(crate) fn send_release(&self, state: &mut State, cell: &Arc<LockCell>) {
        let rid = state.id();
        let command = Command::Release(proto::Release {
            request_id: rid,
            key: cell.key().to_owned(),
            holder: cell.holder().to_owned(),
        });
        releasing::add(cell.key(), self.number, cell.holder(), rid);
        state.pending.insert(
            rid,
            Pending {
                kind: Kind::Release(cell.clone()),
                key: cell.key().to_owned(),
                holder: cell.holder().to_owned(),
                request: LeaseRequest {
                    command: Some(command.clone()),
                },
                reply: None,
                ttl_asked: None,
            },
        );
        state.send(command);
    }

    /// Replaces the value of `cell`'s grant and waits for the answer.
    pub(crate) async fn proclaim(
        &self,
        cell: &Arc<LockCell>,
        value: Vec<u8>,
    ) -> Result<(), ClientError> {
        if cell.is_lost() {
            return Err(ClientError::Lost);
        }
        if cell.released() {
            return Err(ClientError::Settings(format!(
                "the lock on {} was released",
                cell.key()
            )));
        }
        if let Err(why) = self.ready().await {
            let _ = why;
            return Err(ClientError::Lost);
        }
        let (reply, answer) = oneshot::channel();
        {
            let mut state = self.lock();
            let rid = state.id();
            let command = Command::Proclaim(proto::Proclaim {
                request_id: rid,
                key: cell.key().to_owned(),
                value,
                holder: cell.holder().to_owned(),
            });
            state.pending.insert(
                rid,
                Pending {
                    kind: Kind::Proclaim,
                    key: cell.key().to_owned(),
                    holder: cell.holder().to_owned(),
                    request: LeaseRequest {
                        command: Some(command.clone()),
                    },
                    reply: Some(reply),
                    ttl_asked: None,
                },
            );
            state.send(command);
        }
        let answer = answer.await.map_err(|_| ClientError::Lost).and_then(|a| a);
        match answer {
            Ok(Answer::Other(Event::Proclaimed(_))) => Ok(()),
            // Not held any more: the sidecar sends `Lost` before refusing it.
            _ if cell.is_lost() => Err(ClientError::Lost),
            Ok(Answer::Other(Event::Rejected(r)))
                if r.code == tonic::Code::FailedPrecondition as i32 =>
            {
                Err(ClientError::Lost)
            }
            Ok(Answer::Other(Event::Rejected(r))) => Err(ClientError::Rejected {
                code: r.code,
                message: r.message,
            }),
            Ok(_) => Err(ClientError::Unavailable(
                "protocol error: an unexpected answer to a proclaim".into(),
            )),
            Err(e) => Err(e),
        }
    }

    /// Ends the session: half-closes the stream (the sidecar releases everything and
    /// ends it) and waits up to `within` for that. A session that is resuming ends at
    /// once (its locks stay in the store until their TTL). Every lock is let go.
    pub(crate) async fn close(&self, within: Duration) {
        let settled = self.settled.notified();
        tokio::pin!(settled);
        settled.as_mut().enable();
        {
            let mut state = self.lock();
            state.closing = true;
            match state.phase {
                Phase::Ended(_) => return,
                Phase::Resuming => {
                    self.end(&mut state, "client closed".into());
                    return;
                }
                Phase::Open => {
                    // Dropping the only sender half-closes the stream.
                    state.tx = mpsc::unbounded_channel().0;
                }
            }
        }
        let _ = tokio::time::timeout(within, settled).await;
        let mut state = self.lock();
        self.end(&mut state, "client closed".into());
    }
}
