"""What the sync and the asyncio clients share: errors, options, the answer routing of
one session, and the state of one lock. Nothing here does I/O."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import threading
import time
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

import grpc

try:
    from lockside._pb import lockside_pb2 as pb
except ImportError as e:  # pragma: no cover - only a source tree without a build
    raise ImportError(
        "lockside: the generated stubs (lockside._pb) are missing; install the package "
        "(`pip install ./clients/python`) rather than importing it from the source tree"
    ) from e

from lockside import _wire
# Re-exported: the clients (and `lockside`) take these from here.
from lockside._describe import Description as Description
from lockside._describe import Holder as Holder
from lockside._describe import QueueEntry as QueueEntry
from lockside._describe import description as description
from lockside._describe import seconds
from lockside._errors import LocksideError as LocksideError
from lockside._errors import LockLost as LockLost
from lockside._errors import NotAcquired as NotAcquired
from lockside._errors import Rejected as Rejected
from lockside._errors import Unavailable as Unavailable
from lockside._errors import call_error as call_error
from lockside._errors import rpc_error_text as rpc_error_text
from lockside._errors import status_code as status_code
from lockside._wire import proclaim_request as proclaim_request
from lockside._wire import release_request as release_request
from lockside._wire import value_bytes as value_bytes

log = logging.getLogger("lockside")

#: Where clients find the sidecar unless told otherwise (the sidecar's default).
DEFAULT_ADDR = "127.0.0.1:7420"

#: How long past its own wait an answer may take before the client gives up on it:
#: the sidecar answers every request, so only a broken sidecar or network hits this.
ANSWER_SLACK = 10.0

LEASE_METHOD = "/lockside.v1.LockService/Lease"
#: The request metadata that resumes a session (`SessionStarted.resume_token`).
RESUME_HEADER = "lockside-resume"
DESCRIBE_METHOD = "/lockside.v1.LockService/Describe"
WATCH_METHOD = "/lockside.v1.LockService/Watch"

#: The longest holder value the sidecar accepts (`Acquire.value`, `Proclaim.value`).
MAX_VALUE_BYTES = 4096

#: HTTP/2 keepalive well below the lock TTL (README, "Client guidance"): a frozen or
#: unreachable sidecar is noticed in about 2 s and the stream fails, which suspends
#: every lock of the session before the store lets it go, for a TTL of 3 s or more (a
#: frozen sidecar renews nothing: its locks expire 2/3 of a TTL after it froze at the
#: earliest).
KEEPALIVE_OPTIONS: List[Tuple[str, Any]] = [
    ("grpc.keepalive_time_ms", 1000),
    ("grpc.keepalive_timeout_ms", 1000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # gRPC core closes a connection on an unanswered PING after this, and with grpcio
    # 1.85 it is what governs keepalive pings too: without it a SIGSTOPped sidecar went
    # unnoticed for 10 s; with it the stream failed 1.5 s after the freeze.
    ("grpc.http2.ping_timeout_ms", 1000),
    # The sidecar is local: after it restarts, reconnect within a second rather than
    # after gRPC's default backoff (up to 120 s). Calls wait for the connection
    # (`wait_for_ready`), bounded by the client's `connect_timeout`.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


#: First pause between resume attempts, doubled up to `MAX_RESUME_BACKOFF` (as the
#: Rust client: the sidecar is local and comes back within seconds, or not in time).
FIRST_RESUME_BACKOFF = 0.05
MAX_RESUME_BACKOFF = 0.5

#: Stream endings that may mean the sidecar died or the connection to it broke (a
#: crash, SIGKILL, OOM kill, a reset connection, a frozen sidecar noticed by
#: keepalive): the locks are suspended and the session may be resumed. Anything else
#: (RESOURCE_EXHAUSTED for unread answers, FAILED_PRECONDITION, an authentication
#: error, a clean end) was the sidecar's decision: it released everything.
RESUMABLE_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.CANCELLED,
    }
)

#: Resume attempts that end with these codes will not succeed by retrying: the sidecar
#: cannot resume (Redlock: UNIMPLEMENTED) or refuses this client. FAILED_PRECONDITION
#: is retried until the lock's TTL has passed since the break: the restarted sidecar
#: refuses while the dead one's attachment lives (up to `--attachment-ttl`, 3 s), and
#: says the same for a token it does not know (a live sidecar that released the
#: session when its stream broke): the two cannot be told apart.
FINAL_RESUME_CODES = frozenset(
    {
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.INVALID_ARGUMENT,
    }
)


def default_addr() -> str:
    """$LOCKSIDE_ADDR, else 127.0.0.1:7420."""
    return os.environ.get("LOCKSIDE_ADDR") or DEFAULT_ADDR


def channel_target(addr: str) -> str:
    """A gRPC target from what users write: `host:port`, `unix:/path`, or an
    `http://host:port` URL as the sidecar's own CLI accepts."""
    if addr.startswith("http://"):
        return addr[len("http://") :].rstrip("/")
    return addr


