"""The blocking client, on grpcio's threaded API: `Client` and its `Watch`. Every
decision is `ClientBase`'s (`_client.py`) and `SessionBase`'s (`_core.py`); the
session's I/O and its `Lock`s are in `_sync_session.py`, the channel and what
outlives a client in `_sync_channel.py`."""

from __future__ import annotations

import threading
import weakref
from typing import Any, Optional

import grpc

from lockside._client import ClientBase
from lockside._core import Options
from lockside._describe import Description, WatchBase, call_errors, description
from lockside._errors import Unavailable
from lockside._holders import thread_holder
from lockside._pb import lockside_pb2 as pb
from lockside._sidecar import dial_address
from lockside._stream import inherited
from lockside._sync_channel import _clients, _collected, _Conn, _probe, _start_closer
from lockside._sync_session import Lock, _Session


class Watch(WatchBase):
    """The states of a watched key, from `Client.watch`: iterate it for
    `Description`s, the key's state now and then one per change (a grant, a release,
    an expiry, a holder's value). A slow reader gets the latest state, skipping those
    in between. `cancel()`, or leaving a `with` block, ends it (the iteration then
    stops); iterating raises `Rejected` for a bad key or a watch limit reached and
    `Unavailable` when the sidecar or its store cannot be reached."""

    def __iter__(self) -> "Watch":
        return self

    def __next__(self) -> Description:
        try:
            resp = next(self._call)
        except grpc.RpcError as e:
            raise (self._failed(e) or StopIteration()) from None
        return description(resp.state)

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.cancel()


class Client(ClientBase[Lock]):
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

    _sess: Optional[_Session]

    def _setup(self) -> None:
        self._mu = threading.Lock()
        # The channel, made on first use (so in a forked child, its own).
        self._conn: Optional[_Conn] = None
        self._finalizer: "Optional[weakref.finalize[Any, Any]]" = None
        _clients.add(self)

    def _connection(self) -> _Conn:
        """The channel (mutex held)."""
        self._check_open()
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
            self._refused(e)
        where = dial_address(self.addr)
        cause = None if where is None else _probe(*where)
        return _Session(self, conn, True, self._sidecar_wait(cause))

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

    def _take(self, key: str, options: Options, holder: Optional[str]) -> Lock:
        who = thread_holder() if holder is None else holder
        lock = self._session().acquire(key, options, who)
        lock._client = self
        return lock

    def watch(self, key: str) -> Watch:
        """Follows `key`: a `Watch` to iterate for its states (`Description`s), its
        state now first. Followers of an election read `state.leader`: None while
        nobody leads (campaign, or wait), else the leader's `value` and
        `fencing_token`."""
        with self._mu:
            conn = self._connection()
        return Watch(conn.watch(pb.WatchRequest(key=key), metadata=self._metadata), key)

    def describe(self, key: str, timeout: float = 5.0) -> Description:
        """The store's view of `key`: holders (one per holder of a session), waiters,
        fair queue, last fencing token."""
        with self._mu:
            conn = self._connection()
        with call_errors(key):
            resp = conn.describe(pb.DescribeRequest(key=key), **self._describe_options(timeout))
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
