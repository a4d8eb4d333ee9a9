"""How the clients behave around their own life: dropped without close(), closed with
many locks, a lock released after close(), `AsyncClient.lock()` handed to
`asyncio.create_task()`."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import warnings

import pytest

from lockside import AsyncClient, Client


def take(addr: str, key: str) -> None:
    c = Client(addr)
    c.lock(key, wait=0)  # the lock object is dropped too: only the client held it


def test_a_client_dropped_without_close_releases_its_lock_and_warns(stack, key):
    take(stack.addr, key)
    with Client(stack.addr) as other:
        assert other.describe(key).holders, "held while the client lives"
        with pytest.warns(ResourceWarning, match="without close"):
            gc.collect()
        started = time.monotonic()
        with other.lock(key, wait=5.0):
            assert time.monotonic() - started < 2.0


def test_a_lock_in_hand_keeps_its_client_alive(stack, key):
    lock = Client(stack.addr).lock(key, wait=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        gc.collect()
    assert lock.held and not lock.lost.is_set()
    with Client(stack.addr) as other:
        assert other.describe(key).holders[0].session_id == lock.session_id
    lock.release()
    lock._client.close()


def test_close_with_many_locks_logs_one_line_and_releases_them(stack, key, caplog):
    c = Client(stack.addr)
    locks = [c.lock(f"{key}-{i}", wait=0) for i in range(300)]
    caplog.clear()
    caplog.set_level(logging.DEBUG, logger="lockside")
    c.close()
    lines = [r for r in caplog.records if r.name == "lockside"]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert "300" in lines[0].getMessage()
    assert all(lock.lost.is_set() and not lock.held for lock in locks)
    with Client(stack.addr) as other:
        assert other.describe(f"{key}-299").holders == ()


def test_release_after_close_does_nothing(stack, key):
    c = Client(stack.addr)
    lock = c.lock(key, wait=0)
    c.close()
    lock.release()  # let go on purpose: no LockLost
    assert lock.lost_reason == "client closed"
    with Client(stack.addr) as c2:
        with c2.lock(f"{key}-2", wait=0):
            c2.close()  # leaving the block after close() raises nothing


def test_async_close_logs_one_line_and_release_after_it_does_nothing(stack, key, caplog):
    async def main() -> None:
        c = AsyncClient(stack.addr)
        locks = await asyncio.gather(*(c.lock(f"{key}-{i}", wait=0) for i in range(100)))
        caplog.clear()
        caplog.set_level(logging.DEBUG, logger="lockside")
        await c.close()
        lines = [r for r in caplog.records if r.name == "lockside"]
        assert len(lines) == 1, [r.getMessage() for r in lines]
        for lock in locks:
            await lock.release()
            assert lock.lost.is_set()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_create_task_accepts_what_lock_returns(stack, key):
    async def main() -> None:
        async with AsyncClient(stack.addr) as c, AsyncClient(stack.addr) as other:
            task = asyncio.create_task(c.lock(key, wait=30))
            lock = await task
            assert lock.held and (await other.describe(key)).holders
            waiting = asyncio.create_task(other.lock(key, wait=30))
            while (await other.describe(key)).waiters != 1:
                await asyncio.sleep(0.01)
            await lock.release()
            second = await asyncio.wait_for(waiting, 10)
            assert second.fencing_token > lock.fencing_token
            await second.release()
            # A request never started is closed like any coroutine.
            request = c.lock(key, wait=0)
            request.close()

    asyncio.run(asyncio.wait_for(main(), 30))
