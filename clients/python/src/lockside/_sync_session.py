"""One session of the blocking client, on grpcio's threaded API, and its `Lock`s:
`_Session` keeps the I/O (a reader thread reads the stream and hands each message to
`SessionBase`, which makes every decision; the resume attempts; callers waiting for
their answers), and chooses the stream (`_open_stream`: the fast one of
`_fastpath.py`, else grpcio's public API)."""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable, Optional, Tuple

import grpc

from lockside._core import OPEN, RESUMING, Options, Pending, SessionBase
from lockside._errors import LocksideError, Unavailable, rpc_error_text
from lockside._fastpath import HAVE_CYGRPC, _SegregatedStream
from lockside._greeting import Greeting
from lockside._lock import LockBase
from lockside._pb import lockside_pb2 as pb
from lockside._resume import FIRST_RESUME_BACKOFF, Cancellable, next_backoff
from lockside._sidecar import log
from lockside._stream import _IteratorStream, _Stream
from lockside._sync_channel import _Conn
from lockside._wire import value_bytes

if TYPE_CHECKING:
    from lockside._sync import Client


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

    _session: "_Session"
    lost: threading.Event
    suspended: threading.Event
    # The client, kept alive while its lock is (`Client.lock` sets it): a lock in hand
    # is held, even when the client itself is no longer referenced.
    _client: Optional["Client"] = None

    def wait_restored(self, timeout: Optional[float] = None) -> bool:
        """Waits while the lock is suspended: True once it may be used (at once when it
        is not suspended), False when it is lost or released, or still suspended after
        `timeout` seconds (None: wait for the outcome; it comes at the latest when the
        lock's TTL has passed since the break)."""
        changed = self._session._changed
        with changed:
            changed.wait_for(lambda: not self._suspended or self._state != "held", timeout)
            return self._usable()

    def proclaim(self, value: "bytes | str") -> None:
        """Replaces the lock's value (what `describe()` and `watch()` show of this
        holder): a leader telling its followers where it now is, without giving up
        leadership. At most 4 KiB. Raises `LockLost` if the lock is no longer held,
        `Rejected` for a value too large or a store it cannot reach."""
        self._session.proclaim(self, value)

    def release(self) -> None:
        """Gives the lock back and waits for the sidecar to confirm.

        Does nothing if already released. Raises `LockLost` (once) if the lock was lost
        while held, and `Unavailable` if the sidecar does not confirm in time (the lock
        is then released when the session ends, at the latest when the client closes).
        """
        self._session.release(self)

    def __enter__(self) -> "Lock":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self.release()
        except LocksideError as e:
            if exc_type is None:
                raise
            self._left_on(exc_type, e)


class _SyncPending(Pending):
    __slots__ = ("done",)

    def __init__(
        self, kind: str, key: str, request: bytes, ttl: float, holder: str, timeout: float
    ):
        super().__init__(kind, key, request, ttl, holder, timeout)
        # A bare lock is CPython's cheapest cross-thread wake-up (an Event is a
        # Condition around one): taken now, released by the reader with the answer.
        self.done = threading.Lock()
        self.done.acquire()

    def _notify(self) -> None:
        self.done.release()


#: Whether sessions use `_SegregatedStream`; set to False when it cannot be made.
_fast_streams = HAVE_CYGRPC


def _open_stream(conn: "_Conn", metadata: Tuple[Any, ...], wait_for_ready: bool = True) -> _Stream:
    global _fast_streams
    if _fast_streams:
        try:
            return _SegregatedStream(conn.channel, metadata, wait_for_ready)
        except (AttributeError, TypeError) as e:
            # Not the grpcio this was written for: the public API, slower, works.
            log.info("grpcio's segregated calls are not usable (%s): using its public API", e)
            _fast_streams = False
    return _IteratorStream(conn.raw_lease, metadata, wait_for_ready)


# -- the session -----------------------------------------------------------------


