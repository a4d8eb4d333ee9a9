"""The blocking client, on grpcio's threaded API."""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
import warnings
import weakref
from typing import Any, Callable, Optional, Sequence, Tuple

import grpc

from lockside._core import OPEN, RESUMING, Options, Pending, SessionBase
from lockside._greeting import Greeting
from lockside._resume import FIRST_RESUME_BACKOFF, Cancellable, next_backoff
from lockside._describe import Description, description
from lockside._errors import LocksideError, Unavailable, call_error, rpc_error_text
from lockside._holders import thread_holder
from lockside._lock import LockBase
from lockside._pb import lockside_pb2 as pb
from lockside._sidecar import (
    DESCRIBE_METHOD,
    KEEPALIVE_OPTIONS,
    LEASE_METHOD,
    RESUME_HEADER,
    WATCH_METHOD,
    call_metadata,
    channel_target,
    default_addr,
    dial_address,
    log,
    refusal,
    wait_after_refusal,
)
from lockside._wire import proclaim_request, release_request, value_bytes
from lockside._fastpath import HAVE_CYGRPC, _SegregatedStream
from lockside._stream import _IteratorStream, _Stream, inherited

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

    def __init__(
        self, session: "_Session", key: str, holder: str, granted: Any, ttl_asked: float
    ):
        super().__init__(session, key, holder, granted, ttl_asked)
        self.lost = threading.Event()
        self.suspended = threading.Event()
        # The client, kept alive while its lock is (`Client.lock` sets it): a lock in
        # hand is held, even when the client itself is no longer referenced.
        self._client: Optional["Client"] = None

    def _signal_lost(self) -> None:
        self.lost.set()

    def _signal_suspended(self, suspended: bool) -> None:
        if suspended:
            self.suspended.set()
        else:
            self.suspended.clear()

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
        if exc_type is None:
            self.release()
            return
        try:
            self.release()
        except LocksideError as e:  # do not hide the exception leaving the block
            log.warning("releasing %r while leaving on %s: %s", self.key, exc_type.__name__, e)


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


# -- the connection ----------------------------------------------------------------------


class _Conn:
    """A client's channel, and what its finalizer needs to end its session: the
    session's stream and reader thread. It refers to neither the client nor the
    session, so it keeps neither alive (see `Client`)."""

    def __init__(self, client: "Client"):
        self.addr = client.addr
        self.pid = os.getpid()
        target = channel_target(client.addr)
        opts = client._options
        if client._credentials is None:
            self.channel = grpc.insecure_channel(target, options=opts)
        else:
            self.channel = grpc.secure_channel(target, client._credentials, options=opts)
        # Raw bytes both ways: the session encodes and decodes (for _IteratorStream).
        self.raw_lease = self.channel.stream_stream(LEASE_METHOD)
        self.describe = self.channel.unary_unary(
            DESCRIBE_METHOD,
            request_serializer=pb.DescribeRequest.SerializeToString,
            response_deserializer=pb.DescribeResponse.FromString,
        )
        self.watch = self.channel.unary_stream(
            WATCH_METHOD,
            request_serializer=pb.WatchRequest.SerializeToString,
            response_deserializer=pb.WatchResponse.FromString,
        )
        self.stream: Optional[_Stream] = None  # the open session's
        self.reader: Optional[threading.Thread] = None

    def shutdown(self) -> None:
        """Ends the session (a half-close: the sidecar releases every lock and ends
        the stream) and closes the channel; for a client nobody closed (`_closer`)."""
        stream, reader = self.stream, self.reader
        if stream is not None:
            stream.close_sending()
            if reader is not None:
                reader.join(2.0)
                if reader.is_alive():
                    stream.cancel()
                    reader.join(2.0)
        self.channel.close()


