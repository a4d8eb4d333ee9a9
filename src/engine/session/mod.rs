//! A session: one `Lease` stream, one task that owns all of its state: the locks it
//! holds, the requests it has pending, and its outbound sender.
//!
//! Each grant of the session has a [`Slot`], found by its name: the key, and the holder
//! inside the session when it is not the session itself (`store::names`). Two holders
//! of one key are two slots, with two owners in the store, so they exclude each other
//! as two sessions would. Store calls run concurrently as futures in `ops`, but at most
//! one per slot: commands that arrive for a slot with a call under way queue behind it,
//! so the store sees each holder's operations on a key in order. The one exception is a
//! `Release` of a key the holder waits for: it cancels the wait.
//!
//! The session, not the renewer, decides when a lock is lost by time: its timer fires
//! at the earliest safe deadline of its grants, so a renewal stuck in a slow store can
//! never delay `Lost`.
//!
//! Files: this one has the state and the main loop; `tell.rs` what the client is sent;
//! `requests.rs` turns client commands into store calls; `results.rs` handles what the
//! store answers; `grants.rs` a held grant's life (released, lost by the renewer's word
//! or the safe-deadline timer) and the commands queued behind a key; `attempt.rs` is
//! one acquire, with its waiting; `resume.rs` a resumed session; `reassert.rs` a grant
//! written back after the store lost its data; `end.rs` releasing everything when the
//! session ends.

/// Logs an event at `level` inside the session's span: `log!(self, WARN, %key, "...")`.
/// The span is entered here, where something is logged, and only when the level is on,
/// rather than on every poll of the session's task (measured with perf: entering and
/// leaving it on each poll was 2 to 3 % of the sidecar's CPU per uncontended cycle).
macro_rules! log {
    ($session:expr, $level:ident, $($event:tt)+) => {
        if tracing::level_enabled!(tracing::Level::$level) {
            let _in = $session.span.enter();
            tracing::event!(tracing::Level::$level, $($event)+);
        }
    };
}

mod all;
mod all_attempt;
mod all_granted;
mod attempt;
mod end;
mod grants;
mod held;
mod reassert;
mod requests;
mod results;
mod resume;
mod tell;
pub(crate) use resume::random_secret;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::journal::SessionRef;
use super::renewer::{LeaseClock, RenewEvent};
use super::{AcquireRequest, Command, EngineError, Event, Inbound, Shared};
use crate::store::{Claim, Sharing, StoreError};
use end::End;

/// A key's state in the session, boxed: a session's slots live in a hash table sized
/// to a power of two (1,000 keys take 2,048 buckets), and a bucket holds the key and a
/// pointer rather than a whole `Held` (about 140 bytes), which halves the table's
/// memory at 1,000 locks a session.
enum Slot {
    Acquiring(Box<Acquiring>),
    Held(Box<Held>),
}

struct Acquiring {
    request_id: u64,
    /// The `acquire` trace span: from the request to its answer.
    span: tracing::Span,
    /// When the request arrived, for the wait-time histogram.
    started: Instant,
    /// A `Waiting` was sent: a grant is then a handoff.
    waited: bool,
    /// Counts this acquire in `lockside_acquires_waiting` from its `Waiting` until the
    /// slot goes, whichever way it goes (answered, or the session ended).
    waiting: Option<crate::metrics::Waiting>,
    cancel: CancellationToken,
    cancelled: bool,
    queue: VecDeque<Command>,
}

struct Held {
    lease_id: u64,
    /// Shared with the renewer's entry.
    owner: Arc<str>,
    fence: u64,
    ttl: Duration,
    sharing: Sharing,
    limit: u32,
    count: u32,
    clock: Arc<LeaseClock>,
    granted_at: Instant,
    jeopardy: bool,
    /// A store call for this grant is under way.
    busy: bool,
    /// The renewer found the grant gone during a hold-off while a call was under way:
    /// written back once that call is done (`reassert.rs`).
    gone: bool,
    queue: VecDeque<Command>,
    /// The holder's value as last asked for: written back with the grant after the
    /// store lost its data (`reassert.rs`).
    value: Box<[u8]>,
}

/// What reaches a session from outside its own store calls, on one channel: a tokio
/// channel allocates its state and its first block of 32 messages when made (about
/// 1.5 KB), so one channel each for the renewer and for waiting acquires cost a
/// session 3 KB before it held anything (30 MB at 10,000 sessions).
pub(crate) enum Note {
    /// The renewer's word on one of the session's grants.
    Renew(RenewEvent),
    /// A waiting acquire's place in line, for its `Waiting` answer.
    Waiting {
        request_id: u64,
        name: Arc<str>,
        position: u32,
    },
}