def _read(ref: "weakref.ref[_Session]", stream: _Stream, opened: threading.Lock) -> None:
    """The reader thread of a session: reads its streams and hands each message to
    the session while it lives."""
    try:
        first = stream.read()
        sess = ref()
        if sess is None:
            return
        sess._opened(stream, first)
        if first is None:
            return
    except Exception as e:  # noqa: BLE001 - a bad first message ends the session
        stream.discard()
        sess = ref()
        if sess is not None:
            with sess._mu:
                sess._end(rpc_error_text(e)[0])
        return
    finally:
        opened.release()
    del sess
    next_stream: Optional[_Stream] = stream
    while next_stream is not None:
        stream = next_stream
        try:
            alive = _pump(ref, stream)
        except Exception as e:  # noqa: BLE001 - a bad message ends the stream
            stream.discard()
            sess = ref()
            if sess is not None:
                with sess._mu:
                    sess._end(f"protocol error: {rpc_error_text(e)[0]}")
            return
        sess = ref() if alive else None
        if sess is None:  # collected: its finalizer ended the stream
            stream.discard()
            return
        next_stream = sess._stream_ended(stream)
        del sess


def _pump(ref: "weakref.ref[_Session]", stream: _Stream) -> bool:
    """Hands the stream's messages to the session until the stream ends (True) or the
    session is gone (False)."""
    read, parse = stream.read, pb.LeaseResponse.FromString
    while True:
        data = read()
        if data is None:
            return True
        resp = parse(data)
        sess = ref()
        if sess is None:
            return False
        with sess._mu:
            sess._dispatch(resp)
        del sess


