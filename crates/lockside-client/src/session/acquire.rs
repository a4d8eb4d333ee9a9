//! Taking a lock: an `Acquire` on the stream and its answer; a caller that stops
//! waiting (a cancelled task, its own timeout) gives it up.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use lockside_proto::lease_request::Command;
use lockside_proto::lease_response::Event;
use lockside_proto::{self as proto, LeaseRequest};
use tokio::sync::oneshot;

use super::{Answer, Kind, Pending, Phase, Session};
use crate::limits::{ANSWER_SLACK, MAX_WAIT};
use crate::lock::LockCell;
use crate::{ClientError, LockOptions, NotAcquired, releasing};

/// The longest wait an `Acquire` carries (about 31 years): more than any sidecar allows.
const LONGEST_SENDABLE_WAIT: Duration = Duration::from_secs(1_000_000_000);

impl Session {
    /// Takes `key` for `holder` (`None`: a holder of its own, named by the session).
    /// `Err(None)`: the session ended before anything was sent (ask a new one).
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        key: &str,
        options: &LockOptions,
        holder: Option<&str>,
    ) -> Result<Arc<LockCell>, Option<ClientError>> {
        let holder = {
            let mut state = self.lock();
            match holder {
                Some(name) => {
                    state.holders.again(name);
                    name.to_owned()
                }
                None => state.holders.take(),
            }
        };
        // Given up (dropped: a cancelled task, a timeout of the caller's) or failed,
        // the holder's name is handed back, the wait cancelled on the sidecar, or the
        // grant given back when it comes.
        let mut asking = Asking {
            session: self,
            holder,
            rid: None,
            answer: None,
        };
        // (Bounded so that any wait converts; the sidecar refuses one over its maximum
        // with a message naming the wait asked for.)
        let wait = options.wait.map(|w| w.min(LONGEST_SENDABLE_WAIT));
        let duration = |d: Duration| prost_types::Duration::try_from(d).ok();
        loop {
            if self.ready().await.is_err() {
                return Err(None);
            }
            // A release of the key this request would not be ordered after: wait.
            releasing::settled(key, Some((self.number, &asking.holder))).await;
            let mut state = self.lock();
            if state.phase != Phase::Open {
                continue;
            }
            let rid = state.id();
            let command = Command::Acquire(proto::Acquire {
                request_id: rid,
                key: key.to_owned(),
                wait_timeout: wait.filter(|w| !w.is_zero()).and_then(duration),
                mode: if options.shared {
                    proto::LockMode::Shared
                } else {
                    proto::LockMode::Exclusive
                } as i32,
                limit: options.limit,
                fair: options.fair,
                ttl: options.ttl.and_then(duration),
                value: options.value.clone(),
                holder: asking.holder.clone(),
                traceparent: String::new(),
            });
            let (reply, answer) = oneshot::channel();
            state.pending.insert(
                rid,
                Pending {
                    kind: Kind::Acquire,
                    key: key.to_owned(),
                    holder: asking.holder.clone(),
                    request: LeaseRequest {
                        command: Some(command.clone()),
                    },
                    reply: Some(reply),
                    ttl_asked: options.ttl,
                },
            );
            state.send(command);
            asking.rid = Some(rid);
            asking.answer = Some(answer);
            break;
        }
        let answer = asking.answer.as_mut().expect("set above");
        let answer = answer_within(answer, wait).await;
        match answer.map_err(Some)? {
            Answer::Granted(cell) => {
                // The grant keeps the holder's name in use now.
                asking.rid = None;
                asking.answer = None;
                asking.holder.clear();
                Ok(cell)
            }
            Answer::Other(event @ (Event::NotAcquired(_) | Event::Rejected(_))) => {
                asking.rid = None;
                Err(Some(refusal(event, wait)))
            }
            Answer::GrantedAll(_) => Err(Some(ClientError::Unavailable(
                "protocol error: a GrantedAll answered an acquire".into(),
            ))),
            Answer::Other(other) => Err(Some(ClientError::Unavailable(format!(
                "protocol error: {other:?} answered an acquire"
            )))),
        }
    }

    /// The caller gave up on acquire `rid`. A Release of a key the holder only waits
    /// for cancels the wait; if the holder holds the key, such a Release would give
    /// back a hold instead, so then the grant (which comes at once for a held key) is
    /// given back when it arrives.
    pub(super) fn abandon(&self, rid: u64) {
        let mut state = self.lock();
        let Some(pending) = state.pending.get_mut(&rid) else {
            return;
        };
        pending.reply = None;
        let slot = (pending.holder.clone(), pending.key.clone());
        if state.slots.contains_key(&slot) || state.phase != Phase::Open {
            return;
        }
        state.pending.remove(&rid);
        let id = state.id();
        state.send(Command::Release(proto::Release {
            request_id: id,
            key: slot.1,
            holder: slot.0,
        }));
    }
}

/// An acquire under way: when it ends without a grant for its caller (failed, or
/// dropped by a caller that stopped waiting), its holder's name is handed back and the
/// request given up (`Session::abandon`); a grant that came meanwhile is given back.
struct Asking<'a> {
    session: &'a Session,
    /// Empty once the grant keeps the name.
    holder: String,
    /// The request, while it may still be answered.
    rid: Option<u64>,
    answer: Option<oneshot::Receiver<Result<Answer, ClientError>>>,
}

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        if let Some(mut answer) = self.answer.take() {
            // No answer can come after this: the reader gives back a grant it cannot
            // hand over.
            answer.close();
            if let Ok(Ok(Answer::Granted(cell))) = answer.try_recv() {
                let mut state = self.session.lock();
                cell.mark_released();
                cell.name_returned.store(true, Ordering::Relaxed);
                self.session.send_release(&mut state, &cell);
            } else if let Some(rid) = self.rid {
                self.session.abandon(rid);
            }
        }
        if !self.holder.is_empty() {
            self.session.lock().holders.done(&self.holder);
        }
    }
}

/// The answer to a request that may wait `wait`, or why none will come.
pub(super) async fn answer_within(
    answer: &mut oneshot::Receiver<Result<Answer, ClientError>>,
    wait: Option<Duration>,
) -> Result<Answer, ClientError> {
    let within = wait.unwrap_or_default().min(MAX_WAIT) + ANSWER_SLACK;
    match tokio::time::timeout(within, answer).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(_)) => Err(ClientError::Unavailable(
            "the session ended before the sidecar answered".into(),
        )),
        Err(_) => Err(ClientError::Unavailable(format!(
            "no answer from the sidecar within {}",
            crate::error::format_duration(within)
        ))),
    }
}

/// The error of an acquire answered `NotAcquired` or `Rejected`.
pub(super) fn refusal(event: Event, wait: Option<Duration>) -> ClientError {
    use proto::not_acquired::Reason;
    match event {
        Event::NotAcquired(n) => ClientError::NotAcquired(match Reason::try_from(n.reason) {
            Ok(Reason::Busy) => NotAcquired::Busy,
            Ok(Reason::Timeout) => NotAcquired::TimedOut(wait.unwrap_or_default()),
            Ok(Reason::Cancelled) => NotAcquired::Cancelled,
            _ => NotAcquired::Other(n.reason),
        }),
        Event::Rejected(r) => ClientError::Rejected {
            code: r.code,
            message: r.message,
        },
        other => ClientError::Unavailable(format!("protocol error: {other:?} answered an acquire")),
    }
}
