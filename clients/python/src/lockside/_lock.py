"""One granted lock, as both clients hold it (`LockBase`): its attributes, its states
(held, suspended, lost, released) as the core reports them, and giving it back. The
sync `Lock` and the `AsyncLock` add which events `suspended` and `lost` are."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable, Optional, Protocol, Type

from lockside import _events, _native
from lockside._errors import LocksideError, LockLost, from_failure

log = logging.getLogger("lockside")


class Flag(Protocol):
    """`lost` and `suspended`: a `threading.Event` on `Lock`, an `asyncio.Event` on
    `AsyncLock`."""

    def set(self) -> None: ...

    def clear(self) -> None: ...

    def is_set(self) -> bool: ...


class LockBase:
    """A granted lock.

    Attributes:
      key            the lock's name.
      holder         who in the session holds it: the thread (`Client`) or the task
                     (`AsyncClient`) that locked, or the `holder=` named; "" for the
                     session itself.
      fencing_token  pass it to the resource you protect; it must reject lower ones.
      ttl            seconds of validity the sidecar reported with the grant (it renews
                     the lock for as long as the session lives).
      hold_count     how many times the holder held the key after this grant
                     (reentrancy: each grant is released on its own).
      session_id     the session shown by `describe()`; it stays the same when the
                     session is resumed after a broken stream.
      lost_reason    why the lock was lost, once it is.

    A lock is usable while neither `suspended` nor `lost` is set. `suspended` is set
    the moment the session's stream breaks (a live sidecar releases at once, so
    somebody else may hold the key within milliseconds), and cleared when the resumed
    session lists the lock again with its token. A lost lock has both set.
    """

    lost: Flag
    suspended: Flag
    _new_flag: Callable[[], Flag] = threading.Event

    def __init__(self, native: Any, client: Any):
        self._native = native
        self._client = client  # a lock in hand keeps its client alive
        self._pid = os.getpid()
        self.lost = self._new_flag()
        self.suspended = self._new_flag()
        self.key: str = native.key
        self.holder: str = native.holder
        self.fencing_token: int = native.fencing_token
        self.ttl: float = native.ttl
        self.hold_count: int = native.hold_count
        self.session_id: str = native.session_id
        self.lost_reason: Optional[str] = None
        self._state = "held"  # held -> released | lost
        self._suspended = False
        _events.track(self)
        # A change before `track` would have been missed: take the state now.
        state, reason = native.state()
        if state != "held":
            self._apply(state, reason)

    @property
    def held(self) -> bool:
        """True until the lock is released or lost. A suspended lock is still held (it
        may come back): whether it may be used is `suspended`."""
        return self._state == "held" and self._pid == os.getpid()

    def _apply(self, state: str, reason: str) -> None:
        """The core's news of this lock (the events thread; `AsyncLock`: on its loop)."""
        if self._state == "lost":
            return
        if state == "lost":
            self._client._locks.discard(self)
            if self._state == "held":
                self._state = "lost"
            self.lost_reason = reason
            self._suspended = True
            self.suspended.set()
            self.lost.set()
        elif self._state == "held":
            self._suspended = state == "suspended"
            if self._suspended:
                self.suspended.set()
            else:
                self.suspended.clear()

    def _woken(self) -> None:
        """Its state changed here (not through the core's news): wake its waiters."""
        with _events.changed:
            _events.changed.notify_all()

    def _inherited(self) -> None:
        """In a forked child: the parent's lock, not held here."""
        self._state = "released"
        self.lost_reason = f"held by process {self._pid}, the parent of this forked process"
        self._suspended = True
        self.suspended.set()
        self.lost.set()

    def _usable(self) -> bool:
        return self._state == "held" and not self._suspended

    def _release(self) -> None:
        """Gives the lock back: once the `Release` is on the stream. Raises `LockLost`
        (once) for a lock lost before; does nothing for one released or inherited."""
        if self._pid != os.getpid() or self._state == "released":
            return
        was = self._state
        self._state = "released"
        self._client._locks.discard(self)
        try:
            self._native.release()
        except _native.Failure as f:
            kind = f.args[0]
            if kind != "lost":
                raise from_failure(f, self.key) from None
            state, reason = self._native.state()
            raise LockLost(self.key, self.lost_reason or reason or "lost", self.fencing_token) from None
        if was == "lost":
            raise LockLost(self.key, self.lost_reason or "lost", self.fencing_token)

    def _lost_error(self) -> LockLost:
        return LockLost(self.key, self.lost_reason or "lost", self.fencing_token)

    def _left_on(self, exc_type: Type[BaseException], e: LocksideError) -> None:
        """Leaving a `with` block on `exc_type`, the release failed with `e`: logged,
        not raised, so as not to hide the exception leaving the block."""
        log.warning("releasing %r while leaving on %s: %s", self.key, exc_type.__name__, e)

    def __repr__(self) -> str:
        who = f" holder={self.holder!r}" if self.holder else ""
        state = "suspended" if self._state == "held" and self._suspended else self._state
        return f"<{type(self).__name__} {self.key!r}{who} token={self.fencing_token} state={state}>"
