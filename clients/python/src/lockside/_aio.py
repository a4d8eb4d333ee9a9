"""The asyncio client: `AsyncClient`, its `AsyncLock`s, what its `lock()` returns
(`_LockRequest`) and its `AsyncWatch`. A request runs in the core; its answer comes
back through the client's `Completions`, a socket the event loop watches
(`_Answers`): no thread per call, and the core's I/O thread never waits for the GIL."""

from __future__ import annotations

import asyncio
import itertools
import socket
from typing import Any, Callable, Coroutine, Dict, Generator, Optional, Sequence

from lockside import _native
from lockside._client import Asked, AskedAll, ClientBase, asked_all, value_bytes
from lockside._describe import Description, description
from lockside._errors import LocksideError, from_failure
from lockside._holders import task_holder
from lockside._lock import LockBase
from lockside._locks import AsyncLocks


class _Answers:
    """The answers a client's tasks await, on the event loop they run on."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.completions = _native.Completions()
        self.sock = socket.socket(fileno=self.completions.take_fd())
        self.sock.setblocking(False)
        self.waiting: Dict[int, "asyncio.Future[Any]"] = {}
        self.tokens = itertools.count(1)
        loop.add_reader(self.sock.fileno(), self._drain)

    def _drain(self) -> None:
        try:
            self.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            pass
        for token, ok, value in self.completions.take():
            future = self.waiting.pop(token, None)
            if future is None or future.done():
                if ok and isinstance(value, _native.NativeLock):
                    value.release()  # nobody awaits this grant any more
                elif ok and isinstance(value, list):
                    for lock in value:  # nor these (`lock_all`)
                        lock.release()
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(_native.Failure(*value))

    async def run(self, start: Callable[[Any, int], Any]) -> Any:
        """Starts a request (`start(completions, token)`) and awaits its answer; a
        cancelled caller cancels it in the core."""
        token = next(self.tokens)
        future = self.loop.create_future()
        self.waiting[token] = future
        task = start(self.completions, token)
        try:
            return await future
        except asyncio.CancelledError:
            self.waiting.pop(token, None)
            task.cancel()
            raise

    def close(self) -> None:
        try:
            self.loop.remove_reader(self.sock.fileno())
        except (RuntimeError, ValueError):
            pass  # the loop is closed already
        self.sock.close()


class AsyncLock(LockBase):
    """A held lock (from `AsyncClient.lock`); an async context manager that releases
    on exit. `suspended` and `lost` are `asyncio.Event`s with the meaning they have on
    `lockside.Lock`; `await lock.restored_wait()` waits while it is suspended, `await
    lock.lost_wait()` until it is lost."""

    lost: asyncio.Event
    suspended: asyncio.Event
    _new_flag = asyncio.Event

    def __init__(self, native: Any, client: "AsyncClient"):
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        super().__init__(native, client)

    def _apply(self, state: str, reason: str) -> None:
        # From the events thread: applied on the lock's loop.
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._apply_here(state, reason)
        elif not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._apply_here, state, reason)

    def _apply_here(self, state: str, reason: str) -> None:
        LockBase._apply(self, state, reason)
        self._woken()

    def _woken(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def restored_wait(self) -> bool:
        """Waits while the lock is suspended: True once it may be used (at once when it
        is not suspended), False when it is lost or released. The outcome comes at the
        latest when the lock's TTL has passed since the break."""
        while self._suspended and self._state == "held":
            await self._changed.wait()
        return self._usable()

    async def lost_wait(self) -> str:
        """Returns (with the reason) once the lock is lost. Never returns after a clean
        release: race it against your work."""
        await self.lost.wait()
        return self.lost_reason or "lost"

    async def proclaim(self, value: "bytes | str") -> None:
        """Replaces the lock's value; see `lockside.Lock.proclaim`."""
        data = value_bytes(value)
        if self._state == "lost":
            raise self._lost_error()
        if self._state == "released":
            raise LocksideError(f"lock {self.key!r} was released")
        client: AsyncClient = self._client
        try:
            await client._answers().run(lambda c, t: self._native.proclaim_async(c, t, data))
        except _native.Failure as f:
            if f.args[0] == "lost":
                raise self._lost_error() from None
            raise from_failure(f, self.key) from None

    async def release(self) -> None:
        """Gives the lock back; see `lockside.Lock.release` (it returns once the
        `Release` is on the stream)."""
        self._release()

    async def __aenter__(self) -> "AsyncLock":
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            await self.release()
        except LocksideError as e:
            if exc_type is None:
                raise
            self._left_on(exc_type, e)


class _LockRequest(Coroutine[Any, Any, AsyncLock]):
    """What `AsyncClient.lock()` returns: await it for the lock, use it in `async with`
    (released on exit), or hand it to `asyncio.create_task()` or `gather()`: it is a
    coroutine. Its holder is the task that called `lock()` (called outside any task:
    the task that runs it)."""

    def __init__(self, client: "AsyncClient", options: Asked, holder: Optional[str]):
        self._coro = client._acquire(options, holder)
        self._lock: Optional[AsyncLock] = None

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


