//! A session: one `Lease` stream, one task that owns all of its state: the locks it
//! holds, the requests it has pending, and its outbound sender.
//!
//! Each key of the session has a [`Slot`]. Store calls run concurrently as futures in
//! `ops`, but at most one per key: commands that arrive for a key with a call under way
//! queue behind it, so the store sees each session's operations on a key in order. The
//! one exception is a `Release` of a key the session waits for: it cancels the wait.
//!
//! The session, not the renewer, decides when a lock is lost by time: its timer fires
//! at the earliest safe deadline of its grants, so a renewal stuck in a slow store can
//! never delay `Lost`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;
use tokio_stream::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;

use super::renewer::{Lease, LeaseClock, RenewEvent};
use super::wakers::WaitGuard;
use super::{
    AcquireRequest, Command, EndReason, EngineError, Event, Inbound, MAX_WAIT, MIN_TTL, Mode,
    NotAcquiredReason, RejectCode, Rejection, Shared, drift_margin, validate_key,
};
use crate::store::{Acquired, Claim, Store, StoreError};

enum Slot {
    Acquiring(Acquiring),
    Held(Held),
}

struct Acquiring {
    request_id: u64,
    cancel: CancellationToken,
    cancelled: bool,
    queue: VecDeque<Command>,
}

struct Held {
    lease_id: u64,
    owner: String,
    fence: u64,
    ttl: Duration,
    count: u32,
    clock: Arc<LeaseClock>,
    /// Last value read from `clock`: the timer fires at it, then reads the clock again.
    valid_until: Instant,
    jeopardy: bool,
    /// A store call for this grant is under way.
    busy: bool,
    queue: VecDeque<Command>,
}

/// The result of a store call made for the session.
enum Done {
    Acquire {
        key: String,
        request_id: u64,
        owner: String,
        ttl: Duration,
        outcome: Outcome,
    },
    Hold {
        key: String,
        lease_id: u64,
        request: AcquireRequest,
        result: Result<Option<u32>, StoreError>,
    },
    Release {
        key: String,
        lease_id: u64,
        request_id: u64,
        result: Result<Option<u32>, StoreError>,
    },
}

enum Outcome {
    Granted { fence: u64, sent_at: Instant },
    Busy,
    Timeout,
    Cancelled,
    Unavailable(StoreError),
}

enum End {
    /// The client closed its side or the transport broke.
    Client,
    /// The sidecar shuts down.
    Shutdown,
    /// The client stopped reading its answers (or is gone).
    Overflow,
}

pub(crate) struct Session {
    shared: Arc<Shared>,
    id: String,
    secret: String,
    client_name: String,
    grants: u64,
    out: mpsc::Sender<Event>,
    overflow: bool,
    slots: HashMap<String, Slot>,
    pending: HashSet<u64>,
    ops: FuturesUnordered<BoxFuture<'static, Done>>,
    leases: HashMap<u64, String>,
    renew_tx: mpsc::UnboundedSender<RenewEvent>,
    renew_rx: mpsc::UnboundedReceiver<RenewEvent>,
    waiting_tx: mpsc::UnboundedSender<(u64, String)>,
    waiting_rx: mpsc::UnboundedReceiver<(u64, String)>,
}

fn random_hex(bytes: usize) -> Result<String, EngineError> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).map_err(|e| EngineError::Random(e.to_string()))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

