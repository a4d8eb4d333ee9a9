"""The asyncio client, on grpc.aio: the stream is written and read on the event loop,
with no thread of its own."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, Callable, Coroutine, Generator, List, Optional, Sequence, Tuple

import grpc
import grpc.aio

from lockside._aio_stream import _AioStream
from lockside._core import ENDED, OPEN, RESUMING, Options, Pending, SessionBase
from lockside._greeting import Greeting
from lockside._resume import FIRST_RESUME_BACKOFF, Cancellable, next_backoff
from lockside._describe import Description, description
from lockside._errors import LocksideError, Unavailable, call_error, rpc_error_text
from lockside._holders import task_holder
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


class AsyncLock(LockBase):
    """A held lock (from `AsyncClient.lock`); an async context manager that releases
    on exit.

    `suspended` and `lost` are `asyncio.Event`s with the meaning they have on
    `lockside.Lock`: use the resource only while `suspended` is not set (it is set the
    moment the session's stream breaks, cleared when the resumed session lists the lock
    again, and stays set once the lock is lost); `await lock.restored_wait()` waits
    while it is suspended, `await lock.lost_wait()` until it is lost. `release()` (and
    so leaving the `async with` block without another exception) raises `LockLost` if
    the lock was lost before it.
    """

    _session: "_AioSession"

    def __init__(
        self, session: "_AioSession", key: str, holder: str, granted: Any, ttl_asked: float
    ):
        super().__init__(session, key, holder, granted, ttl_asked)
        self.lost = asyncio.Event()
        self.suspended = asyncio.Event()

    def _signal_lost(self) -> None:
        self.lost.set()

    def _signal_suspended(self, suspended: bool) -> None:
        if suspended:
            self.suspended.set()
        else:
            self.suspended.clear()

    async def restored_wait(self) -> bool:
        """Waits while the lock is suspended: True once it may be used (at once when it
        is not suspended), False when it is lost or released. The outcome comes at the
        latest when the lock's TTL has passed since the break; bound the wait with
        `asyncio.wait_for` to give up sooner."""
        while self._suspended and self._state == "held":
            await self._session._locks_change()
        return self._usable()

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
    __slots__ = ("future", "deadline")

    def __init__(self, loop: asyncio.AbstractEventLoop, *request: Any):
        super().__init__(*request)
        self.future: "asyncio.Future[None]" = loop.create_future()
        self.deadline = 0.0  # loop.time() after which the answer is given up on

    def _notify(self) -> None:
        if not self.future.done():
            self.future.set_result(None)


# -- the stream ------------------------------------------------------------------

#: Whether streams use grpc.aio's private call layer (`call._cython_call`) for their
#: messages; `_AioStream` (`_aio_stream.py`) uses the public `write`/`read` when this
#: is False or the layer is not there (tests run both).
_fast_streams = True


class _AioSession(SessionBase[AsyncLock, _AioPending]):
    """One session: requests are sent as they are made (`_AioStream`); the stream's
    read callbacks route answers to futures and `Lost` to locks, and a reader task
    waits for the stream's end and resumes the session on a new stream when it broke
    as if the sidecar died (see `SessionBase`, which makes every decision)."""

    def __init__(self, client: "AsyncClient", call: Any, loop: asyncio.AbstractEventLoop):
        super().__init__(client.resume, client._metadata)
        self._client = client
        self._call = call
        self._stream = _AioStream(call, self._on_message, _fast_streams)
        self._loop = loop
        self._reader: "Optional[asyncio.Task[None]]" = None
        # Set when a resume ends (resumed, or the session ended); callers wait on it.
        self._settled = asyncio.Event()
        self._settled.set()
        # Gives up on answers that do not come (see `_watch_answers`).
        self._watchdog: Optional[asyncio.TimerHandle] = None
        # `restored_wait` callers, woken when locks are restored or lost.
        self._lock_waiters: "List[asyncio.Future[None]]" = []

    @classmethod
    async def open(
        cls, client: "AsyncClient", wait_for_ready: bool, timeout: float
    ) -> "_AioSession":
        client._get_channel()
        call = client._lease(metadata=client._metadata, wait_for_ready=wait_for_ready)
        self = cls(client, call, asyncio.get_running_loop())
        try:
            first = await asyncio.wait_for(call.read(), timeout)
        except asyncio.TimeoutError:
            call.cancel()
            raise Unavailable(
                f"no answer from the sidecar at {client.addr} within {timeout:g}s",
                grpc.StatusCode.DEADLINE_EXCEEDED,
            ) from None
        except grpc.RpcError as e:
            text, code = rpc_error_text(e)
            raise Unavailable(f"cannot open a session at {client.addr}: {text}", code) from None
        if first is grpc.aio.EOF:
            raise Unavailable(f"cannot open a session at {client.addr}: stream ended")
        self._started(pb.LeaseResponse.FromString(first))
        self._reader = asyncio.ensure_future(self._run())
        return self

    # -- the reader task -------------------------------------------------------------

    async def _run(self) -> None:
        stream: Optional[_AioStream] = self._stream
        while stream is not None:
            call = stream.call
            reason, code, details = "closed by the sidecar", None, ""
            try:
                await stream.run()
            except asyncio.CancelledError:
                reason = "client closed"
            except grpc.RpcError as e:
                reason, code = rpc_error_text(e)
                details = e.details() if hasattr(e, "details") else ""
            except Exception as e:  # noqa: BLE001 - a bad message ends the session
                call.cancel()
                self._end(f"protocol error: {rpc_error_text(e)[0]}")
                return
            if not self._on_break(reason, code, details or ""):
                return
            self._settled.clear()
            stream = await self._resume()

    def _on_message(self, data: bytes) -> None:
        self._dispatch(pb.LeaseResponse.FromString(data))

    async def _resume(self) -> Optional[_AioStream]:
        """Resumes the session on new streams until one answers or nothing is held
        any more; returns the new stream, or None when the session ended."""
        backoff = FIRST_RESUME_BACKOFF
        while self.state is RESUMING:
            metadata = self._resume_metadata()
            call = self._attempt = self._client._lease(metadata=metadata, wait_for_ready=True)
            greeting = Greeting()
            try:
                data = await call.read()
                while data is not grpc.aio.EOF and greeting.feed(data):
                    data = await call.read()
            except asyncio.CancelledError:
                if self.state is RESUMING:  # not ours: the task is cancelled
                    call.cancel()
                    raise
            except grpc.RpcError as e:
                greeting.fail(*rpc_error_text(e))
            except Exception as e:  # noqa: BLE001 - a bad answer is a failed attempt
                greeting.fail(rpc_error_text(e)[0])
            self._attempt = None
            resent = self._take_resume(greeting)
            if resent is not None:
                self._call = call
                self._stream = _AioStream(call, self._on_message, _fast_streams)
                for data in resent:
                    self._send_nowait(data)
                return self._stream
            call.cancel()
            if not self._retry_resume(greeting, backoff):
                return None
            try:
                await asyncio.wait_for(self._settled.wait(), backoff)
            except asyncio.TimeoutError:
                pass
            backoff = next_backoff(backoff)
        return None

    # -- what SessionBase asks of its client -----------------------------------------

    def _new_lock(self, key: str, holder: str, granted: Any, ttl: float) -> AsyncLock:
        return AsyncLock(self, key, holder, granted, ttl)

    def _settle(self) -> None:
        self._settled.set()

    def _send_nowait(self, request: bytes) -> None:
        # Not while resuming: the resume sends again what was not answered.
        if self.state is OPEN:
            self._stream.send(request)

    def _locks_changed(self) -> None:
        waiters, self._lock_waiters = self._lock_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _call_later(self, delay: float, callback: Callable[[], None]) -> Cancellable:
        return self._loop.call_later(delay, callback)

    def _new_pending(self, *request: Any) -> _AioPending:
        return _AioPending(self._loop, *request)

    # -- callers ---------------------------------------------------------------------

    async def _locks_change(self) -> None:
        """Returns when locks of the session are next restored or lost."""
        waiter = self._loop.create_future()
        self._lock_waiters.append(waiter)
        await waiter

    async def _ready(self) -> None:
        while self.state is RESUMING:
            await self._settled.wait()
        self._check_not_ended()

    def _watch_answers(self) -> None:
        """Once a second while answers are awaited: gives up on those past their
        time (the sidecar answers every request; only a broken one does not, and
        keepalive ends its stream first). One timer per session rather than one per
        request: the fast path stays free of timers."""
        self._watchdog = None
        now = self._loop.time()
        for rid, pending in list(self._pending.items()):
            if pending.deadline > now:
                continue
            error = self._overdue(rid, pending)
            if error is None:
                # Sent again once resumed, or failed when not: wait for that.
                pending.deadline = now + pending.timeout
                continue
            pending.deadline = float("inf")
            pending.resolve(error=error)
        if self._pending and self.state is not ENDED:
            self._watchdog = self._loop.call_later(1.0, self._watch_answers)

    async def _request(self, rid: int, pending: _AioPending) -> None:
        pending.deadline = self._loop.time() + pending.timeout
        self._submit(rid, pending)
        if self._watchdog is None:
            self._watchdog = self._loop.call_later(1.0, self._watch_answers)
        try:
            await pending.future
        except asyncio.CancelledError:
            self._abandon(rid, pending)
            raise

    async def acquire(self, key: str, options: Options, holder: str) -> AsyncLock:
        if self.state is not OPEN:
            await self._ready()
        rid, pending = self._acquiring(key, options, holder)
        await self._request(rid, pending)
        return self._answer(key, pending)

    async def release(self, lock: AsyncLock) -> None:
        request = self._releasing(lock)
        if request is not None:
            await self._request(*request)
            self._released(lock, request[1])

    async def proclaim(self, lock: AsyncLock, value: "bytes | str") -> None:
        # (a bad value fails before anything is sent)
        rid, pending = self._proclaiming(lock, value_bytes(value))
        await self._request(rid, pending)
        self._proclaimed(lock, pending)

    async def close(self, timeout: float = 2.0) -> None:
        """Half-closes the stream (the sidecar then releases everything and ends it),
        waits up to `timeout` for that, and cancels the stream after. A session that
        is resuming ends at once (its locks stay in the store until their TTL)."""
        if self._start_closing():
            await self._stream.close_sending()
        reader = self._reader
        if reader is not None and not reader.done():
            try:
                await asyncio.wait_for(asyncio.shield(reader), timeout)
            except asyncio.TimeoutError:
                self._call.cancel()
                reader.cancel()
        self._end("client closed")


class _LockRequest(Coroutine[Any, Any, AsyncLock]):
    """What `AsyncClient.lock()` returns: await it for the lock, use it in `async with`
    (released on exit), or hand it to `asyncio.create_task()`, `ensure_future()` or
    `gather()`: it is a coroutine, as aiohttp's request context managers are. Its
    holder is the task that called `lock()` (called outside any task: the task that
    runs it)."""

    def __init__(
        self, client: "AsyncClient", key: str, options: Options, holder: Optional[str]
    ):
        self._coro = self._acquire(client, key, options, holder)
        self._lock: Optional[AsyncLock] = None

    @staticmethod
    async def _acquire(
        client: "AsyncClient", key: str, options: Options, holder: Optional[str]
    ) -> AsyncLock:
        session = client._sess
        if session is None or session.ended is not None or session.pid != os.getpid():
            session = await client._session()
        who = holder if holder is not None else (task_holder() or "")
        return await session.acquire(key, options, who)

    def send(self, value: Any) -> Any:
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        if val is None and tb is None:
            return self._coro.throw(typ)
        return self._coro.throw(typ, val, tb)  # pragma: no cover - the old signature

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, None, AsyncLock]:
        return self._coro.__await__()

    async def __aenter__(self) -> AsyncLock:
        self._lock = await self._coro
        return self._lock

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            await lock.__aexit__(exc_type, exc, tb)


async def _probe(addr: str) -> Optional[str]:
    """Why nothing listens at `addr` (a plain connect fails), or None when something
    does or this cannot tell (see `wait_after_refusal`)."""
    where = dial_address(addr)
    if where is None:
        return None
    kind, address = where
    try:
        if kind == "unix":
            connecting = asyncio.open_unix_connection(address)
        else:
            connecting = asyncio.open_connection(*address)
        _, writer = await asyncio.wait_for(connecting, 1.0)
    except asyncio.TimeoutError:
        return None
    except OSError as e:
        return refusal(e)
    writer.close()
    return None


#: In a forked child, the parent's channels and sessions: kept, never used.
_inherited: List[Any] = []


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
    """The asyncio client (grpc.aio): one session per client, as `lockside.Client`;
    each task is a holder of its own (tasks sharing a client exclude each other, a task
    re-enters the keys it holds).

        async with AsyncClient() as c:
            async with c.lock("orders", wait=5.0) as lock:
                ...  # lock.fencing_token; stop while lock.suspended is set

    The channel is created on first use, on the running loop; use a client from one
    event loop only. A broken stream suspends every lock and the session resumes as
    `lockside.Client`'s does; `resume` and `wait_for_sidecar` as there.
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
        self._pid = os.getpid()
        self._credentials = credentials
        self._options = KEEPALIVE_OPTIONS + list(options)
        self._metadata = call_metadata(client_name, auth_token)
        self._channel: Optional[grpc.aio.Channel] = None
        self._sess: Optional[_AioSession] = None
        self._opening: Optional[asyncio.Lock] = None
        self._closed = False

    def _get_channel(self) -> "grpc.aio.Channel":
        if self._pid != os.getpid():
            self._after_fork()
        if self._channel is None:
            target = channel_target(self.addr)
            if self._credentials is None:
                self._channel = grpc.aio.insecure_channel(target, options=self._options)
            else:
                self._channel = grpc.aio.secure_channel(
                    target, self._credentials, options=self._options
                )
            # Raw bytes both ways: the session encodes and decodes itself.
            self._lease = self._channel.stream_stream(LEASE_METHOD)
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

    def _after_fork(self) -> None:
        """In a forked child: the channel and the session are the parent's, never
        touched here; the child opens its own."""
        sess, channel = self._sess, self._channel
        self._sess = self._channel = None
        self._opening = None
        self._pid = os.getpid()
        if sess is not None:
            sess._inherited()
        _inherited.append((channel, sess))

    async def _open(self) -> _AioSession:
        """A new session: at once when the sidecar is there; else, after a plain
        connect to `addr` says why not, fails at once or waits for it
        (`wait_after_refusal`)."""
        try:
            return await _AioSession.open(self, False, self.connect_timeout)
        except Unavailable as e:
            if e.code is not grpc.StatusCode.UNAVAILABLE:
                raise
        cause = await _probe(self.addr)
        wait = wait_after_refusal(self.addr, cause, self.wait_for_sidecar, self.connect_timeout)
        return await _AioSession.open(self, True, wait)

    async def _session(self) -> _AioSession:
        if self._pid != os.getpid():
            self._after_fork()
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
                self._sess = await self._open()
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
        holder: Optional[str] = None,
    ) -> _LockRequest:
        """Takes `key` for the calling task: `await c.lock(...)` returns the
        `AsyncLock`; `async with c.lock(...) as lock` releases it on exit; it is a
        coroutine too (`asyncio.create_task(c.lock(...))`). Tasks sharing a client
        exclude each other; a task locking a key it holds re-enters it. `holder`: None
        (the default) is the calling task (`task:N:NAME`), "" the session itself.
        Options and errors as `lockside.Client.lock`. Cancelling the awaiting task
        cancels the wait."""
        who = task_holder() if holder is None else holder
        return _LockRequest(self, key, (wait, ttl, shared, limit, fair, value), who)

    def campaign(
        self,
        key: str,
        value: "bytes | str" = b"",
        *,
        wait: Optional[float] = None,
        ttl: Optional[float] = None,
        holder: Optional[str] = None,
    ) -> _LockRequest:
        """Campaigns for leadership of `key` with `value`: `await c.campaign(...)`
        returns once this client leads (an `AsyncLock`: leadership); `async with`
        resigns on exit. See `lockside.Client.campaign`."""
        who = task_holder() if holder is None else holder
        return _LockRequest(self, key, (wait, ttl, False, 0, True, value), who)

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
