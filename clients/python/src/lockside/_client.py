"""What `Client` and `AsyncClient` share, without I/O (`ClientBase`): their options,
the core's client they drive (made again in a forked child), `lock()` and
`campaign()` (the subclass takes the lock), the values a request may carry, and
the locks a closed client lets go."""

from __future__ import annotations

import logging
import math
import os
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Generic, List, Optional, Tuple, TypeVar

from lockside import _events, _native
from lockside._errors import LocksideError
from lockside._sidecar import default_addr

log = logging.getLogger("lockside")

#: What `lock()` and `campaign()` return: the held `Lock` (`Client`), or what awaits
#: the `AsyncLock` (`AsyncClient`).
Taken = TypeVar("Taken")

#: The longest wait the sidecar accepts; `wait=None` asks for it.
MAX_WAIT = 24 * 3600.0

#: `lock()`'s options as the core takes them: key, wait (None: do not wait), ttl,
#: shared, limit, fair, value.
Asked = Tuple[str, Optional[float], Optional[float], bool, int, bool, bytes]

#: `lock_all()`'s options as the core takes them: keys, wait, ttl, shared, fair.
AskedAll = Tuple[List[str], Optional[float], Optional[float], bool, bool]

#: In a forked child, the parent's native clients: kept, never used.
inherited: List[Any] = []

#: Every client: in a forked child, each lets the parent's locks go and makes a core
#: client of its own on first use.
_clients: "weakref.WeakSet[ClientBase[Any]]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for client in list(_clients):
        client._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@dataclass(frozen=True)
class TLS:
    """TLS to the sidecar: the CA that signed its certificate (PEM bytes; None: the
    webpki roots), this client's certificate chain and key for mutual TLS, and the name
    its certificate carries if not the address's host."""

    ca: Optional[bytes] = None
    cert: Optional[bytes] = None
    key: Optional[bytes] = None
    server_name: Optional[str] = None


def _seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    if not math.isfinite(value) or not 0 <= value < 2**63:
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


def value_bytes(value: Any) -> bytes:
    """A holder value as bytes: `bytes`-like as it is, `str` in UTF-8. (Its size is
    the sidecar's to check: over 4 KiB it answers `Rejected` INVALID_ARGUMENT.)"""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"value must be bytes or str, not {type(value).__name__}")


def asked(
    key: Any, wait: Any, ttl: Any, shared: bool, limit: Any, fair: bool, value: Any
) -> Asked:
    """`lock()`'s options checked as far as they cannot be encoded (types, negative or
    infinite numbers: `TypeError`, `ValueError`); the rules on values (key length and
    characters, TTL range, mode with limit) are the sidecar's: it answers `Rejected`."""
    if not isinstance(key, str):
        raise TypeError(f"key must be a str, not {type(key).__name__}")
    key.encode("utf-8")  # a lone surrogate: UnicodeEncodeError, a ValueError
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be an int, not {type(limit).__name__}")
    if not 0 <= limit <= 0xFFFFFFFF:
        raise ValueError(f"limit must be between 0 and 2**32-1, got {limit}")
    waited = MAX_WAIT if wait is None else _seconds("wait", wait)
    ttl_s = None if ttl is None else _seconds("ttl", ttl)
    return (key, waited or None, ttl_s, bool(shared), limit, bool(fair), value_bytes(value))


def asked_all(keys: Any, wait: Any, ttl: Any, shared: bool, fair: bool) -> AskedAll:
    """`lock_all()`'s options checked as `asked()` checks `lock()`'s."""
    from lockside._locks import keys_asked

    waited = MAX_WAIT if wait is None else _seconds("wait", wait)
    ttl_s = None if ttl is None else _seconds("ttl", ttl)
    return (keys_asked(keys), waited or None, ttl_s, bool(shared), bool(fair))