def _collected(conn: _Conn) -> None:
    """A `Client` was garbage-collected without `close()`: warn, and have its session
    ended (on `_closer`'s thread: this runs wherever the collector happens to run,
    perhaps inside one of this package's critical sections)."""
    if conn.pid != os.getpid():
        return  # the parent's, in a forked child: never touched here
    if conn.stream is not None:
        warnings.warn(
            f"lockside.Client({conn.addr!r}) was garbage-collected without close(): its "
            "session ends now and the sidecar releases its locks",
            ResourceWarning,
            stacklevel=2,
        )
    _closer.put(conn)


_closer: "queue.SimpleQueue[_Conn]" = queue.SimpleQueue()  # reentrant: a finalizer may put
_closer_thread: Optional[threading.Thread] = None
_closer_mu = threading.Lock()


def _closing() -> None:
    while True:
        conn = _closer.get()
        if conn.pid != os.getpid():
            continue  # queued in the parent before a fork: the parent's to end
        try:
            conn.shutdown()
        except Exception as e:  # noqa: BLE001 - one client's end must not stop the others'
            log.warning("ending the session of a collected client: %s", e)


def _start_closer() -> None:
    """Starts the thread that ends collected clients' sessions (once per process)."""
    global _closer_thread
    with _closer_mu:
        if _closer_thread is None or not _closer_thread.is_alive():
            _closer_thread = threading.Thread(target=_closing, name="lockside-closer", daemon=True)
            _closer_thread.start()


# -- fork() ----------------------------------------------------------------------------

#: Every client: a forked child gives each a session of its own (`Client._after_fork`);
#: `_fastpath.py` keeps gRPC sound across the fork itself.
_clients: "weakref.WeakSet[Client]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    global _closer, _closer_mu, _closer_thread
    _closer, _closer_mu, _closer_thread = queue.SimpleQueue(), threading.Lock(), None
    for client in list(_clients):
        client._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _probe(addr: str) -> Optional[str]:
    """Why nothing listens at `addr` (a plain connect fails), or None when something
    does or this cannot tell (see `wait_after_refusal`)."""
    where = dial_address(addr)
    if where is None:
        return None
    kind, address = where
    try:
        if kind == "unix":
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(1.0)
                s.connect(address)
        else:
            socket.create_connection(address, timeout=1.0).close()
    except OSError as e:
        return refusal(e)
    return None


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


class Watch:
    """The states of a watched key, from `Client.watch`: iterate it for
    `Description`s, the key's state now and then one per change (a grant, a release,
    an expiry, a holder's value). A slow reader gets the latest state, skipping those
    in between. `cancel()`, or leaving a `with` block, ends it (the iteration then
    stops); iterating raises `Rejected` for a bad key or a watch limit reached and
    `Unavailable` when the sidecar or its store cannot be reached."""

    def __init__(self, call: Any, key: str):
        self._call = call
        self._key = key
        self._cancelled = False

    def __iter__(self) -> "Watch":
        return self

    def __next__(self) -> Description:
        try:
            resp = next(self._call)
        except grpc.RpcError as e:
            if self._cancelled:
                raise StopIteration from None
            raise call_error(self._key, e) from None
        return description(resp.state)

    def cancel(self) -> None:
        """Ends the watch."""
        self._cancelled = True
        self._call.cancel()

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.cancel()