impl Session {
    pub(crate) fn new(
        shared: Arc<Shared>,
        client_name: String,
        out: mpsc::Sender<Event>,
    ) -> Result<Self, EngineError> {
        let (renew_tx, renew_rx) = mpsc::unbounded_channel();
        let (waiting_tx, waiting_rx) = mpsc::unbounded_channel();
        Ok(Self {
            shared,
            // Public: shown by Describe. 64 bits tell sessions apart in logs.
            id: random_hex(8)?,
            // Secret: 128 bits make owner tokens unguessable.
            secret: random_hex(16)?,
            client_name,
            grants: 0,
            out,
            overflow: false,
            slots: HashMap::new(),
            pending: HashSet::new(),
            ops: FuturesUnordered::new(),
            leases: HashMap::new(),
            renew_tx,
            renew_rx,
            waiting_tx,
            waiting_rx,
        })
    }

    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    pub(crate) async fn run<S>(mut self, mut inbound: S)
    where
        S: Stream<Item = Inbound> + Unpin,
    {
        tracing::debug!("session started");
        self.send(Event::Started {
            session_id: self.id.clone(),
            default_ttl: self.shared.config.default_ttl,
        });
        let shutdown = self.shared.shutdown.clone();
        let end = loop {
            if self.overflow {
                break End::Overflow;
            }
            let deadline = self.next_deadline();
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break End::Shutdown,
                Some(event) = self.renew_rx.recv() => self.on_renew_event(event),
                Some((request_id, key)) = self.waiting_rx.recv() => self.on_waiting(request_id, key),
                _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                    self.check_deadlines();
                }
                Some(done) = self.ops.next(), if !self.ops.is_empty() => self.on_done(done),
                message = inbound.next() => match message {
                    Some(Inbound::Command(command)) => self.handle(command),
                    Some(Inbound::Invalid(rejection)) => self.send(Event::Rejected(rejection)),
                    Some(Inbound::Broken(why)) => {
                        tracing::debug!(%why, "stream broken");
                        break End::Client;
                    }
                    None => break End::Client,
                },
            }
        };
        self.finish(end).await;
        tracing::debug!("session ended");
    }

    /// Sends an event, ending the session if the client does not read its answers. The
    /// last slot of the buffer is kept for the `Ended` event that says so.
    fn send(&mut self, event: Event) {
        if self.overflow {
            return;
        }
        if self.out.capacity() <= 1 {
            self.overflow = true;
            let _ = self.out.try_send(Event::Ended(EndReason::Overflow));
            return;
        }
        if self.out.try_send(event).is_err() {
            self.overflow = true;
        }
    }

    fn reject(&mut self, request_id: u64, key: &str, code: RejectCode, message: impl Into<String>) {
        self.send(Event::Rejected(Rejection::new(
            request_id, key, code, message,
        )));
    }

    /// Answers UNAVAILABLE. The client learns that the store cannot be reached, not
    /// how: addresses and driver messages stay in the log.
    fn store_failed(&mut self, request_id: u64, key: &str, error: &StoreError) {
        tracing::warn!(%key, %error, "store call failed");
        self.reject(
            request_id,
            key,
            RejectCode::Unavailable,
            "the lock store is unavailable",
        );
    }

    fn handle(&mut self, command: Command) {
        let (request_id, key) = match &command {
            Command::Acquire(r) => (r.request_id, r.key.as_str()),
            Command::Release { request_id, key } => (*request_id, key.as_str()),
        };
        if self.pending.contains(&request_id) {
            let message = format!("request_id {request_id} is still pending on this session");
            self.reject(request_id, key, RejectCode::InvalidArgument, message);
            return;
        }
        if let Err(message) = validate_key(key) {
            self.reject(request_id, key, RejectCode::InvalidArgument, message);
            return;
        }
        if self.pending.len() >= self.shared.config.max_pending_per_session {
            let message = format!(
                "this session has {} requests pending, its limit",
                self.pending.len()
            );
            self.reject(request_id, key, RejectCode::ResourceExhausted, message);
            return;
        }
        match command {
            Command::Acquire(request) => self.acquire(request),
            Command::Release { request_id, key } => self.release(request_id, key),
        }
    }

    /// Checks the values of an `Acquire` that do not depend on the session's state.
    fn check(&self, r: &AcquireRequest) -> Result<Duration, (RejectCode, String)> {
        use RejectCode::*;
        if r.mode == Mode::Shared {
            return Err((Unimplemented, "SHARED mode is not implemented yet".into()));
        }
        if r.limit > 1 {
            return Err((
                Unimplemented,
                "limit > 1 (semaphores) is not implemented yet".into(),
            ));
        }
        if r.fair {
            return Err((Unimplemented, "fair queues are not implemented yet".into()));
        }
        let max_ttl = self.shared.config.max_ttl;
        let ttl = r.ttl.unwrap_or(self.shared.config.default_ttl);
        if ttl < MIN_TTL || ttl > max_ttl {
            return Err((
                InvalidArgument,
                format!("ttl {ttl:?} is outside the allowed range {MIN_TTL:?} to {max_ttl:?}"),
            ));
        }
        if let Some(wait) = r.wait
            && wait > MAX_WAIT
        {
            return Err((
                InvalidArgument,
                format!("wait_timeout {wait:?} is longer than the maximum {MAX_WAIT:?}"),
            ));
        }
        Ok(ttl)
    }

    fn acquire(&mut self, request: AcquireRequest) {
        let ttl = match self.check(&request) {
            Ok(ttl) => ttl,
            Err((code, message)) => {
                return self.reject(request.request_id, &request.key, code, message);
            }
        };
        let config = &self.shared.config;
        let (max_locks, max_waiters) = (config.max_locks_per_session, config.max_waiters_per_key);
        match self.slots.get_mut(&request.key) {
            Some(Slot::Acquiring(a)) => {
                self.pending.insert(request.request_id);
                a.queue.push_back(Command::Acquire(request));
            }
            Some(Slot::Held(h)) if h.busy => {
                self.pending.insert(request.request_id);
                h.queue.push_back(Command::Acquire(request));
            }
            Some(Slot::Held(h)) => {
                if h.count == u32::MAX {
                    let message = "hold count is at its maximum";
                    return self.reject(
                        request.request_id,
                        &request.key,
                        RejectCode::ResourceExhausted,
                        message,
                    );
                }
                // Reentrant: the store counts holds so Describe shows them. A reentrant
                // acquire keeps the grant's TTL.
                h.busy = true;
                self.pending.insert(request.request_id);
                let (store, turns) = (self.shared.store.clone(), self.shared.store_calls.clone());
                let (key, owner, ttl, lease_id) =
                    (request.key.clone(), h.owner.clone(), h.ttl, h.lease_id);
                self.ops.push(Box::pin(async move {
                    let _turn = turns.acquire().await;
                    let result = store.hold(&key, &owner, ttl).await;
                    Done::Hold {
                        key,
                        lease_id,
                        request,
                        result,
                    }
                }));
            }
            None => {
                if self.slots.len() >= max_locks {
                    let message =
                        format!("this session holds or waits for {max_locks} locks, its limit");
                    return self.reject(
                        request.request_id,
                        &request.key,
                        RejectCode::ResourceExhausted,
                        message,
                    );
                }
                let wait_until = request
                    .wait
                    .filter(|w| !w.is_zero())
                    .map(|w| Instant::now() + w);
                let guard = match wait_until {
                    None => None,
                    Some(_) => match self.shared.wakers.register(&request.key, max_waiters) {
                        Some(guard) => Some(guard),
                        None => {
                            let message = format!(
                                "{max_waiters} requests already wait for this key on this sidecar, the limit"
                            );
                            return self.reject(
                                request.request_id,
                                &request.key,
                                RejectCode::ResourceExhausted,
                                message,
                            );
                        }
                    },
                };
                self.grants += 1;
                let claim = Claim {
                    key: request.key.clone(),
                    owner: format!("{}.{}", self.secret, self.grants),
                    ttl,
                    wait: guard.is_some(),
                    session_id: self.id.clone(),
                    client_name: self.client_name.clone(),
                };
                let cancel = CancellationToken::new();
                self.slots.insert(
                    request.key.clone(),
                    Slot::Acquiring(Acquiring {
                        request_id: request.request_id,
                        cancel: cancel.clone(),
                        cancelled: false,
                        queue: VecDeque::new(),
                    }),
                );
                self.pending.insert(request.request_id);
                self.ops.push(Box::pin(acquire(AcquireOp {
                    store: self.shared.store.clone(),
                    turns: self.shared.store_calls.clone(),
                    claim,
                    request_id: request.request_id,
                    wait_until,
                    guard,
                    cancel,
                    waiting: self.waiting_tx.clone(),
                })));
            }
        }
    }

    fn release(&mut self, request_id: u64, key: String) {
        match self.slots.get_mut(&key) {
            Some(Slot::Acquiring(a)) => {
                // A Release of a key the session waits for cancels the wait; the pending
                // Acquire is answered NotAcquired CANCELLED, the Release not at all.
                a.cancelled = true;
                a.cancel.cancel();
            }
            Some(Slot::Held(h)) if h.busy => {
                self.pending.insert(request_id);
                h.queue.push_back(Command::Release { request_id, key });
            }
            Some(Slot::Held(h)) => {
                h.busy = true;
                self.pending.insert(request_id);
                let (store, turns) = (self.shared.store.clone(), self.shared.store_calls.clone());
                let (owner, lease_id) = (h.owner.clone(), h.lease_id);
                self.ops.push(Box::pin(async move {
                    let _turn = turns.acquire().await;
                    let result = store.release(&key, &owner, false).await;
                    Done::Release {
                        key,
                        lease_id,
                        request_id,
                        result,
                    }
                }));
            }
            None => self.reject(
                request_id,
                &key,
                RejectCode::FailedPrecondition,
                "this session does not hold this key",
            ),
        }
    }

    fn on_waiting(&mut self, request_id: u64, key: String) {
        if let Some(Slot::Acquiring(a)) = self.slots.get(&key)
            && a.request_id == request_id
            && !a.cancelled
        {
            self.send(Event::Waiting {
                request_id,
                key,
                position: 0,
            });
        }
    }

    fn on_done(&mut self, done: Done) {
        match done {
            Done::Acquire {
                key,
                request_id,
                owner,
                ttl,
                outcome,
            } => self.acquired(key, request_id, owner, ttl, outcome),
            Done::Hold {
                key,
                lease_id,
                request,
                result,
            } => {
                self.pending.remove(&request.request_id);
                let Some(Slot::Held(h)) = self
                    .slots
                    .get_mut(&key)
                    .filter(|s| lease_of(s) == Some(lease_id))
                else {
                    // The grant was lost while the call ran: acquire afresh.
                    return self.handle(Command::Acquire(request));
                };
                h.busy = false;
                match result {
                    Ok(Some(count)) => {
                        h.count = count;
                        let event = Event::Granted {
                            request_id: request.request_id,
                            key: key.clone(),
                            fence: h.fence,
                            ttl: h.clock.get().saturating_duration_since(Instant::now()),
                            hold_count: count,
                        };
                        self.send(event);
                        self.drain(&key);
                    }
                    Ok(None) => {
                        let queue = self.lose(&key, "the store no longer held the lock");
                        self.handle(Command::Acquire(request));
                        self.redispatch(queue);
                    }
                    Err(e) => {
                        self.store_failed(request.request_id, &key, &e);
                        self.drain(&key);
                    }
                }
            }
            Done::Release {
                key,
                lease_id,
                request_id,
                result,
            } => {
                self.pending.remove(&request_id);
                let Some(Slot::Held(h)) = self
                    .slots
                    .get_mut(&key)
                    .filter(|s| lease_of(s) == Some(lease_id))
                else {
                    // Lost while the call ran: nothing is held any more.
                    return self.send(Event::Released {
                        request_id,
                        key,
                        hold_count: 0,
                    });
                };
                h.busy = false;
                let last = h.count <= 1;
                match result {
                    Ok(Some(count)) if count > 0 => {
                        h.count = count;
                        self.send(Event::Released {
                            request_id,
                            key: key.clone(),
                            hold_count: count,
                        });
                        self.drain(&key);
                    }
                    Ok(Some(_)) => self.released(key, request_id),
                    Ok(None) => {
                        let queue = self.lose(&key, "the store no longer held the lock");
                        self.send(Event::Released {
                            request_id,
                            key,
                            hold_count: 0,
                        });
                        self.redispatch(queue);
                    }
                    Err(e) if last => {
                        // Stop renewing: the store lets the lock go at its expiry.
                        tracing::warn!(%key, error = %e, "release not confirmed by the store; the lock expires at its TTL");
                        self.released(key, request_id);
                    }
                    Err(e) => {
                        self.store_failed(request_id, &key, &e);
                        self.drain(&key);
                    }
                }
            }
        }
    }

    fn acquired(
        &mut self,
        key: String,
        request_id: u64,
        owner: String,
        ttl: Duration,
        outcome: Outcome,
    ) {
        self.pending.remove(&request_id);
        let Some(Slot::Acquiring(a)) = self.slots.remove(&key) else {
            // Cannot happen: an Acquiring slot only leaves through here.
            tracing::error!(%key, "acquire finished without its slot");
            if let Outcome::Granted { .. } = outcome {
                self.release_in_background(key, owner);
            }
            return;
        };
        let reason = match outcome {
            Outcome::Granted { .. } if a.cancelled => {
                self.release_in_background(key.clone(), owner);
                Some(NotAcquiredReason::Cancelled)
            }
            _ if a.cancelled => Some(NotAcquiredReason::Cancelled),
            Outcome::Granted { fence, sent_at } => {
                let valid_until = sent_at + ttl - drift_margin(ttl);
                let now = Instant::now();
                if valid_until <= now {
                    self.release_in_background(key.clone(), owner);
                    let message = "the store answered too late for the grant to be safe";
                    self.reject(request_id, &key, RejectCode::Unavailable, message);
                } else {
                    self.hold_grant(
                        key.clone(),
                        request_id,
                        owner,
                        ttl,
                        fence,
                        sent_at,
                        valid_until,
                        a.queue,
                    );
                    return self.drain(&key);
                }
                None
            }
            Outcome::Busy => Some(NotAcquiredReason::Busy),
            Outcome::Timeout => Some(NotAcquiredReason::Timeout),
            Outcome::Cancelled => Some(NotAcquiredReason::Cancelled),
            Outcome::Unavailable(e) => {
                self.store_failed(request_id, &key, &e);
                None
            }
        };
        if let Some(reason) = reason {
            self.send(Event::NotAcquired {
                request_id,
                key,
                reason,
            });
        }
        self.redispatch(a.queue);
    }

    #[allow(clippy::too_many_arguments)]
    fn hold_grant(
        &mut self,
        key: String,
        request_id: u64,
        owner: String,
        ttl: Duration,
        fence: u64,
        sent_at: Instant,
        valid_until: Instant,
        queue: VecDeque<Command>,
    ) {
        let lease_id = self.shared.next_lease_id();
        let clock = Arc::new(LeaseClock::new(valid_until));
        self.shared.renewer.add(Lease {
            id: lease_id,
            key: key.clone(),
            owner: owner.clone(),
            ttl,
            confirmed_at: sent_at,
            clock: clock.clone(),
            events: self.renew_tx.clone(),
        });
        self.leases.insert(lease_id, key.clone());
        let remaining = valid_until.saturating_duration_since(Instant::now());
        self.slots.insert(
            key.clone(),
            Slot::Held(Held {
                lease_id,
                owner,
                fence,
                ttl,
                count: 1,
                clock,
                valid_until,
                jeopardy: false,
                busy: false,
                queue,
            }),
        );
        tracing::debug!(%key, fence, "granted");
        self.send(Event::Granted {
            request_id,
            key,
            fence,
            ttl: remaining,
            hold_count: 1,
        });
    }

    /// The last hold is gone: forget the grant and answer.
    fn released(&mut self, key: String, request_id: u64) {
        let queue = match self.slots.remove(&key) {
            Some(Slot::Held(h)) => {
                self.shared.renewer.remove(h.lease_id);
                self.leases.remove(&h.lease_id);
                h.queue
            }
            _ => VecDeque::new(),
        };
        self.send(Event::Released {
            request_id,
            key,
            hold_count: 0,
        });
        self.redispatch(queue);
    }

    /// Drops a grant the session can no longer count on and says so. Returns the
    /// commands that were queued behind it.
    fn lose(&mut self, key: &str, reason: &str) -> VecDeque<Command> {
        let Some(Slot::Held(h)) = self.slots.remove(key) else {
            return VecDeque::new();
        };
        tracing::warn!(%key, fence = h.fence, %reason, "lock lost");
        self.shared.renewer.remove(h.lease_id);
        self.leases.remove(&h.lease_id);
        // If the store is reachable again, let the others in now rather than at expiry.
        self.release_in_background(key.to_owned(), h.owner);
        self.send(Event::Lost {
            key: key.to_owned(),
            reason: reason.to_owned(),
            fence: h.fence,
        });
        h.queue
    }

    fn release_in_background(&self, key: String, owner: String) {
        let store = self.shared.store.clone();
        tokio::spawn(async move {
            let _ = store.release(&key, &owner, true).await;
        });
    }

    /// Runs the commands queued behind a key while the key has no call under way.
    fn drain(&mut self, key: &str) {
        loop {
            let command = match self.slots.get_mut(key) {
                Some(Slot::Held(h)) if !h.busy => h.queue.pop_front(),
                _ => None,
            };
            let Some(command) = command else { return };
            self.redispatch(VecDeque::from([command]));
        }
    }

    fn redispatch(&mut self, queue: VecDeque<Command>) {
        for command in queue {
            let request_id = match &command {
                Command::Acquire(r) => r.request_id,
                Command::Release { request_id, .. } => *request_id,
            };
            self.pending.remove(&request_id);
            self.handle(command);
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.slots
            .values()
            .filter_map(|s| match s {
                Slot::Held(h) => Some(h.valid_until),
                Slot::Acquiring(_) => None,
            })
            .min()
    }

    fn check_deadlines(&mut self) {
        let now = Instant::now();
        let mut lost = Vec::new();
        for (key, slot) in &mut self.slots {
            if let Slot::Held(h) = slot {
                h.valid_until = h.clock.get();
                if h.valid_until <= now {
                    lost.push(key.clone());
                }
            }
        }
        for key in lost {
            let queue = self.lose(&key, "renewal not confirmed before the safe deadline");
            self.redispatch(queue);
        }
    }

    fn on_renew_event(&mut self, event: RenewEvent) {
        let (RenewEvent::Failing(id) | RenewEvent::Restored(id) | RenewEvent::NotHeld(id)) = event;
        let Some(key) = self.leases.get(&id).cloned() else {
            return;
        };
        let Some(Slot::Held(h)) = self.slots.get_mut(&key) else {
            return;
        };
        let left = h.clock.get().saturating_duration_since(Instant::now());
        match event {
            RenewEvent::Failing(_) if !h.jeopardy => {
                h.jeopardy = true;
                self.send(Event::Jeopardy {
                    key,
                    ttl_remaining: left,
                });
            }
            RenewEvent::Restored(_) if h.jeopardy => {
                h.jeopardy = false;
                self.send(Event::Restored { key, ttl: left });
            }
            RenewEvent::NotHeld(_) => {
                let queue = self.lose(&key, "the store no longer holds the lock");
                self.redispatch(queue);
            }
            _ => {}
        }
    }

    /// Releases everything: held grants at once, grants that in-flight calls produce as
    /// they finish. Waits are cancelled first.
    async fn finish(mut self, end: End) {
        for slot in self.slots.values() {
            if let Slot::Acquiring(a) = slot {
                a.cancel.cancel();
            }
        }
        let mut held = Vec::new();
        for (key, slot) in self.slots.drain() {
            if let Slot::Held(h) = slot {
                self.shared.renewer.remove(h.lease_id);
                held.push((key, h.owner, h.fence));
            }
        }
        if let End::Shutdown = end {
            for (key, _, fence) in &held {
                let reason = "the sidecar is shutting down".to_owned();
                let _ = self.out.try_send(Event::Lost {
                    key: key.clone(),
                    reason,
                    fence: *fence,
                });
            }
        }
        let store = self.shared.store.clone();
        let release_held = futures_util::future::join_all(
            held.iter()
                .map(|(key, owner, _)| release_quietly(&store, key, owner)),
        );
        let mut ops = std::mem::take(&mut self.ops);
        let finish_ops = async {
            let mut granted = Vec::new();
            while let Some(done) = ops.next().await {
                if let Done::Acquire {
                    key,
                    owner,
                    outcome: Outcome::Granted { .. },
                    ..
                } = done
                {
                    granted.push((key, owner));
                }
            }
            granted
        };
        let ((), granted) = tokio::join!(
            async {
                release_held.await;
            },
            finish_ops
        );
        futures_util::future::join_all(
            granted
                .iter()
                .map(|(key, owner)| release_quietly(&store, key, owner)),
        )
        .await;
        match end {
            End::Shutdown => {
                let _ = self.out.try_send(Event::Ended(EndReason::Shutdown));
            }
            End::Client | End::Overflow => {}
        }
        tracing::debug!(
            released = held.len() + granted.len(),
            "session released its locks"
        );
    }
}

