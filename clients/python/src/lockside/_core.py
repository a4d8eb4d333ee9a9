"""One session's decisions, shared by the sync and the asyncio clients (`SessionBase`):
the requests it sends and how long each may wait, the answers routed to them,
holders' grants, `Lost` and `Jeopardy`, the checks of a release or a proclaim, and the
session's end (closed, or inherited by a forked child); what a broken stream does is
`Resuming` (`_resume.py`), which `SessionBase` is built on. Nothing here does I/O: the
clients' sessions (`_sync_session.py`, `_aio_session.py`) send, read, wait and run
timers. The package's layout is listed in `__init__.py`."""

from __future__ import annotations

import itertools
import logging
import os
import time
from typing import Any, Dict, List, Optional, Tuple, TypeVar, cast

import grpc

from lockside import _wire
from lockside._describe import seconds
from lockside._errors import LocksideError, NotAcquired, Rejected, Unavailable
from lockside._lock import HolderKey, LockBase, log_lost
from lockside._pb import lockside_pb2 as pb
from lockside._resume import ENDED as ENDED
from lockside._resume import OPEN as OPEN
from lockside._resume import RESUMING as RESUMING
from lockside._resume import Resuming
from lockside._wire import proclaim_request
from lockside._wire import release_request as release_request

log = logging.getLogger("lockside")

#: How long past its own wait an answer may take before the client gives up on it:
#: the sidecar answers every request, so only a broken sidecar or network hits this.
ANSWER_SLACK = 10.0

#: `lock()`'s options as a session's `acquire` takes them: wait, ttl, shared, limit,
#: fair, value.
Options = Tuple[Optional[float], Optional[float], bool, int, bool, Any]


class Pending:
    """A request waiting for its answer. `kind` is "acquire", "release" or "proclaim";
    `request` is what was sent (a release or a proclaim is sent again after a resume,
    since the old stream may have broken before it arrived); `timeout` is how long its
    answer may take. The sync and asyncio sessions subclass it with how the waiter is
    woken (`_notify`)."""

    __slots__ = (
        "kind", "key", "holder", "request", "ttl", "timeout", "abandoned", "response", "error"
    )

    def __init__(
        self,
        kind: str,
        key: str,
        request: bytes = b"",
        ttl: float = 0.0,
        holder: str = "",
        timeout: float = ANSWER_SLACK,
    ):
        self.kind = kind
        self.key = key
        self.holder = holder
        self.request = request
        self.ttl = ttl  # an acquire's TTL (asked, or the session's default)
        self.timeout = timeout
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

L = TypeVar("L", bound=LockBase)
P = TypeVar("P", bound=Pending)


