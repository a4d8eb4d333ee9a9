"""One session of the asyncio client, on grpc.aio, and its `AsyncLock`s:
`_AioSession` keeps the I/O (the stream is written and read on the event loop with no
thread of its own, `_AioStream`; a reader task waits for its end and resumes it; an
answer watchdog; callers awaiting their answers). `SessionBase` makes every
decision."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Callable, List, Optional

import grpc
import grpc.aio

from lockside._aio_stream import _AioStream
from lockside._core import ENDED, OPEN, RESUMING, Options, Pending, SessionBase
from lockside._errors import LocksideError, Unavailable, rpc_error_text
from lockside._greeting import Greeting
from lockside._lock import LockBase
from lockside._pb import lockside_pb2 as pb
from lockside._resume import FIRST_RESUME_BACKOFF, Cancellable, next_backoff
from lockside._wire import value_bytes

if TYPE_CHECKING:
    from lockside._aio import AsyncClient


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
    lost: asyncio.Event
    suspended: asyncio.Event
    _new_flag = asyncio.Event

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
        try:
            await self.release()
        except LocksideError as e:
            if exc_type is None:
                raise
            self._left_on(exc_type, e)


class _AioPending(Pending):
    __slots__ = ("future", "deadline")

    def __init__(self, loop: asyncio.AbstractEventLoop, *request: Any):
        super().__init__(*request)
        self.future: "asyncio.Future[None]" = loop.create_future()
        self.deadline = 0.0  # loop.time() after which the answer is given up on

    def _notify(self) -> None:
        if not self.future.done():
            self.future.set_result(None)


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
