"""One session's decisions, shared by the sync and the asyncio clients (`SessionBase`):
requests and the answers routed to them, holders' grants, `Lost`, suspension when the
stream breaks, resuming and reconciling, the session's end. Nothing here does I/O: the
clients' sessions (`_sync.py`, `_aio.py`) send, read and wait."""

from __future__ import annotations

import itertools
import logging
import os
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import grpc

from lockside import _wire
from lockside._describe import seconds
from lockside._errors import LockLost, NotAcquired, Rejected, Unavailable
from lockside._lock import LockBase, log_lost
from lockside._pb import lockside_pb2 as pb
from lockside._wire import release_request as release_request

log = logging.getLogger("lockside")

#: How long past its own wait an answer may take before the client gives up on it:
#: the sidecar answers every request, so only a broken sidecar or network hits this.
ANSWER_SLACK = 10.0

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
        log_lost(expired, why)
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
        log_lost(gone, "not held by the resumed session (each lock's lost_reason says why)")
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