fn lease_of(slot: &Slot) -> Option<u64> {
    match slot {
        Slot::Held(h) => Some(h.lease_id),
        Slot::Acquiring(_) => None,
    }
}

async fn release_quietly(store: &Arc<dyn Store>, key: &str, owner: &str) {
    if let Err(e) = store.release(key, owner, true).await {
        tracing::warn!(%key, error = %e, "release at session end failed; the lock expires at its TTL");
    }
}

struct AcquireOp {
    store: Arc<dyn Store>,
    turns: Arc<Semaphore>,
    claim: Claim,
    request_id: u64,
    wait_until: Option<Instant>,
    guard: Option<WaitGuard>,
    cancel: CancellationToken,
    waiting: mpsc::UnboundedSender<(u64, String)>,
}

async fn acquire(op: AcquireOp) -> Done {
    let outcome = attempts(&op).await;
    if op.claim.wait && !matches!(outcome, Outcome::Granted { .. }) {
        // Leave the waiters of the key in the store, in the background: the answer
        // need not wait for it, and the registration expires anyway.
        let store = op.store.clone();
        let (key, owner) = (op.claim.key.clone(), op.claim.owner.clone());
        tokio::spawn(async move {
            let _ = store.unwait(&key, &owner).await;
        });
    }
    Done::Acquire {
        key: op.claim.key,
        request_id: op.request_id,
        owner: op.claim.owner,
        ttl: op.claim.ttl,
        outcome,
    }
}

