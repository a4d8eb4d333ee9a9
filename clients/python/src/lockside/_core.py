"""What the sync and the asyncio clients share: errors, options, the answer routing of
one session, and the state of one lock. Nothing here does I/O."""

from __future__ import annotations

import itertools
import logging
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import grpc

try:
    from lockside._pb import lockside_pb2 as pb
except ImportError as e:  # pragma: no cover - only a source tree without a build
    raise ImportError(
        "lockside: the generated stubs (lockside._pb) are missing; install the package "
        "(`pip install ./clients/python`) rather than importing it from the source tree"
    ) from e

log = logging.getLogger("lockside")

#: Where clients find the sidecar unless told otherwise (the sidecar's default).
DEFAULT_ADDR = "127.0.0.1:7420"

#: The longest wait the sidecar accepts; `wait=None` asks for it ("wait as long as it
#: takes").
MAX_WAIT = 24 * 3600.0

#: How long past its own wait an answer may take before the client gives up on it:
#: the sidecar answers every request, so only a broken sidecar or network hits this.
ANSWER_SLACK = 10.0

LEASE_METHOD = "/lockside.v1.LockService/Lease"
DESCRIBE_METHOD = "/lockside.v1.LockService/Describe"
WATCH_METHOD = "/lockside.v1.LockService/Watch"

#: The longest holder value the sidecar accepts (`Acquire.value`, `Proclaim.value`).
MAX_VALUE_BYTES = 4096

#: HTTP/2 keepalive well below the lock TTL (README, "Client guidance"): a frozen or
#: unreachable sidecar is noticed in about 2 s and the stream fails, which marks every
#: lock of the session lost before the store can let it go (TTL >= 1 s, renewed at
#: TTL/3).
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


def default_addr() -> str:
    """$LOCKSIDE_ADDR, else 127.0.0.1:7420."""
    return os.environ.get("LOCKSIDE_ADDR") or DEFAULT_ADDR


def channel_target(addr: str) -> str:
    """A gRPC target from what users write: `host:port`, `unix:/path`, or an
    `http://host:port` URL as the sidecar's own CLI accepts."""
    if addr.startswith("http://"):
        return addr[len("http://") :].rstrip("/")
    return addr


# -- errors -------------------------------------------------------------------


class LocksideError(Exception):
    """Base class of every error this package raises."""


def _short(key: str) -> str:
    """A key as messages show it: a bad 100 KB key is not repeated in full."""
    return repr(key) if len(key) <= 80 else f"{key[:60]!r}... ({len(key)} characters)"


class NotAcquired(LocksideError):
    """The lock was not acquired: `reason` is "BUSY" (held and `wait=0`), "TIMEOUT"
    (still held when `wait` ran out) or "CANCELLED"."""

    def __init__(self, key: str, reason: str):
        super().__init__(f"lock {_short(key)} not acquired: {reason}")
        self.key = key
        self.reason = reason


class Rejected(LocksideError):
    """The sidecar refused a request: a bad value (`code` 3 INVALID_ARGUMENT), a limit
    reached (8 RESOURCE_EXHAUSTED), a conflicting mode or limit (9 FAILED_PRECONDITION),
    or a store it cannot reach (14 UNAVAILABLE). The session and its other locks go on.
    """

    def __init__(self, key: str, code: int, message: str):
        self.key = key
        self.code = code
        self.code_name = _code_name(code)
        self.message = message
        super().__init__(f"request for {_short(key)} rejected: {self.code_name} ({code}): {message}")


class LockLost(LocksideError):
    """The lock was lost while held: the sidecar sent `Lost` (renewals failed) or the
    session's stream broke. Raised by `release()` (so by leaving a `with` block) when
    the lock was lost before it: the work done under it may have overlapped with
    another holder; the fencing token is what protects the resource then."""

    def __init__(self, key: str, reason: str, fencing_token: int):
        super().__init__(f"lock {_short(key)} lost: {reason}")
        self.key = key
        self.reason = reason
        self.fencing_token = fencing_token


class Unavailable(LocksideError):
    """The sidecar could not be reached, or the session's stream broke before it
    answered. `code` is the gRPC status of the stream when there was one."""

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None):
        super().__init__(message)
        self.code = code


def _code_name(code: int) -> str:
    for status in grpc.StatusCode:
        if status.value[0] == code:
            return status.name
    return "UNKNOWN_CODE"