# -- requests (encoded in _wire.py) ---------------------------------------------


def acquire_request(
    request_id: int,
    key: str,
    wait: Optional[float],
    ttl: Optional[float],
    shared: bool,
    limit: int,
    fair: bool,
    value: Any = b"",
    holder: str = "",
) -> Tuple[bytes, float]:
    """The encoded `LeaseRequest` for one acquire, and how long to wait for its
    answer: the wait it asks for, and `ANSWER_SLACK`.

    Only what cannot be encoded is checked here (types, negative or infinite numbers);
    the rules on values (key length and characters, TTL range, mode with limit, holder
    names) are the sidecar's, and break them and it answers `Rejected` with a clear
    message.
    """
    data, wait_s = _wire.acquire_request(
        request_id, key, wait, ttl, shared, limit, fair, value, holder
    )
    return data, wait_s + ANSWER_SLACK


def call_metadata(client_name: Optional[str], auth_token: Optional[str]) -> Tuple:
    md = []
    if client_name:
        md.append(("lockside-client-name", client_name))
    if auth_token:
        md.append(("authorization", f"Bearer {auth_token}"))
    return tuple(md)


# -- holders --------------------------------------------------------------------

#: The longest holder name the sidecar accepts, in bytes of UTF-8.
MAX_HOLDER_BYTES = 128

# One numbering for threads and tasks, never reused in the process (thread idents and
# `id(task)` are): a thread that died holding a lock, or a task that handed its lock
# on, must not make a newcomer with the same ident reentrant on it.
_holder_numbers = itertools.count(1)
_thread_holder = threading.local()
_task_holders: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()
_task_holders_mu = threading.Lock()


def _holder_name(kind: str, name: str) -> str:
    """`kind:N:name`: N a number of its own, the name (for `describe()`) with its
    control characters replaced, the whole cut to `MAX_HOLDER_BYTES`."""
    shown = "".join(c if c.isprintable() else "?" for c in name)
    full = f"{kind}:{next(_holder_numbers)}:{shown}".encode("utf-8")
    return full[:MAX_HOLDER_BYTES].decode("utf-8", "ignore")


def thread_holder() -> str:
    """The calling thread as a holder (`Client`): `thread:N:NAME`."""
    name: Optional[str] = getattr(_thread_holder, "name", None)
    if name is None:
        name = _thread_holder.name = _holder_name("thread", threading.current_thread().name)
    return name