/// Tries to acquire; while busy and allowed to wait, sleeps until a release notice, the
/// holder's expiry, or a refresh of the waiter registration at TTL/3, whichever first.
async fn attempts(op: &AcquireOp) -> Outcome {
    let mut told = false;
    loop {
        let sent_at = Instant::now();
        let turn = op.turns.acquire().await;
        let answer = op.store.acquire(&op.claim).await;
        drop(turn);
        let expires_in = match answer {
            Ok(Acquired::Granted { fence }) => return Outcome::Granted { fence, sent_at },
            Ok(Acquired::Busy { expires_in }) => expires_in,
            Err(e) => return Outcome::Unavailable(e),
        };
        let (Some(until), Some(guard)) = (op.wait_until, op.guard.as_ref()) else {
            return Outcome::Busy;
        };
        if Instant::now() >= until {
            return Outcome::Timeout;
        }
        if !told {
            told = true;
            let _ = op.waiting.send((op.request_id, op.claim.key.clone()));
        }
        // +1 ms: look just after the holder's expiry, not just before it.
        let look_again =
            Instant::now() + (expires_in + Duration::from_millis(1)).min(op.claim.ttl / 3);
        tokio::select! {
            // A wake first: a woken waiter always tries once more, so no wake is lost.
            biased;
            _ = guard.notified() => {}
            _ = op.cancel.cancelled() => return Outcome::Cancelled,
            _ = tokio::time::sleep_until(until) => return Outcome::Timeout,
            _ = tokio::time::sleep_until(look_again) => {}
        }
    }
}