class _LocksRequest(Coroutine[Any, Any, AsyncLocks]):
    """What `AsyncClient.lock_all()` returns: await it for the `AsyncLocks`, or use it
    in `async with` (every lock released on exit); a coroutine, as `_LockRequest`."""

    def __init__(self, client: "AsyncClient", options: AskedAll, holder: Optional[str]):
        self._coro = client._acquire_all(options, holder)
        self._locks: Optional[AsyncLocks] = None

    def send(self, value: Any) -> Any:
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        if val is None and tb is None:
            return self._coro.throw(typ)
        return self._coro.throw(typ, val, tb)  # pragma: no cover - the old signature

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, None, AsyncLocks]:
        return self._coro.__await__()

    async def __aenter__(self) -> AsyncLocks:
        self._locks = await self._coro
        return self._locks

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        locks, self._locks = self._locks, None
        if locks is not None:
            await locks.__aexit__(exc_type, exc, tb)


class AsyncWatch:
    """The states of a watched key, from `AsyncClient.watch`: `async for state in
    watch`; see `lockside.Watch`. `cancel()`, or leaving an `async with` block, ends
    it."""

    def __init__(self, client: "AsyncClient", native: Any, key: str):
        self._client = client
        self._native = native
        self._key = key
        self._cancelled = False

    def cancel(self) -> None:
        """Ends the watch."""
        self._cancelled = True
        self._native.cancel()

    def __aiter__(self) -> "AsyncWatch":
        return self

    async def __anext__(self) -> Description:
        if self._cancelled:
            raise StopAsyncIteration
        try:
            row = await self._client._answers().run(self._native.next_async)
        except _native.Failure as f:
            if self._cancelled:
                raise StopAsyncIteration from None
            raise from_failure(f, self._key) from None
        if row is None:
            raise StopAsyncIteration
        return description(row)

    async def __aenter__(self) -> "AsyncWatch":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.cancel()


class AsyncClient(ClientBase[_LockRequest]):
    """The asyncio client: one session per client, as `lockside.Client`; each task is
    a holder of its own (tasks sharing a client exclude each other, a task re-enters
    the keys it holds).

        async with AsyncClient() as c:
            async with c.lock("orders", wait=5.0) as lock:
                ...  # lock.fencing_token; stop while lock.suspended is set

    Use a client from one event loop only. A broken stream suspends every lock and the
    session resumes as `lockside.Client`'s does; `resume` and `wait_for_sidecar` as
    there.
    """

    _answers_on: Optional[_Answers] = None

    def _answers(self) -> _Answers:
        answers = self._answers_on
        if answers is None:
            answers = self._answers_on = _Answers(asyncio.get_running_loop())
        return answers

    def _take(self, key: str, options: Asked, holder: Optional[str]) -> _LockRequest:
        return _LockRequest(self, options, task_holder() if holder is None else holder)

    async def _acquire(self, options: Asked, holder: Optional[str]) -> AsyncLock:
        self._check_open()
        who = holder if holder is not None else (task_holder() or "")
        core = self._native()
        try:
            native = await self._answers().run(
                lambda c, t: core.acquire_async(c, t, *options, who)
            )
        except _native.Failure as f:
            raise from_failure(f, options[0]) from None
        lock = AsyncLock(native, self)
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
    ) -> _LocksRequest:
        """Takes every key of `keys` for the calling task at once, all or none: `await
        c.lock_all(keys)` returns the `AsyncLocks`, `async with c.lock_all(keys) as
        locks` releases them all on exit; cancelling the awaiting task cancels the
        wait. See `lockside.Client.lock_all`."""
        options = asked_all(keys, wait, ttl, shared, fair)
        return _LocksRequest(self, options, task_holder() if holder is None else holder)

    async def _acquire_all(self, options: AskedAll, holder: Optional[str]) -> AsyncLocks:
        self._check_open()
        who = holder if holder is not None else (task_holder() or "")
        keys, wait, ttl, shared, fair = options
        core = self._native()
        try:
            natives = await self._answers().run(
                lambda c, t: _native.acquire_all_async(core, c, t, keys, wait, ttl, shared, fair, who)
            )
        except _native.Failure as f:
            raise from_failure(f, ", ".join(keys)) from None
        locks = [AsyncLock(native, self) for native in natives]
        self._locks.update(locks)
        return AsyncLocks(locks)

    def watch(self, key: str) -> AsyncWatch:
        """Follows `key`: `async for state in c.watch(key)`, its state now first; see
        `lockside.Client.watch`."""
        self._check_open()
        return AsyncWatch(self, self._native().watch(key), key)

    async def describe(self, key: str, timeout: float = 5.0) -> Description:
        """The store's view of `key`: holders, waiters, fair queue, last fencing token."""
        self._check_open()
        core = self._native()
        try:
            row = await self._answers().run(
                lambda c, t: core.describe_async(c, t, key, float(timeout))
            )
        except _native.Failure as f:
            raise from_failure(f, key) from None
        return description(row)

    async def close(self) -> None:
        """Ends the session (the sidecar releases every lock it holds; their `lost` is
        set). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._let_go()
        core = self._native()
        await self._answers().run(core.close_async)
        answers, self._answers_on = self._answers_on, None
        if answers is not None:
            answers.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
