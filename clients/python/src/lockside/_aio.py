"""The asyncio client, on grpc.aio: the stream is written and read on the event loop,
with no thread of its own."""

from __future__ import annotations

import asyncio
from typing import Any, Generator, Optional, Sequence, Set, Tuple

import grpc
import grpc.aio

from lockside._core import (
    ANSWER_SLACK,
    DESCRIBE_METHOD,
    KEEPALIVE_OPTIONS,
    LEASE_METHOD,
    WATCH_METHOD,
    Description,
    LockBase,
    LocksideError,
    Pending,
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


class AsyncLock(LockBase):
    """A held lock (from `AsyncClient.lock`); an async context manager that releases
    on exit.

    `lost` is an `asyncio.Event`, set when the sidecar sends `Lost` for the key or the
    session's stream breaks while the lock is held; `await lock.lost_wait()` returns
    then. `release()` (and so leaving the `async with` block without another exception)
    raises `LockLost` if the lock was lost before it.
    """

    _session: "_AioSession"

    def __init__(self, session: "_AioSession", key: str, granted: Any):
        super().__init__(session, key, granted)
        self.lost = asyncio.Event()

    def _signal_lost(self) -> None:
        self.lost.set()

    async def lost_wait(self) -> str:
        """Returns (with the reason) once the lock is lost. Never returns after a clean
        release: race it against your work (`asyncio.wait`, a TaskGroup)."""
        await self.lost.wait()
        return self.lost_reason or "lost"

    async def proclaim(self, value: "bytes | str") -> None:
        """Replaces the lock's value; see `lockside.Lock.proclaim`."""
        await self._session.proclaim(self, value)

    async def release(self) -> None:
        """Gives the lock back and waits for the sidecar to confirm; see
        `lockside.Lock.release`."""
        await self._session.release(self)

    async def __aenter__(self) -> "AsyncLock":
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            await self.release()
            return
        try:
            await self.release()
        except LocksideError as e:  # do not hide the exception leaving the block
            log.warning("releasing %r while leaving on %s: %s", self.key, exc_type.__name__, e)


class _AioPending(Pending):
    __slots__ = ("future",)

    def __init__(self, kind: str, key: str, loop: asyncio.AbstractEventLoop):
        super().__init__(kind, key)
        self.future: asyncio.Future = loop.create_future()

    def _notify(self) -> None:
        if not self.future.done():
            self.future.set_result(None)


class _AioSession(SessionBase):
    """One `Lease` stream: requests are written under a lock (gRPC allows one write in
    flight); a reader task routes answers to futures and `Lost` to locks."""

    def __init__(self, call: Any, loop: asyncio.AbstractEventLoop):
        super().__init__()
        self._call = call
        self._loop = loop
        self._write_lock = asyncio.Lock()
        self._reader: Optional[asyncio.Task] = None
        self._background: Set[asyncio.Task] = set()
        self._closing = False

    @classmethod
    async def open(cls, client: "AsyncClient") -> "_AioSession":
        client._get_channel()
        call = client._lease(metadata=client._metadata, wait_for_ready=True)
        self = cls(call, asyncio.get_running_loop())
        try:
            first = await asyncio.wait_for(call.read(), client.connect_timeout)
        except asyncio.TimeoutError:
            call.cancel()
            raise Unavailable(
                f"no answer from the sidecar at {client.addr} within "
                f"{client.connect_timeout:g}s"
            ) from None
        except grpc.RpcError as e:
            text, code = rpc_error_text(e)
            raise Unavailable(f"cannot open a session at {client.addr}: {text}", code) from None
        if first is grpc.aio.EOF:
            raise Unavailable(f"cannot open a session at {client.addr}: stream ended")
        self._started(first)
        self._reader = asyncio.ensure_future(self._read())
        return self

    async def _read(self) -> None:
        reason, code = "closed by the sidecar", None
        read, dispatch = self._call.read, self._dispatch
        try:
            while True:
                resp = await read()
                if resp is grpc.aio.EOF:
                    break
                dispatch(resp)
        except asyncio.CancelledError:
            reason = "client closed"
        except grpc.RpcError as e:
            reason, code = rpc_error_text(e)
        except Exception as e:  # noqa: BLE001 - any failure ends the session
            reason, code = rpc_error_text(e)
        if self._closing:
            reason = "client closed"
        self._end(reason, code)

    async def _write(self, request: Any) -> None:
        try:
            async with self._write_lock:
                await self._call.write(request)
        except (grpc.RpcError, asyncio.InvalidStateError) as e:
            text, code = rpc_error_text(e)
            raise Unavailable(f"lease stream broken: {text}", code) from None

    async def _write_quietly(self, request: Any) -> None:
        try:
            await self._write(request)
        except Unavailable:
            pass  # the reader ends the session

    def _send_nowait(self, request: Any) -> None:
        task = self._loop.create_task(self._write_quietly(request))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _new_lock(self, key: str, granted: Any) -> AsyncLock:
        return AsyncLock(self, key, granted)

    def _timed_out(self, rid: int, pending: _AioPending, timeout: float) -> None:
        if self._pending.get(rid) is pending:
            self._abandon(rid, pending)
            pending.resolve(
                error=Unavailable(f"no answer from the sidecar within {timeout:g}s")
            )

    async def _request(self, rid: int, pending: _AioPending, request: Any, timeout: float) -> None:
        # A timer rather than asyncio.wait_for: no extra task on the fast path.
        timer = self._loop.call_later(timeout, self._timed_out, rid, pending, timeout)
        try:
            await self._write(request)
            await pending.future
        except asyncio.CancelledError:
            self._abandon(rid, pending)
            raise
        except Unavailable:
            self._pending.pop(rid, None)
            raise
        finally:
            timer.cancel()

    async def acquire(
        self,
        key: str,
        wait: Optional[float],
        ttl: Optional[float],
        shared: bool,
        limit: int,
        fair: bool,
        value: "bytes | str" = b"",
    ) -> AsyncLock:
        if self.ended is not None:
            raise Unavailable(f"lease stream ended: {self.ended}")
        rid = next(self._ids)
        request, timeout = acquire_request(rid, key, wait, ttl, shared, limit, fair, value)
        pending = _AioPending("acquire", key, self._loop)
        self._pending[rid] = pending
        await self._request(rid, pending, request, timeout)
        return self._answer(key, pending)

    async def release(self, lock: AsyncLock) -> None:
        if lock._state == "released":
            return
        if lock._state == "lost":
            lock._state = "released"  # LockLost is raised once
            raise lock._lost_error()
        rid = next(self._ids)
        pending = _AioPending("release", lock.key, self._loop)
        self._pending[rid] = pending
        await self._request(rid, pending, release_request(rid, lock.key), ANSWER_SLACK)
        self._released(lock, pending)

    async def proclaim(self, lock: AsyncLock, value: "bytes | str") -> None:
        request = proclaim_request(0, lock.key, value)  # a bad value fails before sending
        if lock._state == "lost":
            raise lock._lost_error()
        if lock._state == "released":
            raise LocksideError(f"lock {lock.key!r} was released")
        rid = next(self._ids)
        request.proclaim.request_id = rid
        pending = _AioPending("proclaim", lock.key, self._loop)
        self._pending[rid] = pending
        await self._request(rid, pending, request, ANSWER_SLACK)
        self._proclaimed(lock, pending)

    async def close(self, timeout: float = 2.0) -> None:
        """Half-closes the stream (the sidecar then releases everything and ends it),
        waits up to `timeout` for that, and cancels the stream after."""
        self._closing = True
        try:
            async with self._write_lock:
                await self._call.done_writing()
        except (grpc.RpcError, asyncio.InvalidStateError):
            pass
        reader = self._reader
        if reader is not None and not reader.done():
            try:
                await asyncio.wait_for(asyncio.shield(reader), timeout)
            except asyncio.TimeoutError:
                self._call.cancel()
                reader.cancel()
        self._end("client closed")


class _LockRequest:
    """What `AsyncClient.lock()` returns: await it for the lock, or use it in
    `async with` (released on exit)."""

    def __init__(self, client: "AsyncClient", key: str, options: Tuple):
        self._client = client
        self._key = key
        self._options = options
        self._lock: Optional[AsyncLock] = None

    async def _acquire(self) -> AsyncLock:
        session = await self._client._session()
        return await session.acquire(self._key, *self._options)

    def __await__(self) -> Generator[Any, None, AsyncLock]:
        return self._acquire().__await__()

    async def __aenter__(self) -> AsyncLock:
        self._lock = await self._acquire()
        return self._lock

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            await lock.__aexit__(exc_type, exc, tb)


class AsyncWatch:
    """The states of a watched key, from `AsyncClient.watch`: `async for state in
    watch`; see `lockside.Watch`. `cancel()`, or leaving an `async with` block, ends
    it."""

    def __init__(self, call: Any, key: str):
        self._call = call
        self._key = key
        self._cancelled = False

    def __aiter__(self) -> "AsyncWatch":
        return self

    async def __anext__(self) -> Description:
        try:
            resp = await self._call.read()
        except asyncio.CancelledError:
            if self._cancelled:
                raise StopAsyncIteration from None
            raise
        except grpc.RpcError as e:
            if self._cancelled:
                raise StopAsyncIteration from None
            raise call_error(self._key, e) from None
        if resp is grpc.aio.EOF:
            raise StopAsyncIteration
        return description(resp.state)

    def cancel(self) -> None:
        """Ends the watch."""
        self._cancelled = True
        self._call.cancel()

    async def __aenter__(self) -> "AsyncWatch":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.cancel()


class AsyncClient:
    """The asyncio client (grpc.aio): one session per client, as `lockside.Client`.

        async with AsyncClient() as c:
            async with c.lock("orders", wait=5.0) as lock:
                ...  # lock.fencing_token; await lock.lost_wait() returns when lost

    The channel is created on first use, on the running loop; use a client from one
    event loop only.
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
        self._credentials = credentials
        self._options = KEEPALIVE_OPTIONS + list(options)
        self._metadata = call_metadata(client_name, auth_token)
        self._channel: Optional[grpc.aio.Channel] = None
        self._sess: Optional[_AioSession] = None
        self._opening: Optional[asyncio.Lock] = None
        self._closed = False

    def _get_channel(self) -> "grpc.aio.Channel":
        if self._channel is None:
            target = channel_target(self.addr)
            if self._credentials is None:
                self._channel = grpc.aio.insecure_channel(target, options=self._options)
            else:
                self._channel = grpc.aio.secure_channel(
                    target, self._credentials, options=self._options
                )
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
        return self._channel

    async def _session(self) -> _AioSession:
        sess = self._sess
        if sess is not None and sess.ended is None:
            return sess
        if self._closed:
            raise LocksideError("the client is closed")
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._closed:
                raise LocksideError("the client is closed")
            if self._sess is None or self._sess.ended is not None:
                self._sess = None
                self._sess = await _AioSession.open(self)
            return self._sess

    @property
    def session_id(self) -> Optional[str]:
        """The current session's id, None before the first lock."""
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
    ) -> _LockRequest:
        """Takes `key`: `await c.lock(...)` returns the `AsyncLock`; `async with
        c.lock(...) as lock` releases it on exit. Options and errors as
        `lockside.Client.lock`. Cancelling the awaiting task cancels the wait."""
        return _LockRequest(self, key, (wait, ttl, shared, limit, fair, value))

    def campaign(
        self,
        key: str,
        value: "bytes | str" = b"",
        *,
        wait: Optional[float] = None,
        ttl: Optional[float] = None,
    ) -> _LockRequest:
        """Campaigns for leadership of `key` with `value`: `await c.campaign(...)`
        returns once this client leads (an `AsyncLock`: leadership); `async with`
        resigns on exit. See `lockside.Client.campaign`."""
        return _LockRequest(self, key, (wait, ttl, False, 0, True, value))

    def watch(self, key: str) -> AsyncWatch:
        """Follows `key`: `async for state in c.watch(key)`, its state now first; see
        `lockside.Client.watch`."""
        if self._closed:
            raise LocksideError("the client is closed")
        self._get_channel()
        call = self._watch(pb.WatchRequest(key=key), metadata=self._metadata)
        return AsyncWatch(call, key)

    async def describe(self, key: str, timeout: float = 5.0) -> Description:
        """The store's view of `key`: holders, waiters, fair queue, last fencing token."""
        if self._closed:
            raise LocksideError("the client is closed")
        self._get_channel()
        try:
            resp = await self._describe(
                pb.DescribeRequest(key=key),
                timeout=timeout,
                metadata=self._metadata,
                wait_for_ready=True,
            )
        except grpc.RpcError as e:
            raise call_error(key, e) from None
        return description(resp)

    async def close(self) -> None:
        """Ends the session (the sidecar releases every lock it holds; their `lost` is
        set) and closes the channel. Idempotent."""
        if self._closed:
            return
        self._closed = True
        sess, self._sess = self._sess, None
        if sess is not None:
            await sess.close()
        if self._channel is not None:
            await self._channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