def task_holder() -> Optional[str]:
    """The calling asyncio task as a holder (`AsyncClient`): `task:N:NAME`; None
    outside a task."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running loop
        return None
    if task is None:
        return None
    with _task_holders_mu:
        name = _task_holders.get(task)
        if name is None:
            name = _task_holders[task] = _holder_name("task", task.get_name())
    return name


def _after_fork_in_child() -> None:
    global _task_holders_mu
    _task_holders_mu = threading.Lock()  # a parent's thread may have held it


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# -- reaching the sidecar -----------------------------------------------------------


def dial_address(addr: str) -> Optional[Tuple[str, Any]]:
    """Where a plain socket finds the sidecar of `addr`: ("unix", path) or ("tcp",
    (host, port)); None for targets this cannot tell (then gRPC's own wait decides)."""
    target = channel_target(addr)
    if target.startswith("unix:"):
        path = target[len("unix:") :]
        return ("unix", path[2:] if path.startswith("//") else path)
    if target.startswith("unix-abstract:"):
        return ("unix", "\0" + target[len("unix-abstract:") :])
    if target.startswith("dns:///"):
        target = target[len("dns:///") :]
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not host or "/" in host:
        return None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        return None
    return ("tcp", (host, int(port)))


def refusal(e: OSError) -> Optional[str]:
    """Why a plain connect to the sidecar's address failed, when it shows that nothing
    listens there; None when it does not tell (a timeout: something may be slow)."""
    if isinstance(e, ConnectionRefusedError):
        return "connection refused (nothing listens there)"
    if isinstance(e, FileNotFoundError):
        return "no such socket file"
    if isinstance(e, (TimeoutError, socket.timeout)):  # (one class since 3.10)
        return None
    return e.strerror or str(e)


def wait_after_refusal(
    addr: str, cause: Optional[str], wait_for_sidecar: float, connect_timeout: float
) -> float:
    """A new session's first stream failed at once (UNAVAILABLE, not waiting for the
    connection) and `cause` is why a plain connect to `addr` failed (None: something
    listens there, say a sidecar that just restarted while gRPC backs off). Returns how
    long to wait for the sidecar now, or raises `Unavailable` naming the address and
    the cause when the caller did not ask to wait (`wait_for_sidecar`)."""
    if cause is None:
        return max(connect_timeout, wait_for_sidecar)
    if wait_for_sidecar > 0:
        log.warning(
            "no sidecar at %s yet (%s): waiting up to %gs for it", addr, cause, wait_for_sidecar
        )
        return wait_for_sidecar
    raise Unavailable(
        f"no sidecar at {addr}: {cause}; start it first, or let the client wait for it "
        "with wait_for_sidecar=SECONDS",
        grpc.StatusCode.UNAVAILABLE,
    )


# -- one lock -------------------------------------------------------------------


class LockBase:
    """A granted lock; the sync and asyncio `Lock` add how `suspended` and `lost` are
    signalled and how `release()` waits.

    Attributes:
      key            the lock's name.
      holder         who in the session holds it: the thread (`Client`) or the task
                     (`AsyncClient`) that locked, or the `holder=` named; "" for the
                     session itself (and on a sidecar that predates holders).
      fencing_token  pass it to the resource you protect; it must reject lower ones.
      ttl            seconds of validity the sidecar reported with the grant (it renews
                     the lock for as long as the session lives).
      hold_count     how many times the holder held the key after this grant
                     (reentrancy: each grant is released on its own).
      session_id     the session shown by `describe()`; it stays the same when the
                     session is resumed after a broken stream.
      lost_reason    why the lock was lost, once it is.

    A lock is usable while neither `suspended` nor `lost` is set. `suspended` is set
    the moment the session's stream breaks (DESIGN.md, "A broken stream": a live
    sidecar releases at once, so somebody else may hold the key within milliseconds),
    and cleared when the resumed session lists the lock again with its token. It is
    never cleared once the lock is lost: a lost lock (whether its stream broke or the
    sidecar sent `Lost`) has both set, so `suspended` alone says "stop using it now"
    and `lost` says "for good".
    """

    def __init__(
        self, session: "SessionBase", key: str, holder: str, granted: Any, ttl_asked: float
    ):
        self._session = session
        self.key = key
        self.holder = holder
        self.fencing_token: int = granted.fencing_token
        self.ttl: float = seconds(granted.ttl)
        self.hold_count: int = granted.hold_count
        self.session_id: str = session.session_id
        self.lost_reason: Optional[str] = None
        # The TTL the store keeps the lock for without renewals (asked, else the
        # sidecar's default): after a broken stream, the store has surely let the lock
        # go once this has passed, so resuming stops then.
        self._ttl_asked = ttl_asked
        # held -> released | lost; a lost lock raises LockLost once, on release. A lock
        # let go on purpose (its client closed) is "released" with `lost` set.
        self._state = "held"
        self._suspended = False  # what `suspended` says, readable from any thread

    @property
    def held(self) -> bool:
        """True until the lock is released or lost. A suspended lock is still held (it
        may come back): whether it may be used is `suspended`."""
        return self._state == "held"

    def _signal_lost(self) -> None:
        raise NotImplementedError

    def _signal_suspended(self, suspended: bool) -> None:
        raise NotImplementedError

    def _usable(self) -> bool:
        """Held and not suspended: what `wait_restored` / `restored_wait` wait for."""
        return self._state == "held" and not self._suspended

    def _suspend(self) -> None:
        """The stream broke: stop using the lock (mutex held / on the loop)."""
        if self._state == "held":
            self._suspended = True
            self._signal_suspended(True)

    def _restore(self) -> None:
        """The resumed session listed the lock with its token: usable again."""
        if self._state == "held" and self._suspended:
            self._suspended = False
            self._signal_suspended(False)

    def _mark_lost(self, reason: str, quiet: bool = False) -> None:
        """Called with the session's mutex held (sync) or on the loop (asyncio)."""
        if self._state != "held":
            return
        if not quiet:
            log.warning("lock %r lost: %s", self.key, reason)
        self._state = "lost"
        self.lost_reason = reason
        self._suspended = True
        self._signal_suspended(True)
        self._signal_lost()

    def _let_go(self, reason: str) -> None:
        """The lock was let go on purpose (its client closed): `lost` (and `suspended`)
        is set, so work under it stops, but `release()` has nothing to report."""
        if self._state == "held":
            self.lost_reason = reason
            self._suspended = True
            self._signal_suspended(True)
            self._signal_lost()
        self._state = "released"

    def _lost_error(self) -> LockLost:
        return LockLost(self.key, self.lost_reason or "lost", self.fencing_token)

    def __repr__(self) -> str:
        who = f" holder={self.holder!r}" if self.holder else ""
        state = "suspended" if self._state == "held" and self._suspended else self._state
        return (
            f"<{type(self).__name__} {self.key!r}{who} token={self.fencing_token} "
            f"state={state}>"
        )


def _log_lost(locks: Sequence[LockBase], reason: str) -> None:
    """One log line for locks lost together (a session's end, a resume that came too
    late), however many they are."""
    if len(locks) == 1:
        log.warning("lock %r lost: %s", locks[0].key, reason)
    elif locks:
        keys = ", ".join(repr(lock.key) for lock in locks[:3])
        more = f" and {len(locks) - 3} more" if len(locks) > 3 else ""
        log.warning("%d locks lost (%s%s): %s", len(locks), keys, more, reason)


# -- one session -----------------------------------------------------------------


class Pending:
    """A request waiting for its answer. `kind` is "acquire", "release" or "proclaim";
    `request` is what was sent (a release or a proclaim is sent again after a resume,
    since the old stream may have broken before it arrived). The sync and asyncio
    sessions subclass it with how the waiter is woken (`_notify`)."""

    __slots__ = ("kind", "key", "holder", "request", "ttl", "abandoned", "response", "error")

    def __init__(
        self, kind: str, key: str, request: bytes = b"", ttl: float = 0.0, holder: str = ""
    ):
        self.kind = kind
        self.key = key
        self.holder = holder
        self.request = request
        self.ttl = ttl  # an acquire's TTL (asked, or the session's default)
        self.abandoned = False  # the caller gave up (timeout, interrupt, cancel)
        self.response: Any = None
        self.error: Optional[BaseException] = None

    def _notify(self) -> None:
        raise NotImplementedError

    def resolve(self, response: Any = None, error: Optional[BaseException] = None) -> None:
        self.response = response
        self.error = error
        self._notify()


#: The events that answer a request, by `request_id`.
_ANSWERS = frozenset({"granted", "not_acquired", "rejected", "released", "proclaimed"})

#: The states of a session: requests go out on the stream (OPEN), wait for a resume
#: to end (RESUMING), or fail (ENDED).
OPEN, RESUMING, ENDED = "open", "resuming", "ended"

#: A holder and a key: what the session's bookkeeping is per (reentrancy is per
#: session, holder and key).
HolderKey = Tuple[str, str]


class SessionBase:
    """The answer routing of one session, shared by both clients; no I/O here.

    The session owns its `Lease` stream; requests carry ids from one counter so
    answers are matched by `request_id`, and `Lost`, `Jeopardy` and `Restored` are
    routed by holder and key to the locks that holder has of the key (its reentrant
    grants). Holders (DESIGN.md, "Holders inside a session") are the threads of a
    `Client` and the tasks of an `AsyncClient`: they exclude each other as sessions
    would, and each holder's grants are its own.

    When the stream breaks (`RESUMABLE_CODES`: a reset, a keepalive that fired, a
    sidecar that died) every held lock is suspended at once (DESIGN.md, "A broken
    stream": a live sidecar releases a broken stream's locks within milliseconds, and
    from here that looks like a dead one). `_broke` suspends them, fails the waits in
    progress (the sidecar does not resume them) and notes when the store has surely let
    each lock go (its TTL after the break, or what `Jeopardy` said); the client's I/O
    layer then opens new streams with the resume token (DESIGN.md, "Sessions that
    survive a sidecar restart"), with backoff, until one answers (`_resumed` restores
    the locks it lists with their tokens, holder by holder, loses the others, and says
    what to send again) or every lock's time has passed (`_expire` loses them). A
    session without a resume token (a store that cannot resume: the embedded memory
    store) loses every lock at the break. Otherwise, when the stream ends, every pending
    request fails and every held lock is lost, and the client opens a new session for
    the next request.
    """

    def __init__(self, resume: bool = True) -> None:
        self.session_id = ""
        self.default_ttl = 0.0
        self.resume_token = ""
        self.resume = resume
        self.state = OPEN
        self.ended: Optional[str] = None  # why the session ended, once it has
        # The process the session belongs to: a forked child has its own (`_inherited`).
        self.pid = os.getpid()
        self._closing = False
        self._ids = itertools.count(1)
        self._pending: Dict[int, Pending] = {}
        self._held: Dict[HolderKey, List[LockBase]] = {}
        # Locks in Jeopardy: when the store lets them go unless a renewal succeeds
        # (time.monotonic()).
        self._jeopardy: Dict[HolderKey, float] = {}
        # While resuming: why the stream broke, and when the store has surely let each
        # lock go (its TTL after the break): resuming it stops being worth it then.
        self._broke_reason = ""
        self._gone_by: Dict[HolderKey, float] = {}
        # The sidecar answered a holder's grant without its holder: it predates holders
        # and grants to the session, so every lock is the session's ("" holder).
        self._legacy = False

    # Subclasses: how to send an encoded request without waiting (dropped unless the
    # session is OPEN: a resume reconciles hold counts), how to make a lock, and how to
    # tell waiters that the state changed (after a resume or the end).
    def _send_nowait(self, request: bytes) -> None:
        raise NotImplementedError

    def _new_lock(self, key: str, holder: str, granted: Any, ttl: float) -> LockBase:
        raise NotImplementedError

    def _state_changed(self) -> None:
        pass

    def _locks_changed(self) -> None:
        """Locks were restored or lost: wake `wait_restored` / `restored_wait`."""

    def _started(self, resp: Any) -> None:
        if resp.WhichOneof("event") != "started":
            raise Unavailable(
                f"protocol error: the stream opened with {resp.WhichOneof('event')!r}, "
                "not SessionStarted"
            )
        self.session_id = resp.started.session_id
        self.default_ttl = seconds(resp.started.default_ttl)
        self.resume_token = resp.started.resume_token

    def _dispatch(self, resp: Any) -> None:
        """Routes one message (called with the mutex held / on the loop)."""
        kind = resp.WhichOneof("event")
        if kind in _ANSWERS:
            self._answered(kind, resp)
            return
        if kind == "lost":
            lost = resp.lost
            hk = (lost.holder, lost.key)
            self._jeopardy.pop(hk, None)
            for lock in self._held.pop(hk, ()):
                lock._mark_lost(lost.reason or "Lost")
            return
        if kind == "jeopardy":
            j = resp.jeopardy
            left = seconds(j.ttl_remaining)
            self._jeopardy[(j.holder, j.key)] = time.monotonic() + left
            log.warning(
                "lock %r%s in jeopardy: renewals failing, %.3fs of validity left",
                j.key,
                f" (holder {j.holder!r})" if j.holder else "",
                left,
            )
            return
        if kind == "restored":
            r = resp.restored
            self._jeopardy.pop((r.holder, r.key), None)
            log.info("lock %r%s restored", r.key, f" (holder {r.holder!r})" if r.holder else "")
            return
        if kind == "waiting":
            log.debug("waiting for %r (position %d)", resp.waiting.key, resp.waiting.position)
            return
        log.debug("ignoring %s", kind)

    def _answered(self, kind: str, resp: Any) -> None:
        """Routes an answer to the request it answers."""
        answer = getattr(resp, kind)
        pending = self._pending.pop(answer.request_id, None)
        if pending is None:
            # The answer to an abandoned cancel-Release, or to a Release this session
            # sent on its own (a grant nobody waited for, a hold found after a resume).
            return
        if kind == "granted":
            holder = answer.holder
            if holder != pending.holder and not self._legacy:
                self._legacy = True
                log.warning(
                    "the sidecar granted %r to the session, not to holder %r: it predates "
                    "holders, so this client's threads and tasks share its locks "
                    "(reentrant) rather than exclude each other; upgrade the sidecar",
                    pending.key,
                    pending.holder,
                )
            if pending.abandoned:
                # Nobody waits for this grant any more: give it back at once.
                self._send_nowait(release_request(next(self._ids), pending.key, holder))
                return
            lock = self._new_lock(pending.key, holder, answer, pending.ttl or self.default_ttl)
            self._held.setdefault((holder, pending.key), []).append(lock)
            pending.resolve(lock)
        else:
            pending.resolve(resp)

    def _holds(self, holder: str, key: str) -> bool:
        """Whether `holder` holds `key` here (on a sidecar without holders, whether the
        session does)."""
        return (holder, key) in self._held or (self._legacy and ("", key) in self._held)

    def _abandon(self, rid: int, pending: Pending) -> None:
        """The caller stopped waiting for `rid` (mutex held / on the loop).

        A Release of a key the holder only waits for cancels the wait; if the holder
        holds the key, such a Release would give back a hold instead, so then the grant
        (which comes at once for a held key) is given back when it arrives.
        """
        if self._pending.get(rid) is not pending:
            # Answered meanwhile. A grant nobody will use is given back at once.
            lock = pending.response
            if isinstance(lock, LockBase) and lock.held and self.state is not ENDED:
                lock._state = "released"
                self._forget(lock)
                self._send_nowait(release_request(next(self._ids), lock.key, lock.holder))
            return
        pending.abandoned = True
        if (
            pending.kind == "acquire"
            and not self._holds(pending.holder, pending.key)
            and self.state is OPEN
        ):
            del self._pending[rid]
            self._send_nowait(release_request(next(self._ids), pending.key, pending.holder))

    def _end(self, reason: str, code: Optional[grpc.StatusCode] = None) -> None:
        """The session is over: fail what waits, lose what is held (mutex held /
        loop). A client that closes lets its locks go: `lost` is set, `release()` does
        nothing more; either way one log line, however many locks."""
        if self.state is ENDED:
            return
        self.state = ENDED
        self.ended = reason
        pending, self._pending = self._pending, {}
        for p in pending.values():
            p.resolve(error=Unavailable(f"lease stream ended: {reason}", code))
        held, self._held = self._held, {}
        locks = [lock for grants in held.values() for lock in grants]
        if self._closing:
            for lock in locks:
                lock._let_go(reason)
            if locks:
                log.info(
                    "session %s closed with %d lock(s) held: the sidecar releases them",
                    self.session_id,
                    len(locks),
                )
        else:
            for lock in locks:
                lock._mark_lost(reason, quiet=True)
            _log_lost(locks, reason)
        self._gone_by.clear()
        self._locks_changed()
        self._state_changed()

    def _inherited(self) -> None:
        """In a forked child: the session is the parent's. Its locks are not held here
        (`lost` set, `release()` does nothing) and nothing is sent: the child never
        touches the parent's stream. Called before any other thread of the child runs."""
        self.state = ENDED
        self.ended = f"the session belongs to process {self.pid}, which forked this one"
        self._pending = {}
        held, self._held = self._held, {}
        for grants in held.values():
            for lock in grants:
                lock._let_go(f"held by process {self.pid}, the parent of this forked process")
        self._gone_by.clear()
        self._jeopardy.clear()

    # -- resuming -------------------------------------------------------------

    def _broke(self, reason: str, code: Optional[grpc.StatusCode], details: str = "") -> bool:
        """The stream ended with `code` (None: without a status). Either ends the
        session or suspends its locks and starts resuming it; True when the caller is
        to resume it."""
        if self.state is ENDED:
            return False
        if self._closing:
            self._end("client closed", code)
            return False
        why_not = self._not_resumable(code, details)
        if why_not is not None:
            self._end(f"{reason}{why_not}", code)
            return False
        # First of all: a live sidecar releases these locks within milliseconds of
        # seeing the stream end (its --broken-grace), and a waiter elsewhere is granted.
        for locks in self._held.values():
            for lock in locks:
                lock._suspend()
        self.state = RESUMING
        self._broke_reason = reason
        log.warning(
            "lease stream broke (%s): %d lock(s) suspended; resuming session %s",
            reason,
            sum(len(locks) for locks in self._held.values()),
            self.session_id,
        )
        # The sidecar does not resume waits in progress: their callers hear it now.
        for rid, p in list(self._pending.items()):
            if p.kind == "acquire":
                del self._pending[rid]
                p.resolve(
                    error=Unavailable(
                        f"the stream to the sidecar broke while waiting ({reason}); the "
                        "sidecar does not resume waits in progress: ask again",
                        code,
                    )
                )
        # The store keeps a lock at most its TTL after the last renewal, which came
        # before the break (or until the time an open Jeopardy gave): after that no
        # resume can bring it back.
        now = time.monotonic()
        for hk, locks in self._held.items():
            until = self._jeopardy.get(hk)
            if until is None:
                until = now + max(lock._ttl_asked for lock in locks)
            self._gone_by[hk] = until
        return self._expire(now) is not None

    def _not_resumable(self, code: Optional[grpc.StatusCode], details: str) -> Optional[str]:
        """Why the session cannot be resumed after its stream ended with `code` (a
        suffix for the reason its locks are lost), or None when it can be."""
        if not self._held:
            return ""  # nothing to resume: the next lock() opens a new session
        if code not in RESUMABLE_CODES:
            return ""  # the sidecar ended the stream on purpose: it released everything
        # A sidecar stopping cleanly (SIGTERM) sends `Lost` for every lock, releases,
        # then ends its streams UNAVAILABLE saying so: nothing is left to resume.
        if "shutting down" in details:
            return ""
        if not self.resume:
            return " (resume=False)"
        if not self.resume_token:
            return (
                "; the sidecar's store cannot resume sessions (it gave no resume token: "
                "the embedded memory store), so its locks are gone"
            )
        return None

    def _expire(self, now: float) -> Optional[float]:
        """While resuming: loses every lock whose TTL has passed since the break (the
        store has let it go); returns the next time one will, or None when nothing is
        held any more (the session then ends)."""
        if self.state is not RESUMING:
            return None
        why = (
            f"the stream to the sidecar broke ({self._broke_reason}) and the session was "
            "not resumed before the lock's TTL passed (the store has let it go)"
        )
        expired: List[LockBase] = []
        for hk, until in list(self._gone_by.items()):
            if until <= now:
                del self._gone_by[hk]
                expired.extend(self._held.pop(hk, ()))
        for lock in expired:
            lock._mark_lost(why, quiet=True)
        _log_lost(expired, why)
        if not self._held:
            self._end(why, grpc.StatusCode.UNAVAILABLE)
            return None
        if expired:
            self._locks_changed()
        return min(self._gone_by.values())

    def _resumed(self, started: Any, greeting: Sequence[Any]) -> List[bytes]:
        """A resume attempt was answered: `started` (the new `SessionStarted`), then
        `greeting`, a `Granted` (request_id 0, with its holder) or `Lost` per grant of
        the session's record. Reconciles what each holder holds with what came back
        and returns the requests to send on the new stream, in order (mutex held /
        loop).

        A holder's key comes back with its hold count in the store; a Release that was
        not answered may have been applied before the sidecar died, so as many of those
        as the count says were are taken as answered, and the others are sent again.
        Holds the store has and nobody here knows of (a grant whose answer was lost, a
        lock already reported lost) are given back.
        """
        self.state = OPEN
        self.resume_token = started.resume_token
        self._gone_by.clear()
        self._jeopardy.clear()
        granted: Dict[HolderKey, Any] = {}
        lost: Dict[HolderKey, str] = {}
        for resp in greeting:
            kind = resp.WhichOneof("event")
            if kind == "granted":
                granted[(resp.granted.holder, resp.granted.key)] = resp.granted
            elif kind == "lost":
                lost[(resp.lost.holder, resp.lost.key)] = resp.lost.reason
        out: List[bytes] = []
        gone: List[LockBase] = []

        def give_back(hk: HolderKey, holds: int) -> None:
            for _ in range(holds):
                out.append(release_request(next(self._ids), hk[1], hk[0]))

        def lose(hk: HolderKey, reason: str) -> None:
            for lock in self._held.pop(hk):
                lock._mark_lost(reason, quiet=True)
                gone.append(lock)

        releases: Dict[HolderKey, List[int]] = {}
        for rid in sorted(self._pending):
            p = self._pending[rid]
            if p.kind == "release":
                releases.setdefault((p.holder, p.key), []).append(rid)
        for hk in list(self._held):
            locks = self._held[hk]
            back = granted.pop(hk, None)
            if back is None or back.fencing_token != locks[0].fencing_token:
                reason = lost.get(hk) or "the resumed session did not list it"
                lose(hk, f"lost while the sidecar was away: {reason}")
                if back is not None:
                    give_back(hk, back.hold_count)
                continue
            unanswered = releases.get(hk, [])
            applied = min(len(unanswered), max(0, len(locks) - back.hold_count))
            for rid in unanswered[:applied]:
                done = self._pending.pop(rid)
                done.resolve(
                    pb.LeaseResponse(
                        released=pb.Released(request_id=rid, key=hk[1], holder=hk[0])
                    )
                )
            surplus = back.hold_count + applied - len(locks)
            if surplus < 0:
                # Fewer holds than grants known here: nothing explains it; do not
                # count on any of them.
                lose(hk, "the resumed session holds the key fewer times than granted")
                give_back(hk, back.hold_count)
                continue
            give_back(hk, surplus)
        for hk, back in granted.items():
            give_back(hk, back.hold_count)
        _log_lost(gone, "not held by the resumed session (each lock's lost_reason says why)")
        # Unanswered releases and proclaims go again, in their order; those of locks
        # that did not come back fail now (their locks are lost).
        for rid in sorted(self._pending):
            p = self._pending[rid]
            if p.kind != "acquire" and (p.holder, p.key) in self._held:
                out.append(p.request)
                continue
            del self._pending[rid]
            if p.kind == "acquire":  # (none: acquires wait for the resume to end)
                p.resolve(error=Unavailable("the session was resumed: ask again"))
            else:
                p.resolve(error=Unavailable("the lock was lost while the sidecar was away"))
        # Listed with their tokens: nobody else can have held them in between.
        for locks in self._held.values():
            for lock in locks:
                lock._restore()
        log.warning(
            "session %s resumed: %d lock(s) restored, %d request(s) sent again",
            self.session_id,
            sum(len(locks) for locks in self._held.values()),
            len(out),
        )
        self._locks_changed()
        self._state_changed()
        return out

    # -- answers ----------------------------------------------------------------

    def _answer(self, key: str, pending: Pending) -> Any:
        """Turns a resolved acquire into a lock or an exception."""
        if pending.error is not None:
            raise pending.error
        resp = pending.response
        if isinstance(resp, LockBase):
            return resp
        kind = resp.WhichOneof("event")
        if kind == "not_acquired":
            reason = pb.NotAcquired.Reason.Name(resp.not_acquired.reason)
            raise NotAcquired(key, reason.replace("REASON_", ""))
        if kind == "rejected":
            raise Rejected(key, resp.rejected.code, resp.rejected.message)
        raise Unavailable(f"protocol error: {kind!r} answered an acquire")

    def _released(self, lock: LockBase, pending: Pending) -> None:
        """Turns a resolved release into done or an exception (mutex held / loop)."""
        if pending.error is None and pending.response.WhichOneof("event") == "released":
            lock._state = "released"
            self._forget(lock)
            return
        if lock._state == "released":
            return  # let go meanwhile: the client closed
        if lock._state == "lost" or pending.error is not None:
            # Lost before the release (a Lost crossing the Release is answered
            # FAILED_PRECONDITION), or the session ended: the sidecar may have died
            # with the lock in the store, so the lock counts as lost.
            if lock.lost_reason is None:
                lock.lost_reason = str(pending.error)
            lock._state = "released"
            self._forget(lock)
            raise lock._lost_error()
        r = pending.response.rejected
        raise Rejected(lock.key, r.code, r.message)

    def _proclaimed(self, lock: LockBase, pending: Pending) -> None:
        """Turns a resolved proclaim into done or an exception (mutex held / loop)."""
        if pending.error is None and pending.response.WhichOneof("event") == "proclaimed":
            return
        if lock._state == "lost":
            # Not held any more: the sidecar sends `Lost` before refusing the proclaim.
            raise lock._lost_error()
        if pending.error is not None:
            raise pending.error
        r = pending.response.rejected
        raise Rejected(lock.key, r.code, r.message)

    def _forget(self, lock: LockBase) -> None:
        hk = (lock.holder, lock.key)
        locks = self._held.get(hk)
        if locks and lock in locks:
            locks.remove(lock)
            if not locks:
                del self._held[hk]
                self._jeopardy.pop(hk, None)