class SessionBase(Resuming[L, P]):
    """Every decision of one session, shared by both clients (`L` is their lock, `P`
    their pending request); no I/O here.

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
    survive a sidecar restart"), with backoff, until one answers (`_take_resume`:
    `_resumed` restores the locks it lists with their tokens, holder by holder, loses
    the others, and says what to send again) or every lock's time has passed (`_expire`
    loses them); see `Resuming`. A session without a resume token (a store that cannot
    resume: the embedded memory store) loses every lock at the break. Otherwise, when
    the stream ends, every pending request fails and every held lock is lost, and the
    client opens a new session for the next request.

    The sync session calls every method here with its mutex held; the asyncio session
    on its event loop.
    """

    def __init__(self, resume: bool = True, metadata: Tuple[Tuple[str, str], ...] = ()):
        super().__init__()
        self.session_id = ""
        self.default_ttl = 0.0
        self.resume_token = ""
        self.resume = resume
        self.state = OPEN
        self.ended: Optional[str] = None  # why the session ended, once it has
        # The process the session belongs to: a forked child has its own (`_inherited`).
        self.pid = os.getpid()
        self._metadata = metadata  # the client's, on every stream of the session
        self._closing = False
        self._ids = itertools.count(1)
        self._pending: Dict[int, P] = {}
        self._held: Dict[HolderKey, List[L]] = {}
        # Locks in Jeopardy: when the store lets them go unless a renewal succeeds
        # (time.monotonic()).
        self._jeopardy: Dict[HolderKey, float] = {}
        # The sidecar answered a holder's grant without its holder: it predates holders
        # and grants to the session, so every lock is the session's ("" holder).
        self._legacy = False

    # Subclasses: how to send an encoded request without waiting (dropped unless the
    # session is OPEN: a resume reconciles hold counts), how to make a lock and a
    # pending request; and (see `Resuming`) how to run a timer and wake waiters.
    def _send_nowait(self, request: bytes) -> None:
        raise NotImplementedError

    def _new_lock(self, key: str, holder: str, granted: Any, ttl: float) -> L:
        raise NotImplementedError

    def _new_pending(
        self, kind: str, key: str, request: bytes, ttl: float, holder: str, timeout: float
    ) -> P:
        raise NotImplementedError

    def _started(self, resp: Any) -> None:
        if resp.WhichOneof("event") != "started":
            raise Unavailable(
                f"protocol error: the stream opened with {resp.WhichOneof('event')!r}, "
                "not SessionStarted"
            )
        self.session_id = resp.started.session_id
        self.default_ttl = seconds(resp.started.default_ttl)
        self.resume_token = resp.started.resume_token

    # -- requests ---------------------------------------------------------------

    def _acquiring(self, key: str, options: Options, holder: str) -> Tuple[int, P]:
        """An acquire's id and its request, not sent yet; it may take the wait it asks
        for and `ANSWER_SLACK`.

        Only what cannot be encoded is checked here (types, negative or infinite
        numbers: `TypeError`, `ValueError`); the rules on values (key length and
        characters, TTL range, mode with limit, holder names) are the sidecar's, and
        break them and it answers `Rejected` with a clear message.
        """
        wait, ttl, shared, limit, fair, value = options
        rid = next(self._ids)
        data, wait = _wire.acquire_request(rid, key, wait, ttl, shared, limit, fair, value, holder)
        timeout = wait + ANSWER_SLACK
        return rid, self._new_pending("acquire", key, data, ttl or 0.0, holder, timeout)

    def _releasing(self, lock: L) -> Optional[Tuple[int, P]]:
        """A release's id and its request, not sent yet; None when `lock` is released
        already. Raises `LockLost` (once) for a lock lost while held."""
        if lock._state == "released":
            return None
        if lock._state == "lost":
            lock._state = "released"  # LockLost is raised once
            raise lock._lost_error()
        rid = next(self._ids)
        data = release_request(rid, lock.key, lock.holder)
        return rid, self._new_pending("release", lock.key, data, 0.0, lock.holder, ANSWER_SLACK)

    def _proclaiming(self, lock: L, value: bytes) -> Tuple[int, P]:
        """A proclaim's id and its request, not sent yet; raises `LockLost` for a lock
        lost, `LocksideError` for one released."""
        if lock._state == "lost":
            raise lock._lost_error()
        if lock._state == "released":
            raise LocksideError(f"lock {lock.key!r} was released")
        rid = next(self._ids)
        data = proclaim_request(rid, lock.key, value, lock.holder)
        return rid, self._new_pending("proclaim", lock.key, data, 0.0, lock.holder, ANSWER_SLACK)

    def _submit(self, rid: int, pending: P) -> None:
        """Awaits the answer to `rid` and sends it (at once while the session is open;
        while it resumes, the resume sends it)."""
        self._pending[rid] = pending
        self._send_nowait(pending.request)

    def _overdue(self, rid: int, pending: P) -> Optional[Unavailable]:
        """The answer to `rid` took longer than `pending.timeout`: the error its caller
        gets (the request is then abandoned), or None to wait on (answered meanwhile, or
        a release or proclaim that a resume sends again, or fails)."""
        if self._pending.get(rid) is not pending:
            return None
        if self.state is RESUMING and pending.kind != "acquire":
            return None
        self._abandon(rid, pending)
        return Unavailable(f"no answer from the sidecar within {pending.timeout:g}s")

    def _check_not_ended(self) -> None:
        """Once a resume is over: raises if it ended the session."""
        if self.state is ENDED:
            raise Unavailable(f"lease stream ended: {self.ended}")

    # -- answers routed ----------------------------------------------------------

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

    def _abandon(self, rid: int, pending: P) -> None:
        """The caller stopped waiting for `rid` (mutex held / on the loop).

        A Release of a key the holder only waits for cancels the wait; if the holder
        holds the key, such a Release would give back a hold instead, so then the grant
        (which comes at once for a held key) is given back when it arrives.
        """
        if self._pending.get(rid) is not pending:
            # Answered meanwhile. A grant nobody will use is given back at once.
            lock = cast(Optional[L], pending.response)
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

    # -- the end -----------------------------------------------------------------

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
            log_lost(locks, reason)
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

    def _start_closing(self) -> bool:
        """The client closes the session: True when its stream is to be half-closed
        (the sidecar then releases everything and ends it); False when the session was
        resuming: it ends at once (its locks stay in the store until their TTL)."""
        self._closing = True
        if self.state is not RESUMING:
            return True
        self._end("client closed")
        if self._attempt is not None:
            self._attempt.cancel()
        return False

    # -- answers ----------------------------------------------------------------

    def _answer(self, key: str, pending: P) -> L:
        """Turns a resolved acquire into a lock or an exception."""
        if pending.error is not None:
            raise pending.error
        resp = pending.response
        if isinstance(resp, LockBase):
            return cast(L, resp)
        kind = resp.WhichOneof("event")
        if kind == "not_acquired":
            reason = pb.NotAcquired.Reason.Name(resp.not_acquired.reason)
            raise NotAcquired(key, reason.replace("REASON_", ""))
        if kind == "rejected":
            raise Rejected(key, resp.rejected.code, resp.rejected.message)
        raise Unavailable(f"protocol error: {kind!r} answered an acquire")

    def _released(self, lock: L, pending: P) -> None:
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

    def _proclaimed(self, lock: L, pending: P) -> None:
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

    def _forget(self, lock: L) -> None:
        hk = (lock.holder, lock.key)
        locks = self._held.get(hk)
        if locks and lock in locks:
            locks.remove(lock)
            if not locks:
                del self._held[hk]
                self._jeopardy.pop(hk, None)