/// The result of a store call made for the session.
/// Each carries the name of the slot it was made for.
enum Done {
    Acquire {
        request_id: u64,
        name: Arc<str>,
        claim: Claim,
        outcome: AcquireResult,
    },
    Reenter {
        name: String,
        lease_id: u64,
        request: AcquireRequest,
        result: Result<Option<u32>, StoreError>,
    },
    Release {
        name: String,
        lease_id: u64,
        request_id: u64,
        result: Result<Option<u32>, StoreError>,
    },
    Proclaim {
        name: String,
        lease_id: u64,
        request_id: u64,
        result: Result<bool, StoreError>,
    },
    Reassert {
        name: Arc<str>,
        lease_id: u64,
        sent_at: Instant,
        result: Result<bool, StoreError>,
    },
    /// A new grant is in the session's record: its client may hear of it now.
    Recorded { name: Arc<str>, lease_id: u64 },
    /// An `AcquireAll` ended (`all.rs`).
    AcquireAll {
        request_id: u64,
        claims: Vec<(usize, Claim)>,
        names: Vec<Arc<str>>,
        outcome: all_attempt::AllResult,
    },
    /// Every new grant of an `AcquireAll` is in the session's record.
    RecordedAll {
        request_id: u64,
        leases: Vec<(Arc<str>, u64)>,
    },
}

/// How one acquire ended, as its store calls and its waiting decided.
enum AcquireResult {
    /// `listed`: the store listed the grant in the session's record in the same step.
    Granted {
        fence: u64,
        sent_at: Instant,
        listed: bool,
    },
    Busy,
    Timeout,
    Cancelled,
    Conflict {
        limit: u32,
    },
    Unavailable(StoreError),
}

pub(crate) struct Session {
    shared: Arc<Shared>,
    id: String,
    secret: String,
    client_name: String,
    grants: u64,
    out: mpsc::Sender<Event>,
    overflow: bool,
    /// Each grant's state, by name (`store::names`): the one string of it that the
    /// session, the renewer and the journal share.
    slots: HashMap<Arc<str>, Slot>,
    pending: HashSet<u64>,
    ops: FuturesUnordered<BoxFuture<'static, Done>>,
    /// The renewer's events and waiting acquires' places in line (see [`Note`]).
    notes_tx: mpsc::UnboundedSender<Note>,
    notes_rx: mpsc::UnboundedReceiver<Note>,
    /// When the deadline timer fires: no later than the earliest safe deadline of the
    /// grants held (lowered as each is taken on, recomputed when it fires). Scanning
    /// every slot for it on every turn of the loop cost a session of 1,000 locks 1,000
    /// reads per event. An early firing only reads the clocks again; a late one would
    /// delay a `Lost`.
    deadline: Option<Instant>,
    /// The session as its record in the store knows it (`engine/journal/`).
    record: Arc<SessionRef>,
    /// The journal has heard of this session (it held a lock): it must hear its end.
    journaled: bool,
    /// Grants given up lately, and when (see `Session::lists`).
    dropped_at: HashMap<Arc<str>, Instant>,
    /// A resumed session: what its client hears right after `SessionStarted`.
    greeting: Vec<Event>,
    /// The `Granted` of each new grant whose record is being written: told once it is
    /// (`grants.rs`), so that a sidecar that dies right after a `Granted` leaves that
    /// lock resumable.
    untold: HashMap<Arc<str>, Event>,
    /// `AcquireAll` requests under way (`all.rs`), by request id.
    alls: HashMap<u64, all::AllPending>,
    /// An `AcquireAll`'s `GrantedAll` not told yet (its grants' record is being
    /// written), by request id, and which request each of its grants belongs to.
    untold_events: HashMap<u64, Event>,
    untold_all: HashMap<Arc<str>, u64>,
    /// The session's span: the parent of its `acquire` spans, and the context of what
    /// it logs (see [`log!`]). INFO: exported as a trace span when traces are on (a
    /// sidecar's sessions are few and long; this is not per request).
    span: tracing::Span,
}

fn random_hex(bytes: usize) -> Result<String, EngineError> {
    super::random_hex(bytes).map_err(|e| EngineError::Random(e.to_string()))
}

