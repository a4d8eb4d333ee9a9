"""One granted lock, as both clients hold it (`LockBase`): its attributes and its
states (held, suspended, lost, released) and the rules between them. No I/O."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, Sequence, Tuple, Type

from lockside._describe import seconds
from lockside._errors import LocksideError, LockLost

if TYPE_CHECKING:
    from lockside._core import SessionBase

log = logging.getLogger("lockside")

#: A holder and a key: what a session's bookkeeping is per (reentrancy is per
#: session, holder and key).
HolderKey = Tuple[str, str]


class Flag(Protocol):
    """`lost` and `suspended`: a `threading.Event` on `Lock`, an `asyncio.Event` on
    `AsyncLock`."""

    def set(self) -> None: ...

    def clear(self) -> None: ...

    def is_set(self) -> bool: ...


class LockBase:
    """A granted lock; the sync and asyncio `Lock` add which events `suspended` and
    `lost` are and how `release()` waits.

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

    lost: Flag
    suspended: Flag
    #: Makes `lost` and `suspended`: `threading.Event` (`Lock`), `asyncio.Event`
    #: (`AsyncLock`).
    _new_flag: Callable[[], Flag] = threading.Event

    def __init__(
        self,
        session: "SessionBase[Any, Any]",
        key: str,
        holder: str,
        granted: Any,
        ttl_asked: float,
    ):
        self.lost = self._new_flag()
        self.suspended = self._new_flag()
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
        self.lost.set()

    def _signal_suspended(self, suspended: bool) -> None:
        if suspended:
            self.suspended.set()
        else:
            self.suspended.clear()

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

    def _left_on(self, exc_type: Type[BaseException], e: LocksideError) -> None:
        """Leaving a `with` block on `exc_type`, the release failed with `e`: logged,
        not raised, so as not to hide the exception leaving the block."""
        log.warning("releasing %r while leaving on %s: %s", self.key, exc_type.__name__, e)

    def __repr__(self) -> str:
        who = f" holder={self.holder!r}" if self.holder else ""
        state = "suspended" if self._state == "held" and self._suspended else self._state
        return (
            f"<{type(self).__name__} {self.key!r}{who} token={self.fencing_token} "
            f"state={state}>"
        )


def log_lost(locks: Sequence[LockBase], reason: str) -> None:
    """One log line for locks lost together (a session's end, a resume that came too
    late), however many they are."""
    if len(locks) == 1:
        log.warning("lock %r lost: %s", locks[0].key, reason)
    elif locks:
        keys = ", ".join(repr(lock.key) for lock in locks[:3])
        more = f" and {len(locks) - 3} more" if len(locks) > 3 else ""
        log.warning("%d locks lost (%s%s): %s", len(locks), keys, more, reason)
