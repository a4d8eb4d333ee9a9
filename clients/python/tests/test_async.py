"""`AsyncClient` against a real sidecar on a real Redis. Each test runs its own event
loop (`asyncio.run`), so no pytest plugin is needed."""

from __future__ import annotations

import asyncio

import pytest

from lockside import AsyncClient, Client, LockLost, NotAcquired, Rejected, Unavailable


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_a_burst_of_requests_goes_out_in_the_order_made(stack, key):
    # 100 requests at once queue behind the send in flight; the sidecar answers a
    # session's requests for one key in the order they came, so the reentrant grants
    # count 1..100 in the order the requests were made only if they went out so.
    async def main():
        async with AsyncClient(stack.addr) as c:
            locks = await asyncio.gather(*(c.lock(key, wait=0) for _ in range(100)))
            assert [lock.hold_count for lock in locks] == list(range(1, 101))
            await asyncio.gather(*(lock.release() for lock in reversed(locks)))
            assert (await c.describe(key)).holders == ()

    run(main())


def test_grant_busy_and_release_on_exit(stack, key):
    async def main():
        async with AsyncClient(stack.addr) as c, AsyncClient(stack.addr) as other:
            async with c.lock(key, wait=0, ttl=5.0) as lock:
                assert lock.fencing_token > 0 and 0 < lock.ttl <= 5.0
                with pytest.raises(NotAcquired) as busy:
                    await other.lock(key, wait=0)
                assert busy.value.reason == "BUSY"
                d = await other.describe(key)
                assert d.holders[0].session_id == c.session_id
            assert not lock.held
            later = await other.lock(key, wait=0)
            assert later.fencing_token > lock.fencing_token
            await later.release()

    run(main())


def test_reentrancy_and_release_on_an_exception(stack, key):
    async def main():
        async with AsyncClient(stack.addr) as c:
            outer = await c.lock(key, wait=0)
            with pytest.raises(KeyError):
                async with c.lock(key, wait=0) as inner:
                    assert inner.hold_count == 2 and inner.fencing_token == outer.fencing_token
                    raise KeyError("boom")
            assert (await c.describe(key)).holders[0].hold_count == 1
            await outer.release()
            assert (await c.describe(key)).holders == ()

    run(main())


def test_many_locks_at_once_on_one_session(stack, key):
    async def main():
        async with AsyncClient(stack.addr) as c:
            keys = [f"{key}-{i}" for i in range(50)]
            locks = await asyncio.gather(*(c.lock(k, wait=0) for k in keys))
            assert [lock.key for lock in locks] == keys
            assert {lock.session_id for lock in locks} == {c.session_id}
            await asyncio.gather(*(lock.release() for lock in locks))
            for k in keys:
                assert (await c.describe(k)).holders == ()

    run(main())


def test_a_waiter_is_granted_on_release_and_a_cancelled_wait_leaves_nothing(stack, key):
    async def main():
        async with AsyncClient(stack.addr) as holder, AsyncClient(stack.addr) as waiter:
            first = await holder.lock(key, wait=0)
            waiting = asyncio.ensure_future(waiter.lock(key, wait=10.0))
            while (await holder.describe(key)).waiters != 1:
                await asyncio.sleep(0.01)
            await first.release()
            second = await waiting
            assert second.fencing_token > first.fencing_token
            # A wait cancelled by its task is cancelled on the sidecar too.
            late = asyncio.ensure_future(holder.lock(key, wait=10.0))
            while (await holder.describe(key)).waiters != 1:
                await asyncio.sleep(0.01)
            late.cancel()
            with pytest.raises(asyncio.CancelledError):
                await late
            while (await holder.describe(key)).waiters != 0:
                await asyncio.sleep(0.01)
            await second.release()
            assert (await holder.describe(key)).holders == ()
            # The holder's session is fine: it can take the key now.
            async with holder.lock(key, wait=0):
                pass

    run(main())


def test_bad_input_is_a_clear_error(stack, key):
    async def main():
        async with AsyncClient(stack.addr) as c:
            async with c.lock(key, wait=0) as held:
                with pytest.raises(Rejected) as empty:
                    await c.lock("", wait=0)
                assert empty.value.code == 3 and "empty" in empty.value.message
                with pytest.raises(Rejected) as ttl:
                    await c.lock(f"{key}-2", ttl=7200.0, wait=0)
                assert ttl.value.code == 3
                with pytest.raises(ValueError):
                    await c.lock(key, wait=float("inf"))
                with pytest.raises(TypeError):
                    await c.lock(key, limit=1.5)  # type: ignore[arg-type]
                assert held.held

    run(main())


def test_lost_wait_returns_when_redis_dies(own_stack, key):
    async def main():
        async with AsyncClient(own_stack.addr) as c:
            with pytest.raises(LockLost):
                async with c.lock(key, wait=0, ttl=1.0) as lock:
                    own_stack.redis.stop()
                    reason = await asyncio.wait_for(lock.lost_wait(), 5.0)
                    assert reason and lock.lost.is_set()

    run(main())


def test_a_broken_stream_loses_the_locks(own_stack, key):
    # Without resuming (test_resume.py resumes).
    async def main():
        async with AsyncClient(own_stack.addr, connect_timeout=0.5, resume=False) as c:
            locks = [await c.lock(f"{key}-{i}", wait=0) for i in range(3)]
            own_stack.sidecar.kill()
            for lock in locks:
                await asyncio.wait_for(lock.lost_wait(), 5.0)
            with pytest.raises(Unavailable):
                await c.lock(f"{key}-x", wait=0)

    run(main())


def test_sync_and_async_clients_exclude_each_other(stack, key):
    async def main():
        with Client(stack.addr) as sync:
            async with AsyncClient(stack.addr) as c:
                async with c.lock(key, wait=0):
                    with pytest.raises(NotAcquired):
                        sync.lock(key, wait=0)

    run(main())


def test_async_campaign_proclaim_and_watch(election_addr, key):
    async def main():
        async with AsyncClient(election_addr) as c, AsyncClient(election_addr) as follower:
            async with follower.watch(key) as states:
                assert (await states.__anext__()).leader is None
                async with c.campaign(key, "a:1") as lead:
                    state = await states.__anext__()
                    assert (state.leader.value, state.leader.fencing_token) == (
                        b"a:1",
                        lead.fencing_token,
                    )
                    await lead.proclaim("a:2")
                    assert (await states.__anext__()).leader.value == b"a:2"
                state = await states.__anext__()
                assert state.leader is None
            with pytest.raises(Rejected) as bad:
                async for _ in follower.watch(""):
                    pass
            assert bad.value.code == 3

    run(main())