class Client:
    """A connection to a Lockside sidecar and one session on it.

    `addr` is `host:port` or `unix:/path`; it defaults to $LOCKSIDE_ADDR, then
    127.0.0.1:7420. All locks taken through one client share one `Lease` stream (one
    session, opened on the first `lock()`), and each thread is a holder of its own
    (DESIGN.md, "Holders inside a session"): threads sharing a client exclude each
    other on a key as two clients would (BUSY, or wait in turn), share a `shared` key
    and take a semaphore permit each, while a thread locking a key it holds re-enters
    it (`hold_count` 2, the same token). `lock(holder=...)` names another holder ("":
    the session itself, reentrant for every thread).

    A forked child (gunicorn --preload, multiprocessing, Celery prefork) gets a session
    of its own on its first use of the client; the parent's locks stay the parent's
    (the child's copies of them are not held: `lost` set, `release()` does nothing).
    A client garbage-collected without `close()` ends its session (releasing its locks)
    with a `ResourceWarning`; a lock in hand keeps its client alive.

    If the stream breaks (UNAVAILABLE: a reset connection, a keepalive that fired, a
    sidecar that died) while the session holds locks, every lock is suspended at once
    (`lock.suspended` set: stop using it; a live sidecar releases it within
    milliseconds), and the client resumes the session with its resume token, on the
    restarted sidecar or any other of the same store and namespace at `addr`, retrying
    with backoff. A lock the resumed session lists with its token is restored
    (`suspended` cleared; the same session id, fencing token and hold count); one it
    does not list, or lists `Lost`, is lost, and so is every lock still suspended when
    its TTL has passed since the break (or the time `Jeopardy` gave), the store having
    let it go. A store that cannot resume sessions (the embedded memory store: no resume
    token) makes a break lose every lock at once. Waits in progress when the stream
    breaks fail with `Unavailable` (the sidecar does not resume them); `lock()` calls
    made while the session resumes wait for it. A session that cannot be resumed, or
    ends otherwise, loses every lock, and the next `lock()` opens a new session.

    Options: `client_name` (shown by `describe()`), `auth_token` (the sidecar's
    `--auth-token-file`), `credentials` (`grpc.ssl_channel_credentials(...)` for a TLS
    sidecar), `options` (extra gRPC channel options), `connect_timeout` (seconds to
    wait for a new session), `resume` (False: any broken stream loses every lock at
    once), `wait_for_sidecar` (seconds a new session waits for a sidecar that is not there
    yet, logging one line; 0, the default: nothing listening at `addr` fails at once).
    """

    def __init__(
        self,
        addr: Optional[str] = None,
        *,
        client_name: Optional[str] = None,
        auth_token: Optional[str] = None,
        credentials: Optional[grpc.ChannelCredentials] = None,
        options: Sequence[Tuple[str, Any]] = (),
        connect_timeout: float = 10.0,
        resume: bool = True,
        wait_for_sidecar: float = 0.0,
    ):
        self.addr = addr or default_addr()
        self.connect_timeout = connect_timeout
        self.resume = resume
        self.wait_for_sidecar = wait_for_sidecar
        self._credentials = credentials
        self._options = KEEPALIVE_OPTIONS + list(options)
        self._metadata = call_metadata(client_name, auth_token)
        self._mu = threading.Lock()
        # The channel, made on first use (so in a forked child, its own).
        self._conn: Optional[_Conn] = None
        self._finalizer: "Optional[weakref.finalize[Any, Any]]" = None
        self._sess: Optional[_Session] = None
        self._closed = False
        _clients.add(self)

    def _connection(self) -> _Conn:
        """The channel (mutex held)."""
        if self._closed:
            raise LocksideError("the client is closed")
        if self._conn is None:
            _start_closer()
            self._conn = _Conn(self)
            # Not at exit: the process's end ends the session all the same.
            self._finalizer = weakref.finalize(self, _collected, self._conn)
            self._finalizer.atexit = False
        return self._conn

    def _session(self) -> _Session:
        with self._mu:
            conn = self._connection()
            if self._sess is None or self._sess.ended is not None:
                self._sess = None
                self._sess = self._open(conn)
            return self._sess

    def _open(self, conn: _Conn) -> _Session:
        """A new session: at once when the sidecar is there; else, after a plain
        connect to `addr` says why not, fails at once or waits for it
        (`wait_after_refusal`)."""
        try:
            return _Session(self, conn, False, self.connect_timeout)
        except Unavailable as e:
            if e.code is not grpc.StatusCode.UNAVAILABLE:
                raise
        wait = wait_after_refusal(
            self.addr, _probe(self.addr), self.wait_for_sidecar, self.connect_timeout
        )
        return _Session(self, conn, True, wait)

    def _after_fork(self) -> None:
        """In a forked child, before any other thread of it runs: the session and the
        channel are the parent's; the child opens its own on first use."""
        self._mu = threading.Lock()
        sess, conn = self._sess, self._conn
        self._sess = self._conn = None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if sess is not None:
            sess._inherited()
        inherited.append((conn, sess))

    @property
    def session_id(self) -> Optional[str]:
        """The current session's id (as `describe()` shows it), None before the first
        lock."""
        s = self._sess
        return s.session_id if s is not None and s.ended is None else None

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
    ) -> Lock:
        """Takes `key` for the calling thread and returns the held `Lock` (also a
        context manager).

        wait:   seconds to wait while the key is busy; 0 fails at once; None (the
                default) waits as long as the sidecar allows (24 h).
        ttl:    seconds the store keeps the lock if the sidecar stops renewing it
                (1 s to the sidecar's maximum); None: the sidecar's default (10 s).
        shared: a reader lock: shared holders coexist and exclude exclusive ones.
        limit:  N > 1 makes the key a semaphore of N permits (not with `shared`).
        fair:   wait in arrival order.
        value:  the holder's value, shown by `describe()` and `watch()` (bytes, or
                str in UTF-8; at most 4 KiB). On a key this session already holds, a
                non-empty value replaces the value (as `proclaim`).
        holder: who holds it in the session; None (the default) is the calling
                thread (`thread:N:NAME`), "" the session itself. At most 128 bytes,
                no control characters. `release()` may come from any thread.

        Raises `NotAcquired` (busy, timed out), `Rejected` (a bad value, a conflicting
        mode or limit, the store unreachable), `Unavailable` (no sidecar), and
        `TypeError`/`ValueError` for values that are not numbers of seconds.
        """
        who = thread_holder() if holder is None else holder
        lock = self._session().acquire(key, (wait, ttl, shared, limit, fair, value), who)
        lock._client = self
        return lock

    def campaign(
        self,
        key: str,
        value: "bytes | str" = b"",
        *,
        wait: Optional[float] = None,
        ttl: Optional[float] = None,
        holder: Optional[str] = None,
    ) -> Lock:
        """Campaigns for leadership of `key` with `value` (who you are, where to reach
        you) and returns once this client leads: the returned `Lock` is leadership.
        Candidates lead in the order they campaigned, across every sidecar of the
        store (a fair EXCLUSIVE lock). Lead while `lock.lost` is not set; `proclaim()`
        changes the value followers see; `release()` (or leaving a `with` block) hands
        leadership to the next candidate. `wait`, `ttl` and `holder` as in `lock()`."""
        who = thread_holder() if holder is None else holder
        lock = self._session().acquire(key, (wait, ttl, False, 0, True, value), who)
        lock._client = self
        return lock

    def watch(self, key: str) -> Watch:
        """Follows `key`: a `Watch` to iterate for its states (`Description`s), its
        state now first. Followers of an election read `state.leader`: None while
        nobody leads (campaign, or wait), else the leader's `value` and
        `fencing_token`."""
        with self._mu:
            conn = self._connection()
        call = conn.watch(pb.WatchRequest(key=key), metadata=self._metadata)
        return Watch(call, key)

    def describe(self, key: str, timeout: float = 5.0) -> Description:
        """The store's view of `key`: holders (one per holder of a session), waiters,
        fair queue, last fencing token."""
        with self._mu:
            conn = self._connection()
        try:
            resp = conn.describe(
                pb.DescribeRequest(key=key),
                timeout=timeout,
                metadata=self._metadata,
                wait_for_ready=True,
            )
        except grpc.RpcError as e:
            raise call_error(key, e) from None
        return description(resp)

    def close(self) -> None:
        """Ends the session (the sidecar releases every lock it holds; their `lost` and
        `suspended` are set, and `release()` of them does nothing) and closes the
        channel. Idempotent."""
        with self._mu:
            if self._closed:
                return
            self._closed = True
            sess, self._sess = self._sess, None
            conn, self._conn = self._conn, None
            finalizer, self._finalizer = self._finalizer, None
        if finalizer is not None:
            finalizer.detach()
        if sess is not None:
            sess.close()
        if conn is not None:
            conn.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