def rpc_error_text(e: BaseException) -> Tuple[str, Optional[grpc.StatusCode]]:
    """A short description of a failed stream or call, and its status code."""
    if isinstance(e, grpc.RpcError) and hasattr(e, "code"):
        code = e.code()
        details = e.details() if hasattr(e, "details") else ""
        return f"{code.name}: {details}", code
    return f"{type(e).__name__}: {e}", None


def call_error(key: str, e: grpc.RpcError) -> LocksideError:
    """A failed unary call (Describe) as this package's error."""
    text, code = rpc_error_text(e)
    if code is None or code in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
    ):
        return Unavailable(text, code)
    return Rejected(key, code.value[0], e.details() or "")


# -- options ------------------------------------------------------------------


def _set_seconds(target: Any, name: str, value: Any) -> None:
    """Writes `value` seconds into the Duration field `target`. (The field's own class
    is filled in place: the stubs live in a private descriptor pool, so protobuf's
    global `Duration` class is not theirs.)"""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    whole = int(value)
    target.seconds = whole
    target.nanos = int(round((value - whole) * 1e9))


def value_bytes(value: Any) -> bytes:
    """A holder value as bytes: `bytes`-like as it is, `str` in UTF-8. (Its size is
    the sidecar's to check: over 4 KiB it answers `Rejected` INVALID_ARGUMENT.)"""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"value must be bytes or str, not {type(value).__name__}")


def acquire_request(
    request_id: int,
    key: str,
    wait: Optional[float],
    ttl: Optional[float],
    shared: bool,
    limit: int,
    fair: bool,
    value: Any = b"",
) -> Tuple[Any, float]:
    """The `LeaseRequest` for one acquire, and how long to wait for its answer.

    Only what cannot be encoded is checked here (types, negative or infinite numbers);
    the rules on values (key length and characters, TTL range, mode with limit) are the
    sidecar's, and break them and it answers `Rejected` with a clear message.
    """
    if not isinstance(key, str):
        raise TypeError(f"key must be a str, not {type(key).__name__}")
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be an int, not {type(limit).__name__}")
    if not 0 <= limit <= 0xFFFFFFFF:
        raise ValueError(f"limit must be between 0 and 2**32-1, got {limit}")
    acquire = pb.Acquire(
        request_id=request_id,
        key=key,
        mode=pb.LOCK_MODE_SHARED if shared else pb.LOCK_MODE_EXCLUSIVE,
        limit=limit,
        fair=bool(fair),
        value=value_bytes(value),
    )
    wait_s = MAX_WAIT if wait is None else wait
    if isinstance(wait_s, (int, float)) and not isinstance(wait_s, bool) and wait_s == 0:
        pass  # unset: do not wait
    else:
        _set_seconds(acquire.wait_timeout, "wait", wait_s)
    if ttl is not None:
        _set_seconds(acquire.ttl, "ttl", ttl)
    return pb.LeaseRequest(acquire=acquire), float(wait_s) + ANSWER_SLACK


def release_request(request_id: int, key: str) -> Any:
    return pb.LeaseRequest(release=pb.Release(request_id=request_id, key=key))


def proclaim_request(request_id: int, key: str, value: Any) -> Any:
    return pb.LeaseRequest(
        proclaim=pb.Proclaim(request_id=request_id, key=key, value=value_bytes(value))
    )


def seconds(d: Any) -> float:
    return d.seconds + d.nanos / 1e9


# -- describe ------------------------------------------------------------------


@dataclass(frozen=True)
class Holder:
    """One session holding a key."""

    session_id: str
    hold_count: int
    #: Seconds before the store lets the lock go if it is not renewed.
    ttl_remaining: float
    client_name: str
    #: The holder's value (`lock(value=...)`, `campaign()`, `proclaim()`): in an
    #: election, who leads and where. b"" for none.
    value: bytes = b""
    #: The fencing token of the holder's grant: successive leaders have larger ones.
    fencing_token: int = 0


@dataclass(frozen=True)
class QueueEntry:
    """One fair waiter of a key; `position` 1 is next in line."""

    session_id: str
    client_name: str
    mode: str
    position: int


