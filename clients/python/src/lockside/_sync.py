"""The blocking client, on grpcio's threaded API."""

from __future__ import annotations

import queue
import threading
from typing import Any, Iterator, Optional, Sequence, Tuple

import grpc

from lockside._core import (
    ANSWER_SLACK,
    DESCRIBE_METHOD,
    KEEPALIVE_OPTIONS,
    LEASE_METHOD,
    WATCH_METHOD,
    Description,
    LockBase,
    LocksideError,
    LockLost,
    Pending,
    Rejected,
    SessionBase,
    Unavailable,
    acquire_request,
    call_error,
    call_metadata,
    channel_target,
    default_addr,
    description,
    log,
    pb,
    proclaim_request,
    release_request,
    rpc_error_text,
)

_CLOSE = object()  # ends the request iterator: the stream is half-closed


class Lock(LockBase):
    """A held lock (from `Client.lock`); a context manager that releases on exit.

    `lost` is a `threading.Event`, set when the sidecar sends `Lost` for the key or
    the session's stream breaks while the lock is held: stop using the resource then.
    `release()` (and so leaving the `with` block without another exception) raises
    `LockLost` if the lock was lost before it.
    """

    _session: "_Session"

    def __init__(self, session: "_Session", key: str, granted: Any):
        super().__init__(session, key, granted)
        self.lost = threading.Event()

    def _signal_lost(self) -> None:
        self.lost.set()

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

    def __init__(self, kind: str, key: str):
        super().__init__(kind, key)
        # A bare lock is CPython's cheapest cross-thread wake-up (an Event is a
        # Condition around one): taken now, released by the reader with the answer.
        self.done = threading.Lock()
        self.done.acquire()

    def _notify(self) -> None:
        self.done.release()


