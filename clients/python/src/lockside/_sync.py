"""The blocking client: `Client`, its `Lock`s and its `Watch`. Every wait is the
core's, with the GIL released; every decision is the core's or `ClientBase`'s."""

from __future__ import annotations

import threading
import time
from typing import Any, Optional, Sequence

from lockside import _events, _native
from lockside._client import Asked, ClientBase, asked_all, value_bytes
from lockside._describe import Description, description
from lockside._errors import LocksideError, from_failure
from lockside._holders import thread_holder
from lockside._lock import LockBase
from lockside._locks import Locks


class Lock(LockBase):
    """A held lock (from `Client.lock`); a context manager that releases on exit.

    Use the resource only while `suspended` is not set:

    - `suspended` (a `threading.Event`) is set the moment the session's stream breaks
      (a live sidecar releases the lock within milliseconds then, and another holder
      may have it), and cleared when the resumed session lists the lock again with its
      token; `wait_restored(timeout)` waits for that. It stays set once the lock is
      lost.
    - `lost` (a `threading.Event`) is set, with `suspended`, when the lock is gone for
      good: the sidecar sent `Lost` for the key, or the stream broke and the lock did
      not come back (see `Client`). `release()` (and so leaving the `with` block
      without another exception) then raises `LockLost`.
    """

    lost: threading.Event
    suspended: threading.Event

    def wait_restored(self, timeout: Optional[float] = None) -> bool:
        """Waits while the lock is suspended: True once it may be used (at once when it
        is not suspended), False when it is lost or released, or still suspended after
        `timeout` seconds (None: wait for the outcome; it comes at the latest when the
        lock's TTL has passed since the break)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._suspended and self._state == "held":
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            with _events.changed:
                if self._suspended and self._state == "held":
                    _events.changed.wait(0.05 if left is None else min(left, 0.05))
        return self._usable()

    def proclaim(self, value: "bytes | str") -> None:
        """Replaces the lock's value (what `describe()` and `watch()` show of this
        holder): a leader telling its followers where it now is, without giving up
        leadership. At most 4 KiB. Raises `LockLost` if the lock is no longer held,
        `Rejected` for a value too large or a store it cannot reach."""
        data = value_bytes(value)
        if self._state == "lost":
            raise self._lost_error()
        if self._state == "released":
            raise LocksideError(f"lock {self.key!r} was released")
        try:
            self._native.proclaim(data)
        except _native.Failure as f:
            if f.args[0] == "lost":
                raise self._lost_error() from None
            raise from_failure(f, self.key) from None

    def release(self) -> None:
        """Gives the lock back. Returns once the `Release` is on the session's stream:
        whatever this process asks of the key afterwards (another thread's lock, another
        client's, a `describe()`) comes after it. Does nothing if already released.
        Raises `LockLost` (once) if the lock was lost while held."""
        self._release()

    def __enter__(self) -> "Lock":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self.release()
        except LocksideError as e:
            if exc_type is None:
                raise
            self._left_on(exc_type, e)


class Watch:
    """The states of a watched key, from `Client.watch`: iterate it for
    `Description`s, the key's state now and then one per change (a grant, a release,
    an expiry, a holder's value). A slow reader gets the latest state, skipping those
    in between. `cancel()`, or leaving a `with` block, ends it; iterating raises
    `Rejected` for a bad key or a watch limit reached and `Unavailable` when the
    sidecar or its store cannot be reached."""

    def __init__(self, native: Any, key: str):
        self._native = native
        self._key = key
        self._cancelled = False

    def cancel(self) -> None:
        """Ends the watch."""
        self._cancelled = True
        self._native.cancel()

    def __iter__(self) -> "Watch":
        return self

    def __next__(self) -> Description:
        if self._cancelled:
            raise StopIteration
        try:
            row = self._native.next()
        except _native.Failure as f:
            if self._cancelled:
                raise StopIteration from None
            raise from_failure(f, self._key) from None
        if row is None:
            raise StopIteration
        return description(row)

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.cancel()


class Client(ClientBase[Lock]):
    """A connection to a Lockside sidecar and one session on it.

    `addr` is `host:port` or `unix:/path`; it defaults to $LOCKSIDE_ADDR, then
    127.0.0.1:7420. All locks taken through one client share one `Lease` stream (one
    session, opened on the first `lock()`), and each thread is a holder of its own:
    threads sharing a client exclude each other on a key as two clients would (BUSY,
    or wait in turn), share a `shared` key and take a semaphore permit each, while a
    thread locking a key it holds re-enters it (`hold_count` 2, the same token).
    `lock(holder=...)` names another holder ("": the session itself).

    A forked child (gunicorn --preload, multiprocessing, Celery prefork) gets a session
    of its own on its first use of the client; the parent's locks stay the parent's
    (the child's copies of them are not held: `lost` set, `release()` does nothing).

    If the stream breaks (a reset connection, a keepalive that fired, a sidecar that
    died) while the session holds locks, every lock is suspended at once
    (`lock.suspended` set: stop using it) and the client resumes the session with its
    resume token, on the restarted sidecar or any other of the same store. A lock the
    resumed session lists with its token is restored (`suspended` cleared); one it
    does not list, or lists `Lost`, is lost, and so is every lock still suspended when
    its TTL has passed since the break. A store that cannot resume sessions (the
    embedded memory store) makes a break lose every lock at once. Waits in progress
    when the stream breaks fail with `Unavailable`; `lock()` calls made while the
    session resumes wait for it. A session that cannot be resumed loses every lock,
    and the next `lock()` opens a new session at once.

    Options: `client_name` (shown by `describe()`), `auth_token` (the sidecar's
    `--auth-token-file`), `tls` (`lockside.TLS(ca=...)` for a TLS sidecar),
    `connect_timeout` (seconds a new session may take), `resume` (False: any broken
    stream loses every lock at once), `wait_for_sidecar` (seconds a new session waits
    for a sidecar that is not there yet, logging one line; 0, the default: nothing
    listening at `addr` fails at once).
    """

    def _take(self, key: str, options: Asked, holder: Optional[str]) -> Lock:
        self._check_open()
        who = thread_holder() if holder is None else holder
        core = self._native()
        try:
            native = core.acquire(*options, who)
        except _native.Failure as f:
            raise from_failure(f, key) from None
        lock = Lock(native, self)
        self._locks.add(lock)
        return lock

    def lock_all(
        self,
        keys: Sequence[str],
        *,
        wait: Optional[float] = None,
        ttl: Optional[float] = None,
        shared: bool = False,
        fair: bool = False,
        holder: Optional[str] = None,
    ) -> Locks:
        """Takes every key of `keys` (2 to 64 distinct keys) for the calling thread at
        once, all or none, and returns the held `Locks` (a context manager that
        releases them all on exit): `locks[key].fencing_token`, or
        `locks.fencing_tokens[key]`, is each key's token. Two callers asking for
        overlapping keys in any order never deadlock (a waiting request holds
        nothing); with `fair`, it is not overtaken by later requests for any of its
        keys. A key the thread holds already is re-entered (its `hold_count` grows).
        `wait`, `ttl`, `shared` and `holder` as in `lock()`.

        Raises `NotAcquired` (one key busy, timed out: nothing is held), `Rejected`
        (fewer than 2 keys, more than 64, one twice, a bad key), `Unavailable`, and
        `TypeError` for keys that are not a list or tuple of str."""
        self._check_open()
        keys_, wait_, ttl_, shared_, fair_ = asked_all(keys, wait, ttl, shared, fair)
        who = thread_holder() if holder is None else holder
        core = self._native()
        try:
            natives = _native.acquire_all(core, keys_, wait_, ttl_, shared_, fair_, who)
        except _native.Failure as f:
            raise from_failure(f, ", ".join(keys_)) from None
        locks = [Lock(native, self) for native in natives]
        self._locks.update(locks)
        return Locks(locks)

    def watch(self, key: str) -> Watch:
        """Follows `key`: its state now, then one per change; see `Watch`."""
        self._check_open()
        return Watch(self._native().watch(key), key)

    def describe(self, key: str, timeout: float = 5.0) -> Description:
        """The store's view of `key`: holders, waiters, fair queue, last fencing token
        (after the releases of it this process made)."""
        self._check_open()
        try:
            return description(self._native().describe(key, float(timeout)))
        except _native.Failure as f:
            raise from_failure(f, key) from None

    def close(self) -> None:
        """Ends the session (the sidecar releases every lock it holds; their `lost` is
        set). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._let_go()
        self._native().close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