class ClientBase(Generic[Taken]):
    """A connection to a Lockside sidecar and one session on it, as both clients see
    it; `Client` and `AsyncClient` add the waiting."""

    def __init__(
        self,
        addr: Optional[str] = None,
        *,
        client_name: Optional[str] = None,
        auth_token: Optional[str] = None,
        tls: Optional[TLS] = None,
        connect_timeout: float = 10.0,
        resume: bool = True,
        wait_for_sidecar: float = 0.0,
    ):
        self.addr = addr or default_addr()
        self.connect_timeout = _seconds("connect_timeout", connect_timeout)
        self.resume = resume
        self.wait_for_sidecar = _seconds("wait_for_sidecar", wait_for_sidecar)
        self._tls = tls
        self._client_name = client_name
        self._auth_token = auth_token
        self._closed = False
        # The locks held through it: each refers to its client, so a client dropped
        # with locks held lives until the garbage collector finds the two (and then
        # warns: `__del__`); a lock in hand keeps its client alive.
        self._locks: "set[Any]" = set()
        self._pid = os.getpid()
        self._core: Any = self._make_core()
        _clients.add(self)
        _events.start_logging()

    def _make_core(self) -> Any:
        tls = None
        if self._tls is not None:
            t = self._tls
            tls = (t.ca, t.cert, t.key, t.server_name)
        addr = self.addr[len("http://") :] if self.addr.startswith("http://") else self.addr
        return _native.NativeClient(
            addr,
            self._client_name,
            self._auth_token,
            tls,
            self.connect_timeout,
            self.resume,
            self.wait_for_sidecar,
        )

    def _forked(self) -> None:
        """In a forked child, before any other thread of it runs: the core's client
        and the locks are the parent's (not held here: `lost` set, `release()` does
        nothing); the child makes its own client on first use."""
        if self._pid == os.getpid():
            return
        inherited.append(self._core)
        self._core = None
        for lock in list(self._locks):
            lock._inherited()
        self._locks = set()
        self._pid = os.getpid()

    def _native(self) -> Any:
        """The core's client (in a forked child, one of its own)."""
        self._forked()
        if self._core is None:
            self._core = self._make_core()
        return self._core

    def _take(self, key: str, options: Asked, holder: Optional[str]) -> Taken:
        """Takes `key` for `holder` (None: the caller) with `lock()`'s options."""
        raise NotImplementedError

    @property
    def session_id(self) -> Optional[str]:
        """The current session's id (as `describe()` shows it; the same across a
        resume), None before the first lock."""
        if self._closed or self._pid != os.getpid() or self._core is None:
            return None
        sid: Optional[str] = self._core.session_id()
        return sid

    def lock(
        self,
        key: str,
        *,
        wait: Optional[float] = None,
        ttl: Optional[float] = None,
        shared: bool = False,
        limit: int = 0,
        fair: bool = False,
        value: "bytes | str" = b"",
        holder: Optional[str] = None,
    ) -> Taken:
        """Takes `key` for the caller. `Client`: for the calling thread, and returns the
        held `Lock` (also a context manager). `AsyncClient`: for the calling task;
        `await c.lock(...)` returns the `AsyncLock`, `async with c.lock(...) as lock`
        releases it on exit; cancelling the awaiting task cancels the wait. Threads
        (tasks) sharing a client exclude each other; one locking a key it holds
        re-enters it.

        wait:   seconds to wait while the key is busy; 0 fails at once; None (the
                default) waits as long as the sidecar allows (24 h).
        ttl:    seconds the store keeps the lock if the sidecar stops renewing it
                (1 s to the sidecar's maximum); None: the sidecar's default (10 s).
        shared: a reader lock: shared holders coexist and exclude exclusive ones.
        limit:  N > 1 makes the key a semaphore of N permits (not with `shared`).
        fair:   wait in arrival order.
        value:  the holder's value, shown by `describe()` and `watch()` (bytes, or
                str in UTF-8; at most 4 KiB).
        holder: who holds it in the session; None (the default) is the calling
                thread (`thread:N:NAME`) or task (`task:N:NAME`), "" the session
                itself. At most 128 bytes, no control characters.

        Raises `NotAcquired` (busy, timed out), `Rejected` (a bad value, a conflicting
        mode or limit, the store unreachable), `Unavailable` (no sidecar), and
        `TypeError`/`ValueError` for values that are not numbers of seconds.
        """
        return self._take(key, asked(key, wait, ttl, shared, limit, fair, value), holder)

    def campaign(
        self,
        key: str,
        value: "bytes | str" = b"",
        *,
        wait: Optional[float] = None,
        ttl: Optional[float] = None,
        holder: Optional[str] = None,
    ) -> Taken:
        """Campaigns for leadership of `key` with `value` (who you are, where to reach
        you) and returns once this client leads: the returned lock is leadership.
        Candidates lead in the order they campaigned, across every sidecar of the store
        (a fair EXCLUSIVE lock). `proclaim()` changes the value followers see;
        `release()` (or leaving a `with` block) hands leadership on. `wait`, `ttl` and
        `holder` as in `lock()`."""
        return self._take(key, asked(key, wait, ttl, False, 0, True, value), holder)

    def _check_open(self) -> None:
        if self._closed:
            raise LocksideError("the client is closed")

    def _let_go(self) -> None:
        """The client closed: its locks are let go (`lost` set, `release()` does
        nothing more); one log line however many they are."""
        held = [lock for lock in list(self._locks) if lock._state == "held"]
        for lock in held:
            lock._state = "released"
            lock.lost_reason = "client closed"
            lock._suspended = True
            lock.suspended.set()
            lock.lost.set()
            lock._woken()
        if held:
            log.info(
                "session %s closed with %d lock(s) held: the sidecar releases them",
                held[0].session_id,
                len(held),
            )

    def __del__(self) -> None:
        # A client nobody closed ends its session with its last reference (the core
        # drops the stream, and the sidecar releases its locks): say so.
        try:
            if self._closed or self._core is None or self._pid != os.getpid():
                return
            if self._core.session_id() is None:
                return
        except Exception:  # noqa: BLE001 - interpreter shutdown
            return
        warnings.warn(
            f"lockside.Client({self.addr!r}) was garbage-collected without close(): its "
            "session ends now and the sidecar releases its locks",
            ResourceWarning,
            stacklevel=2,
        )