class _Session(SessionBase[Lock, _SyncPending]):
    """One session: a reader thread reads its stream, routes every answer to its
    waiter and every `Lost` to its locks, and resumes the session on a new stream when
    the stream breaks as if the sidecar died (see `SessionBase`). Callers send
    directly; every decision is `SessionBase`'s, made with the mutex held.

    The reader holds the session only weakly between messages: a client dropped
    without `close()` is collected with its session, and its finalizer ends the stream
    (`_collected`)."""

    def __init__(
        self,
        client: "Client",
        conn: _Conn,
        wait_for_ready: bool,
        timeout: float,
    ):
        super().__init__(client.resume, client._metadata)
        self._conn = conn
        self._mu = threading.Lock()
        # Notified when the state changes (resumed, ended) and when locks are restored
        # or lost: callers wait on it while the session resumes.
        self._changed = threading.Condition(self._mu)
        self._stream = _open_stream(conn, self._metadata, wait_for_ready)
        opened = threading.Lock()
        opened.acquire()
        self._reader = threading.Thread(
            target=_read, args=(weakref.ref(self), self._stream, opened), name="lockside-session",
            daemon=True,
        )
        self._reader.start()
        if not opened.acquire(timeout=timeout):
            self._stream.cancel()
            raise Unavailable(
                f"no answer from the sidecar at {conn.addr} within {timeout:g}s",
                grpc.StatusCode.DEADLINE_EXCEEDED,
            )
        if self.ended is not None:
            raise Unavailable(
                f"cannot open a session at {conn.addr}: {self.ended}", self._stream.status[0]
            )
        conn.stream, conn.reader = self._stream, self._reader

    # -- the reader thread (`_read`) ------------------------------------------------

    def _opened(self, stream: _Stream, first: Optional[bytes]) -> None:
        with self._mu:
            if first is None:
                code, details = stream.status
                self._end(self._end_reason(code, details), code)
            else:
                self._started(pb.LeaseResponse.FromString(first))

    def _stream_ended(self, stream: _Stream) -> Optional[_Stream]:
        """The stream ended: resumes the session on a new one (returned), or ends it."""
        code, details = stream.status
        with self._mu:
            resuming = self._on_break(self._end_reason(code, details), code, details)
        return self._resume() if resuming else None

    def _resume(self) -> Optional[_Stream]:
        """Resumes the session on new streams until one answers or nothing is held
        any more; returns the new stream, or None when the session ended."""
        backoff = FIRST_RESUME_BACKOFF
        while True:
            with self._mu:
                if self.state is not RESUMING:
                    return None
                try:
                    attempt = _open_stream(self._conn, self._resume_metadata())
                except ValueError as e:  # the channel is closed
                    self._cannot_resume(str(e))
                    return None
                self._attempt = attempt
            greeting = Greeting()
            try:
                data = attempt.read()
                while data is not None and greeting.feed(data):
                    data = attempt.read()
            except Exception as e:  # noqa: BLE001 - a bad answer is a failed attempt
                greeting.fail(rpc_error_text(e)[0])
            with self._mu:
                self._attempt = None
                resent = self._take_resume(greeting)
                if resent is not None:
                    for data in resent:
                        attempt.send(data)
                    self._stream = self._conn.stream = attempt
                    return attempt
            attempt.discard()  # (outside the mutex: it reads the stream to its end)
            greeting.ended(*attempt.status)
            with self._mu:
                if not self._retry_resume(greeting, backoff):
                    return None
                self._changed.wait(backoff)
            backoff = next_backoff(backoff)

    # -- what SessionBase asks of its client (mutex held) ---------------------------

    def _send_nowait(self, request: bytes) -> None:
        if self.state is OPEN:
            self._stream.send(request)

    def _call_later(self, delay: float, callback: Callable[[], None]) -> Cancellable:
        def locked() -> None:
            with self._mu:
                callback()

        timer = threading.Timer(delay, locked)
        timer.daemon = True
        timer.start()
        return timer

    def _settle(self) -> None:
        self._changed.notify_all()

    def _locks_changed(self) -> None:
        self._changed.notify_all()

    def _new_lock(self, key: str, holder: str, granted: Any, ttl: float) -> Lock:
        return Lock(self, key, holder, granted, ttl)

    def _new_pending(
        self, kind: str, key: str, request: bytes, ttl: float, holder: str, timeout: float
    ) -> _SyncPending:
        return _SyncPending(kind, key, request, ttl, holder, timeout)

    def _inherited(self) -> None:
        # In a forked child, before any other thread runs: locks and events that a
        # thread of the parent held at the fork would never be let go here.
        self._mu = threading.Lock()
        self._changed = threading.Condition(self._mu)
        self._timers = []
        for grants in self._held.values():
            for lock in grants:
                for name in ("lost", "suspended"):
                    reinit = getattr(getattr(lock, name), "_at_fork_reinit", None)
                    if reinit is not None:
                        reinit()
                    else:  # pragma: no cover - CPython has it since 3.9
                        setattr(lock, name, threading.Event())
        super()._inherited()

    # -- callers -------------------------------------------------------------------

    def _ready(self) -> None:
        """Waits while the session resumes (mutex held); raises if it ended."""
        while self.state is RESUMING:
            self._changed.wait()
        self._check_not_ended()

    def _wait(self, rid: int, pending: _SyncPending) -> None:
        try:
            while not pending.done.acquire(timeout=pending.timeout):
                with self._mu:
                    error = self._overdue(rid, pending)
                if error is not None:
                    raise error
        except BaseException as e:  # KeyboardInterrupt while waiting
            if isinstance(e, Unavailable):
                raise
            with self._mu:
                self._abandon(rid, pending)
            raise

    def acquire(self, key: str, options: Options, holder: str) -> Lock:
        rid, pending = self._acquiring(key, options, holder)
        with self._mu:
            if self.state is not OPEN:
                self._ready()
            self._submit(rid, pending)
        self._wait(rid, pending)
        return self._answer(key, pending)

    def release(self, lock: Lock) -> None:
        with self._mu:
            request = self._releasing(lock)
            if request is None:
                return
            self._submit(*request)
        self._wait(*request)
        with self._mu:
            self._released(lock, request[1])

    def proclaim(self, lock: Lock, value: "bytes | str") -> None:
        data = value_bytes(value)  # a bad value fails before anything is sent
        with self._mu:
            rid, pending = self._proclaiming(lock, data)
            self._submit(rid, pending)
        self._wait(rid, pending)
        with self._mu:
            self._proclaimed(lock, pending)

    def close(self, timeout: float = 2.0) -> None:
        """Half-closes the stream (the sidecar then releases everything and ends it)
        and waits up to `timeout` for that; cancels the stream after. A session that
        is resuming ends at once (its locks stay in the store until their TTL)."""
        with self._mu:
            self._start_closing()
            stream = self._stream
        stream.close_sending()
        self._reader.join(timeout)
        if self._reader.is_alive():
            stream.cancel()
            self._reader.join(timeout)
        with self._mu:
            self._end("client closed")
