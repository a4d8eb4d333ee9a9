"""The asyncio client, on grpc.aio: `AsyncClient`, what its `lock()` returns
(`_LockRequest`) and its `AsyncWatch`. Every decision is `ClientBase`'s (`_client.py`)
and `SessionBase`'s (`_core.py`); the session's I/O and its `AsyncLock`s are in
`_aio_session.py`."""

from __future__ import annotations

import asyncio
import os
from typing import Any, Coroutine, Generator, List, Optional

import grpc
import grpc.aio

from lockside._aio_session import AsyncLock, _AioSession
from lockside._client import ClientBase
from lockside._core import Options
from lockside._describe import Description, WatchBase, call_errors, description
from lockside._errors import Unavailable
from lockside._holders import task_holder
from lockside._pb import lockside_pb2 as pb
from lockside._sidecar import dial_address, refusal


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


async def _probe(kind: str, address: Any) -> Optional[str]:
    """`_sync_channel._probe` on the event loop."""
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


class AsyncWatch(WatchBase):
    """The states of a watched key, from `AsyncClient.watch`: `async for state in
    watch`; see `lockside.Watch`. `cancel()`, or leaving an `async with` block, ends
    it."""

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
            raise (self._failed(e) or StopAsyncIteration()) from None
        if resp is grpc.aio.EOF:
            raise StopAsyncIteration
        return description(resp.state)

    async def __aenter__(self) -> "AsyncWatch":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.cancel()


class AsyncClient(ClientBase[_LockRequest]):
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

    _sess: Optional[_AioSession]

    def _setup(self) -> None:
        self._pid = os.getpid()
        # The channel, made on first use, on the running loop.
        self._channel: Optional[grpc.aio.Channel] = None
        self._opening: Optional[asyncio.Lock] = None

    def _get_channel(self) -> "grpc.aio.Channel":
        if self._pid != os.getpid():
            self._after_fork()
        if self._channel is None:
            self._channel, self._lease, self._describe, self._watch = self._make_channel(
                grpc.aio
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
            self._refused(e)
        where = dial_address(self.addr)
        cause = None if where is None else await _probe(*where)
        return await _AioSession.open(self, True, self._sidecar_wait(cause))

    async def _session(self) -> _AioSession:
        if self._pid != os.getpid():
            self._after_fork()
        sess = self._sess
        if sess is not None and sess.ended is None:
            return sess
        self._check_open()
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            self._check_open()
            if self._sess is None or self._sess.ended is not None:
                self._sess = None
                self._sess = await self._open()
            return self._sess

    def _take(self, key: str, options: Options, holder: Optional[str]) -> _LockRequest:
        return _LockRequest(self, key, options, task_holder() if holder is None else holder)

    def watch(self, key: str) -> AsyncWatch:
        """Follows `key`: `async for state in c.watch(key)`, its state now first; see
        `lockside.Client.watch`."""
        self._check_open()
        self._get_channel()
        return AsyncWatch(self._watch(pb.WatchRequest(key=key), metadata=self._metadata), key)

    async def describe(self, key: str, timeout: float = 5.0) -> Description:
        """The store's view of `key`: holders, waiters, fair queue, last fencing token."""
        self._check_open()
        self._get_channel()
        request = pb.DescribeRequest(key=key)
        with call_errors(key):
            resp = await self._describe(request, **self._describe_options(timeout))
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
