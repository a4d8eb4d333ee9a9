"""What a session does when its stream breaks (DESIGN.md, "A broken stream" and
"Sessions that survive a sidecar restart"), without I/O: which endings may be
resumed (`not_resumable`), suspending every lock at once, losing each when the store
has surely let it go, and the resume attempts (backoff, taking or retrying each one).
`Resuming` holds these rules; `SessionBase` (`_core.py`) is built on it, and the
clients open the streams, read them and run the timers."""

from __future__ import annotations

import itertools
import logging
import time
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Generic,
    List,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    TypeVar,
)

import grpc

from lockside._errors import Unavailable
from lockside._greeting import Greeting, reconcile
from lockside._lock import HolderKey, LockBase, log_lost
from lockside._sidecar import RESUME_HEADER

if TYPE_CHECKING:
    from lockside._core import Pending

log = logging.getLogger("lockside")

L = TypeVar("L", bound=LockBase)
P = TypeVar("P", bound="Pending")

#: The states of a session: requests go out on the stream (OPEN), wait for a resume
#: to end (RESUMING), or fail (ENDED).
OPEN, RESUMING, ENDED = "open", "resuming", "ended"


class Cancellable(Protocol):
    """A timer, or a resume attempt's stream or call."""

    def cancel(self) -> Any: ...


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


def next_backoff(backoff: float) -> float:
    """The pause after `backoff`: doubled, up to `MAX_RESUME_BACKOFF`."""
    return min(backoff * 2, MAX_RESUME_BACKOFF)


def not_resumable(
    holds: bool, code: Optional[grpc.StatusCode], details: str, resume: bool, token: str
) -> Optional[str]:
    """Why a session cannot be resumed after its stream ended with `code` (a suffix for
    the reason its locks are lost), or None when it can be. `holds`: whether it holds
    any lock; `resume`: the client's option; `token`: its resume token."""
    if not holds:
        return ""  # nothing to resume: the next lock() opens a new session
    if code not in RESUMABLE_CODES:
        return ""  # the sidecar ended the stream on purpose: it released everything
    # A sidecar stopping cleanly (SIGTERM) sends `Lost` for every lock, releases,
    # then ends its streams UNAVAILABLE saying so: nothing is left to resume.
    if "shutting down" in details:
        return ""
    if not resume:
        return " (resume=False)"
    if not token:
        return (
            "; the sidecar's store cannot resume sessions (it gave no resume token: "
            "the embedded memory store), so its locks are gone"
        )
    return None