@dataclass(frozen=True)
class Description:
    """The store's view of one key (`Client.describe`, each state of `Client.watch`)."""

    key: str
    #: "EXCLUSIVE", "SHARED", or "UNSPECIFIED" when nobody holds it.
    mode: str
    #: 1 for a lock, N for a semaphore of N permits, 0 when nobody holds the key.
    limit: int
    holders: Sequence[Holder]
    waiters: int
    #: The last fencing token issued for the key (0 if none ever was).
    fencing_token: int
    queue: Sequence[QueueEntry]

    @property
    def leader(self) -> Optional[Holder]:
        """The holder of an election key (None when nobody leads); for a key held by
        several (shared, a semaphore), the oldest grant."""
        return min(self.holders, key=lambda h: h.fencing_token, default=None)


def _mode_name(mode: int) -> str:
    return pb.LockMode.Name(mode).replace("LOCK_MODE_", "")


def description(r: Any) -> Description:
    return Description(
        key=r.key,
        mode=_mode_name(r.mode),
        limit=r.limit,
        holders=tuple(
            Holder(
                h.session_id,
                h.hold_count,
                seconds(h.ttl_remaining),
                h.client_name,
                bytes(h.value),
                h.fencing_token,
            )
            for h in r.holders
        ),
        waiters=r.waiters,
        fencing_token=r.fencing_token,
        queue=tuple(
            QueueEntry(q.session_id, q.client_name, _mode_name(q.mode), q.position)
            for q in r.queue
        ),
    )


def call_metadata(client_name: Optional[str], auth_token: Optional[str]) -> Tuple:
    md = []
    if client_name:
        md.append(("lockside-client-name", client_name))
    if auth_token:
        md.append(("authorization", f"Bearer {auth_token}"))
    return tuple(md)


# -- one lock -------------------------------------------------------------------


class LockBase:
    """A granted lock; the sync and asyncio `Lock` add how `lost` is signalled and how
    `release()` waits.

    Attributes:
      key            the lock's name.
      fencing_token  pass it to the resource you protect; it must reject lower ones.
      ttl            seconds of validity the sidecar reported with the grant (it renews
                     the lock for as long as the session lives).
      hold_count     how many times the session held the key after this grant
                     (reentrancy: each grant is released on its own).
      session_id     the session shown by `describe()`.
      lost_reason    why the lock was lost, once it is.
    """

    def __init__(self, session: "SessionBase", key: str, granted: Any):
        self._session = session
        self.key = key
        self.fencing_token: int = granted.fencing_token
        self.ttl: float = seconds(granted.ttl)
        self.hold_count: int = granted.hold_count
        self.session_id: str = session.session_id
        self.lost_reason: Optional[str] = None
        # held -> released | lost; a lost lock raises LockLost once, on release.
        self._state = "held"

    @property
    def held(self) -> bool:
        """True until the lock is released or lost."""
        return self._state == "held"

    def _signal_lost(self) -> None:
        raise NotImplementedError

    def _mark_lost(self, reason: str) -> None:
        """Called with the session's mutex held (sync) or on the loop (asyncio)."""
        if self._state != "held":
            return
        self._state = "lost"
        self.lost_reason = reason
        self._signal_lost()

    def _lost_error(self) -> LockLost:
        return LockLost(self.key, self.lost_reason or "lost", self.fencing_token)

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.key!r} token={self.fencing_token} "
            f"state={self._state}>"
        )


# -- one session -----------------------------------------------------------------


class Pending:
    """A request waiting for its answer. `kind` is "acquire", "release" or "proclaim";
    the sync and asyncio sessions subclass it with how the waiter is woken
    (`_notify`)."""

    __slots__ = ("kind", "key", "abandoned", "response", "error")

    def __init__(self, kind: str, key: str):
        self.kind = kind
        self.key = key
        self.abandoned = False  # the caller gave up (timeout, interrupt, cancel)
        self.response: Any = None
        self.error: Optional[BaseException] = None

    def _notify(self) -> None:
        raise NotImplementedError

    def resolve(self, response: Any = None, error: Optional[BaseException] = None) -> None:
        self.response = response
        self.error = error
        self._notify()