class _Session(SessionBase):
    """One `Lease` stream: requests go through a queue that grpcio's request thread
    drains; a reader thread routes every answer to its waiter and every `Lost` to its
    locks."""

    def __init__(self, client: "Client"):
        super().__init__()
        self._mu = threading.Lock()
        self._requests: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._closing = False
        self._opened = threading.Lock()
        self._opened.acquire()
        self._call = client._lease(
            self._request_iter(), metadata=client._metadata, wait_for_ready=True
        )
        self._reader = threading.Thread(target=self._read, name="lockside-session", daemon=True)
        self._reader.start()
        if not self._opened.acquire(timeout=client.connect_timeout):
            self._call.cancel()
            raise Unavailable(
                f"no answer from the sidecar at {client.addr} within "
                f"{client.connect_timeout:g}s"
            )
        if self.ended is not None:
            raise Unavailable(f"cannot open a session at {client.addr}: {self.ended}")

    def _request_iter(self) -> Iterator[Any]:
        # Blocks on the queue, so the stream stays open until _CLOSE is queued.
        get = self._requests.get
        while True:
            item = get()
            if item is _CLOSE:
                return
            yield item

    def _read(self) -> None:
        reason, code = "closed by the sidecar", None
        opened = False
        try:
            responses = iter(self._call)
            first = next(responses)
            with self._mu:
                self._started(first)
            opened = True
            self._opened.release()
            mu, dispatch = self._mu, self._dispatch
            for resp in responses:
                with mu:
                    dispatch(resp)
        except StopIteration:
            pass
        except grpc.RpcError as e:
            reason, code = rpc_error_text(e)
        except Exception as e:  # noqa: BLE001 - any failure ends the session
            reason, code = rpc_error_text(e)
        if self._closing:
            reason = "client closed"
        with self._mu:
            self._end(reason, code)
        if not opened:
            self._opened.release()

    def _send_nowait(self, request: Any) -> None:
        self._requests.put(request)

    def _new_lock(self, key: str, granted: Any) -> Lock:
        return Lock(self, key, granted)

    def _wait(self, rid: int, pending: _SyncPending, timeout: float) -> None:
        try:
            answered = pending.done.acquire(timeout=timeout)
        except BaseException:  # KeyboardInterrupt while waiting
            with self._mu:
                self._abandon(rid, pending)
            raise
        if not answered:
            with self._mu:
                if rid in self._pending:
                    self._abandon(rid, pending)
                    raise Unavailable(f"no answer from the sidecar within {timeout:g}s")

    def acquire(
        self,
        key: str,
        wait: Optional[float],
        ttl: Optional[float],
        shared: bool,
        limit: int,
        fair: bool,
        value: "bytes | str" = b"",
    ) -> Lock:
        with self._mu:
            if self.ended is not None:
                raise Unavailable(f"lease stream ended: {self.ended}")
            rid = next(self._ids)
            request, timeout = acquire_request(rid, key, wait, ttl, shared, limit, fair, value)
            pending = _SyncPending("acquire", key)
            self._pending[rid] = pending
            self._requests.put(request)
        self._wait(rid, pending, timeout)
        return self._answer(key, pending)

    def release(self, lock: Lock) -> None:
        with self._mu:
            if lock._state == "released":
                return
            if lock._state == "lost":
                lock._state = "released"  # LockLost is raised once
                raise lock._lost_error()
            rid = next(self._ids)
            pending = _SyncPending("release", lock.key)
            self._pending[rid] = pending
            self._requests.put(release_request(rid, lock.key))
        self._wait(rid, pending, ANSWER_SLACK)
        with self._mu:
            self._released(lock, pending)

    def proclaim(self, lock: Lock, value: "bytes | str") -> None:
        request = proclaim_request(0, lock.key, value)  # a bad value fails before sending
        with self._mu:
            if lock._state == "lost":
                raise lock._lost_error()
            if lock._state == "released":
                raise LocksideError(f"lock {lock.key!r} was released")
            rid = next(self._ids)
            request.proclaim.request_id = rid
            pending = _SyncPending("proclaim", lock.key)
            self._pending[rid] = pending
            self._requests.put(request)
        self._wait(rid, pending, ANSWER_SLACK)
        with self._mu:
            self._proclaimed(lock, pending)

    def close(self, timeout: float = 2.0) -> None:
        """Half-closes the stream (the sidecar then releases everything and ends it)
        and waits up to `timeout` for that; cancels the stream after."""
        self._closing = True
        self._requests.put(_CLOSE)
        self._reader.join(timeout)
        if self._reader.is_alive():
            self._call.cancel()
            self._reader.join(timeout)


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
    session, opened on the first `lock()`): they are owned by the session, not by a
    thread, so two threads sharing a client that lock the same key both hold it
    (reentrancy); give threads that must exclude each other a client each.

    If the stream breaks, every lock of the session is marked lost and the next
    `lock()` opens a new session.

    Options: `client_name` (shown by `describe()`), `auth_token` (the sidecar's
    `--auth-token-file`), `credentials` (`grpc.ssl_channel_credentials(...)` for a TLS
    sidecar), `options` (extra gRPC channel options), `connect_timeout` (seconds to
    wait for a new session).
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
    ):
        self.addr = addr or default_addr()
        self.connect_timeout = connect_timeout
        target = channel_target(self.addr)
        opts = KEEPALIVE_OPTIONS + list(options)
        if credentials is None:
            self._channel = grpc.insecure_channel(target, options=opts)
        else:
            self._channel = grpc.secure_channel(target, credentials, options=opts)
        self._metadata = call_metadata(client_name, auth_token)
        self._lease = self._channel.stream_stream(
            LEASE_METHOD,
            request_serializer=pb.LeaseRequest.SerializeToString,
            response_deserializer=pb.LeaseResponse.FromString,
        )
        self._describe = self._channel.unary_unary(
            DESCRIBE_METHOD,
            request_serializer=pb.DescribeRequest.SerializeToString,
            response_deserializer=pb.DescribeResponse.FromString,
        )
        self._watch = self._channel.unary_stream(
            WATCH_METHOD,
            request_serializer=pb.WatchRequest.SerializeToString,
            response_deserializer=pb.WatchResponse.FromString,
        )
        self._mu = threading.Lock()
        self._sess: Optional[_Session] = None
        self._closed = False

    def _session(self) -> _Session:
        with self._mu:
            if self._closed:
                raise LocksideError("the client is closed")
            if self._sess is None or self._sess.ended is not None:
                self._sess = None
                self._sess = _Session(self)
            return self._sess

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
    ) -> Lock:
        """Takes `key` and returns the held `Lock` (also a context manager).

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

        Raises `NotAcquired` (busy, timed out), `Rejected` (a bad value, a conflicting
        mode or limit, the store unreachable), `Unavailable` (no sidecar), and
        `TypeError`/`ValueError` for values that are not numbers of seconds.
        """
        return self._session().acquire(key, wait, ttl, shared, limit, fair, value)

    def campaign(
        self,
        key: str,
        value: "bytes | str" = b"",
        *,
        wait: Optional[float] = None,
        ttl: Optional[float] = None,
    ) -> Lock:
        """Campaigns for leadership of `key` with `value` (who you are, where to reach
        you) and returns once this client leads: the returned `Lock` is leadership.
        Candidates lead in the order they campaigned, across every sidecar of the
        store (a fair EXCLUSIVE lock). Lead while `lock.lost` is not set; `proclaim()`
        changes the value followers see; `release()` (or leaving a `with` block) hands
        leadership to the next candidate. `wait` and `ttl` as in `lock()`."""
        return self._session().acquire(key, wait, ttl, False, 0, True, value)

    def watch(self, key: str) -> Watch:
        """Follows `key`: a `Watch` to iterate for its states (`Description`s), its
        state now first. Followers of an election read `state.leader`: None while
        nobody leads (campaign, or wait), else the leader's `value` and
        `fencing_token`."""
        call = self._watch(pb.WatchRequest(key=key), metadata=self._metadata)
        return Watch(call, key)

    def describe(self, key: str, timeout: float = 5.0) -> Description:
        """The store's view of `key`: holders, waiters, fair queue, last fencing token."""
        try:
            resp = self._describe(
                pb.DescribeRequest(key=key),
                timeout=timeout,
                metadata=self._metadata,
                wait_for_ready=True,
            )
        except grpc.RpcError as e:
            raise call_error(key, e) from None
        return description(resp)

    def close(self) -> None:
        """Ends the session (the sidecar releases every lock it holds; their `lost` is
        set) and closes the channel. Idempotent."""
        with self._mu:
            if self._closed:
                return
            self._closed = True
            sess, self._sess = self._sess, None
        if sess is not None:
            sess.close()
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
