"""One blocking face for the two clients of this package, so a scenario is written
once and run on each: the sync `Client`, and the `AsyncClient` (driven from the test's
thread on an event loop of its own).

The face runs each call of the async client in a task of its own; its holder is the
calling thread's (`holder=thread_holder()`), so a scenario reads the same on every kind:
the blocking caller is the holder, as with the sync `Client`."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable, Coroutine

from lockside import AsyncClient, Client
from lockside._holders import thread_holder

KINDS = ("sync", "async")


class _Loop:
    """An event loop on a thread of its own; `run` waits for a coroutine on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 60.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


class _Flag:
    """`lock.lost` or `lock.suspended` of an `AsyncLock`, read from another thread."""

    def __init__(self, event: asyncio.Event):
        self._event = event

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self._event.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        return self._event.is_set()


class _AsyncLockFace:
    def __init__(self, loop: _Loop, lock: Any):
        self._loop = loop
        self._lock = lock
        self.lost = _Flag(lock.lost)
        self.suspended = _Flag(lock.suspended)

    def __getattr__(self, name: str) -> Any:  # key, fencing_token, hold_count, ...
        return getattr(self._lock, name)

    def release(self) -> None:
        self._loop.run(self._lock.release())

    def wait_restored(self, timeout: float) -> bool:
        async def restored() -> bool:
            try:
                return await asyncio.wait_for(self._lock.restored_wait(), timeout)
            except asyncio.TimeoutError:
                return False

        return self._loop.run(restored())

    def proclaim(self, value: Any) -> None:
        self._loop.run(self._lock.proclaim(value))


class _AsyncClientFace:
    def __init__(self, addr: str, **options: Any):
        self._loop = _Loop()
        self._client: AsyncClient = AsyncClient(addr, **options)

    @property
    def session_id(self) -> Any:
        return self._client.session_id

    def lock(self, key: str, **options: Any) -> _AsyncLockFace:
        options.setdefault("holder", thread_holder())
        return _AsyncLockFace(self._loop, self._loop.run(self._lock(key, options)))

    async def _lock(self, key: str, options: dict) -> Any:
        return await self._client.lock(key, **options)

    def campaign(self, key: str, value: Any = b"", **options: Any) -> _AsyncLockFace:
        options.setdefault("holder", thread_holder())

        async def campaign() -> Any:
            return await self._client.campaign(key, value, **options)

        return _AsyncLockFace(self._loop, self._loop.run(campaign()))

    def describe(self, key: str) -> Any:
        return self._loop.run(self._client.describe(key))

    def close(self) -> None:
        self._loop.run(self._client.close())
        self._loop.stop()

    def __enter__(self) -> "_AsyncClientFace":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def client_factory(kind: str, monkeypatch: Any) -> Callable[..., Any]:
    """What makes a client of `kind` (`KINDS`): `factory(addr, **options)`."""
    if kind == "async":
        return _AsyncClientFace
    return Client


def in_thread(fn: Callable[[], Any]) -> Callable[..., Any]:
    """Runs `fn` on a thread; returns `outcome(timeout)`, which waits for it and returns
    what it returned or the exception it raised."""
    box: list = []

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()

    def outcome(timeout: float = 30.0) -> Any:
        t.join(timeout)
        assert box, f"still running after {timeout}s"
        return box[0]

    return outcome