impl Session {
    pub(crate) fn new(
        shared: Arc<Shared>,
        client_name: String,
        out: mpsc::Sender<Event>,
    ) -> Result<Self, EngineError> {
        // Public: shown by Describe. 64 bits tell sessions apart in logs.
        let id = random_hex(8)?;
        // Secret: 128 bits make owner tokens unguessable.
        let secret = random_secret()?;
        Ok(Self::with_identity(
            shared,
            client_name,
            out,
            id,
            secret,
            false,
        ))
    }

    /// A session with a given id and secret (a resumed one keeps its id).
    fn with_identity(
        shared: Arc<Shared>,
        client_name: String,
        out: mpsc::Sender<Event>,
        id: String,
        secret: String,
        resumed: bool,
    ) -> Self {
        let (notes_tx, notes_rx) = mpsc::unbounded_channel();
        let span = tracing::info_span!("session", session = %id, client = %client_name);
        let record = Arc::new(SessionRef {
            serial: shared.next_lease_id(),
            id: id.clone(),
            secret: secret.clone(),
            client_name: client_name.clone(),
            resumed,
        });
        Self {
            shared,
            id,
            secret,
            client_name,
            grants: 0,
            out,
            overflow: false,
            slots: HashMap::new(),
            pending: HashSet::new(),
            ops: FuturesUnordered::new(),
            notes_tx,
            notes_rx,
            deadline: None,
            record,
            journaled: false,
            dropped_at: HashMap::new(),
            greeting: Vec::new(),
            untold: HashMap::new(),
            alls: HashMap::new(),
            untold_events: HashMap::new(),
            untold_all: HashMap::new(),
            span,
        }
    }

    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// The secret its resume token carries (never logged).
    pub(crate) fn secret(&self) -> &str {
        &self.secret
    }

    /// The session's span, for the caller's trace context to become its parent.
    pub(crate) fn span(&self) -> &tracing::Span {
        &self.span
    }

    pub(crate) async fn run<S>(mut self, mut inbound: S)
    where
        S: Stream<Item = Inbound> + Unpin,
    {
        log!(self, DEBUG, "session started");
        self.send(Event::Started {
            session_id: self.id.clone(),
            default_ttl: self.shared.config.default_ttl,
            resume_token: self.resume_token(),
            resumed: u32::try_from(self.greeting.len()).unwrap_or(u32::MAX),
        });
        self.greet();
        // The shutdown future and the deadline timer live across turns of the loop: made
        // afresh on every turn, each turn registered and unregistered a waiter on the
        // token and a timer in the runtime's wheel (measured with perf: about 2% of the
        // sidecar's CPU per uncontended cycle). The timer is reset only when the
        // earliest deadline changes.
        let shutdown = self.shared.shutdown.clone();
        let mut shutdown = std::pin::pin!(shutdown.cancelled_owned());
        let mut timer = std::pin::pin!(tokio::time::sleep_until(Instant::now()));
        let mut armed: Option<Instant> = None;
        let end = loop {
            if self.overflow {
                break End::Overflow;
            }
            let deadline = self.deadline;
            if let Some(at) = deadline
                && armed != Some(at)
            {
                timer.as_mut().reset(at);
                armed = Some(at);
            }
            tokio::select! {
                biased;
                _ = &mut shutdown => break End::Shutdown,
                Some(note) = self.notes_rx.recv() => match note {
                    Note::Renew(event) => self.on_renew_event(event),
                    Note::Waiting { request_id, name, position } => self.on_waiting(request_id, &name, position),
                },
                _ = &mut timer, if deadline.is_some() => {
                    // Elapsed: the next turn arms it again, even at the same instant.
                    armed = None;
                    self.check_deadlines();
                }
                Some(done) = self.ops.next(), if !self.ops.is_empty() => self.on_done(done),
                message = inbound.next() => match message {
                    Some(Inbound::Command(command)) => self.handle(command),
                    Some(Inbound::Invalid(rejection)) => self.send(Event::Rejected(rejection)),
                    Some(Inbound::Broken(why)) => {
                        log!(self, DEBUG, %why, "stream broken");
                        break End::Broken;
                    }
                    None => break End::Closed,
                },
            }
        };
        // Once per session: its end runs inside its span.
        let span = self.span.clone();
        self.finish(end).instrument(span.clone()).await;
        span.in_scope(|| tracing::debug!("session ended"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A session with 1,000 locks has 2,048 buckets of slots: a bucket is a key and a
    /// pointer (168 bytes before, a whole `Held` inline).
    #[test]
    fn a_slot_bucket_stays_small() {
        let bucket = size_of::<(Arc<str>, Slot)>();
        assert!(bucket <= 32, "{bucket} bytes");
    }
}