class SessionBase:
    """The answer routing of one `Lease` stream, shared by both clients.

    The session owns the stream; requests carry ids from one counter so answers are
    matched by `request_id`, and `Lost` is routed by key to every lock this session
    holds on it (reentrant grants share a key). When the stream ends, every pending
    request fails and every held lock is lost: the client then opens a new session for
    the next request. A later resume (DESIGN.md, "Sessions that survive a sidecar
    restart") fits here: `SessionStarted.resume_token` kept by the session, grants with
    request_id 0 matched to `held` by key.
    """

    def __init__(self) -> None:
        self.session_id = ""
        self.default_ttl = 0.0
        self.ended: Optional[str] = None  # why the stream ended, once it has
        self._ids = itertools.count(1)
        self._pending: Dict[int, Pending] = {}
        self._held: Dict[str, List[LockBase]] = {}

    # Subclasses: how to send a request without waiting (from the reader), how to make
    # a lock, and how to wake a waiter.
    def _send_nowait(self, request: Any) -> None:
        raise NotImplementedError

    def _new_lock(self, key: str, granted: Any) -> LockBase:
        raise NotImplementedError

    def _started(self, resp: Any) -> None:
        if resp.WhichOneof("event") != "started":
            raise Unavailable(
                f"protocol error: the stream opened with {resp.WhichOneof('event')!r}, "
                "not SessionStarted"
            )
        self.session_id = resp.started.session_id
        self.default_ttl = seconds(resp.started.default_ttl)

    def _dispatch(self, resp: Any) -> None:
        """Routes one message (called with the mutex held / on the loop)."""
        kind = resp.WhichOneof("event")
        if kind == "lost":
            lost = resp.lost
            for lock in self._held.pop(lost.key, ()):
                log.warning("lock %r lost: %s", lost.key, lost.reason)
                lock._mark_lost(lost.reason or "Lost")
            return
        if kind == "jeopardy":
            log.warning(
                "lock %r in jeopardy: renewals failing, %.3fs of validity left",
                resp.jeopardy.key,
                seconds(resp.jeopardy.ttl_remaining),
            )
            return
        if kind == "restored":
            log.info("lock %r restored", resp.restored.key)
            return
        if kind == "waiting":
            log.debug("waiting for %r (position %d)", resp.waiting.key, resp.waiting.position)
            return
        if kind not in ("granted", "not_acquired", "rejected", "released", "proclaimed"):
            log.debug("ignoring %s", kind)
            return
        answer = getattr(resp, kind)
        pending = self._pending.pop(answer.request_id, None)
        if pending is None:
            # The answer to an abandoned cancel-Release, or (later) a resumed grant.
            return
        if kind == "granted":
            if pending.abandoned:
                # Nobody waits for this grant any more: give it back at once.
                self._send_nowait(release_request(next(self._ids), pending.key))
                return
            lock = self._new_lock(pending.key, answer)
            self._held.setdefault(pending.key, []).append(lock)
            pending.resolve(lock)
        else:
            pending.resolve(resp)

    def _abandon(self, rid: int, pending: Pending) -> None:
        """The caller stopped waiting for `rid` (mutex held / on the loop).

        A Release of a key only waited for cancels the wait; if this session holds the
        key, such a Release would give back a hold instead, so then the grant (which
        comes at once for a held key) is given back when it arrives.
        """
        if self._pending.get(rid) is not pending:
            # Answered meanwhile. A grant nobody will use is given back at once.
            lock = pending.response
            if isinstance(lock, LockBase) and lock.held and not self.ended:
                lock._state = "released"
                self._forget(lock)
                self._send_nowait(release_request(next(self._ids), lock.key))
            return
        pending.abandoned = True
        if pending.kind == "acquire" and not self._held.get(pending.key) and not self.ended:
            del self._pending[rid]
            self._send_nowait(release_request(next(self._ids), pending.key))

    def _end(self, reason: str, code: Optional[grpc.StatusCode] = None) -> None:
        """The stream ended: fail what waits, lose what is held (mutex held / loop)."""
        if self.ended is not None:
            return
        self.ended = reason
        pending, self._pending = self._pending, {}
        for p in pending.values():
            p.resolve(error=Unavailable(f"lease stream ended: {reason}", code))
        held, self._held = self._held, {}
        for locks in held.values():
            for lock in locks:
                if lock.held:
                    log.warning("lock %r lost: %s", lock.key, reason)
                lock._mark_lost(reason)

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
        if lock._state == "lost" or pending.error is not None:
            # Lost before the release (a Lost crossing the Release is answered
            # FAILED_PRECONDITION), or the stream broke: the sidecar may have died
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
        locks = self._held.get(lock.key)
        if locks and lock in locks:
            locks.remove(lock)
            if not locks:
                del self._held[lock.key]