class Resuming(Generic[L, P]):
    """The rules a session (`SessionBase`) follows when its stream breaks. `_on_break`
    either ends the session or suspends every lock and starts resuming: the client then
    opens attempts with `_resume_metadata`, reads each one's greeting and hands it to
    `_take_resume` (go on on that stream) or `_retry_resume` (again after a backoff),
    while the timer `_arm_expiry` sets loses each lock whose time has passed."""

    # The session's state these rules read and change (`SessionBase.__init__`).
    session_id: str
    resume_token: str
    resume: bool
    state: str
    _metadata: Tuple[Tuple[str, str], ...]
    _closing: bool
    _ids: "itertools.count[int]"
    _pending: Dict[int, P]
    _held: Dict[HolderKey, List[L]]
    _jeopardy: Dict[HolderKey, float]

    def __init__(self) -> None:
        # While resuming: why the stream broke, when the store has surely let each
        # lock go (its TTL after the break): resuming it stops being worth it then; why
        # the last attempt failed; the attempt under way; the expiry timers.
        self._broke_reason = ""
        self._gone_by: Dict[HolderKey, float] = {}
        self._resume_failure = "no attempt"
        self._attempt: Optional[Cancellable] = None
        self._timers: List[Cancellable] = []

    # `SessionBase`: the session's end. The clients: a timer, and waking the callers
    # waiting for a resume to end (`_settle`) or for locks to be restored or lost.
    def _end(self, reason: str, code: Optional[grpc.StatusCode] = None) -> None:
        raise NotImplementedError

    def _call_later(self, delay: float, callback: Callable[[], None]) -> Cancellable:
        raise NotImplementedError

    def _settle(self) -> None:
        """The session resumed or ended: wake the callers waiting for that."""

    def _locks_changed(self) -> None:
        """Locks were restored or lost: wake `wait_restored` / `restored_wait`."""

    def _end_reason(self, code: Optional[grpc.StatusCode], details: str) -> str:
        """What ended the stream, as the session's end (or its break) says it."""
        if self._closing:
            return "client closed"
        if code is None or code is grpc.StatusCode.OK:
            return "closed by the sidecar"
        return f"{code.name}: {details}"

    def _on_break(self, reason: str, code: Optional[grpc.StatusCode], details: str) -> bool:
        """`_broke`, with the timer that loses each lock when its time has passed; True
        when the caller is to resume the session."""
        resuming = self._broke(reason, code, details)
        if resuming:
            self._arm_expiry()
        return resuming

    def _broke(self, reason: str, code: Optional[grpc.StatusCode], details: str = "") -> bool:
        """The stream ended with `code` (None: without a status). Either ends the
        session or suspends its locks and starts resuming it; True when the caller is
        to resume it."""
        if self.state is ENDED:
            return False
        if self._closing:
            self._end("client closed", code)
            return False
        why_not = not_resumable(bool(self._held), code, details, self.resume, self.resume_token)
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
        self._resume_failure = "no attempt"
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
        expired: List[L] = []
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

    def _arm_expiry(self) -> None:
        """Loses locks when their TTL since the break passes: one timer, for the next
        such time (a timer that fires a little early is armed again)."""
        if not self._gone_by:
            return
        at = min(self._gone_by.values())
        self._timers.append(self._call_later(max(0.0, at - time.monotonic()), self._on_expiry))

    def _on_expiry(self) -> None:
        if self._expire(time.monotonic()) is not None:
            self._arm_expiry()
        elif self.state is ENDED and self._attempt is not None:
            self._attempt.cancel()

    def _state_changed(self) -> None:
        """The session resumed or ended: its expiry timers stop, its waiters wake."""
        timers, self._timers = self._timers, []
        for timer in timers:
            timer.cancel()
        self._settle()

    # -- resuming ----------------------------------------------------------------

    def _resume_metadata(self) -> Tuple[Tuple[str, str], ...]:
        """The metadata of a resume attempt: the client's, and the resume token."""
        return self._metadata + ((RESUME_HEADER, self.resume_token),)

    def _take_resume(self, greeting: Greeting) -> Optional[List[bytes]]:
        """A resume attempt's stream was read as far as its greeting went: the requests
        to send on it, in order, when the session goes on there (it answered while the
        session still resumes); None when not (then `_retry_resume`)."""
        if greeting.token is not None:
            self.resume_token = greeting.token
        if not greeting.answered or self.state is not RESUMING:
            return None
        started = greeting.started.started
        if started.session_id != self.session_id:
            self._end("a resume answered with another session")
            return None
        return self._resumed(started, greeting.locks)

    def _retry_resume(self, greeting: Greeting, backoff: float) -> bool:
        """A resume attempt failed: True (logged) to try again after `backoff`; False
        when the session no longer resumes (it ended meanwhile, or now, on an answer no
        retry changes)."""
        if self.state is not RESUMING:
            return False
        if greeting.failure is not None:
            self._resume_failure = greeting.failure
        if greeting.code in FINAL_RESUME_CODES:
            self._cannot_resume(self._resume_failure, greeting.code)
            return False
        if greeting.started is not None:
            self._resume_failure = (
                "the resumed stream broke before it said which locks came back"
            )
        why = self._resume_failure
        log.info("resuming session %s: %s; again in %.2fs", self.session_id, why, backoff)
        return True

    def _cannot_resume(self, failure: str, code: Optional[grpc.StatusCode] = None) -> None:
        self._end(f"{self._broke_reason}; resuming failed: {failure}", code)

    def _resumed(self, started: Any, greeting: Sequence[Any]) -> List[bytes]:
        """A resume attempt was answered: `started` (the new `SessionStarted`), then
        `greeting`, a `Granted` (request_id 0, with its holder) or `Lost` per grant of
        the session's record. Squares what each holder holds with what came back
        (`reconcile`), restores the locks that did, and returns the requests to send on
        the new stream, in order."""
        self.state = OPEN
        self.resume_token = started.resume_token
        self._gone_by.clear()
        self._jeopardy.clear()
        out = reconcile(self._held, self._pending, self._ids, greeting)
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
