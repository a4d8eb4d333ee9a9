"""`lock_all` (several keys at once, issue 36) on both clients against a real sidecar on
a real Redis: every key held with its own fencing token and released together, all or
none, no deadlock for callers asking in opposite orders, a thread's own key re-entered,
a cancelled wait leaving nothing held, bad keys refused, and every key back after a
sidecar restart."""

from __future__ import annotations

import asyncio
import threading

import pytest

from lockside import AsyncClient, AsyncLocks, Client, Locks, NotAcquired, Rejected
from servers import wait_until


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def free(c: Client, key: str) -> bool:
    return c.describe(key).holders == ()


def test_every_key_is_held_with_its_own_token_and_released_on_exit(stack, key):
    keys = [f"{key}-c", f"{key}-a", f"{key}-b"]
    with Client(stack.addr) as c, Client(stack.addr) as other:
        with c.lock_all(keys, wait=0, ttl=5.0) as locks:
            assert isinstance(locks, Locks)
            assert locks.keys == keys and len(locks) == 3 and keys[1] in locks
            for k in keys:
                assert locks[k].key == k and locks[k].held
                assert locks.fencing_tokens[k] == locks[k].fencing_token
                assert other.describe(k).holders[0].fencing_token == locks[k].fencing_token
            assert locks[0] is locks[keys[0]] and [l.key for l in locks] == keys
            assert locks.held and locks.usable()
            with pytest.raises(KeyError):
                locks["nope"]
            # All or none: the rival's other key stays free.
            with pytest.raises(NotAcquired) as busy:
                other.lock_all([f"{key}-d", keys[2]], wait=0)
            assert busy.value.reason == "BUSY"
            assert free(other, f"{key}-d")
        assert not locks.held
        for k in keys:
            assert free(other, k)
        with other.lock_all(keys, wait=0) as later:
            for k in keys:
                assert later.fencing_tokens[k] > locks.fencing_tokens[k]


def test_two_threads_asking_in_opposite_orders_both_finish(stack, key):
    x, y = f"{key}-x", f"{key}-y"
    seen = []
    failures = []

    def diner(order):
        try:
            with Client(stack.addr) as c:
                for _ in range(20):
                    with c.lock_all(order, wait=10.0) as locks:
                        seen.append((locks.fencing_tokens[x], locks.fencing_tokens[y]))
        except Exception as e:  # noqa: BLE001 - reported below
            failures.append(e)

    threads = [threading.Thread(target=diner, args=(o,)) for o in ([x, y], [y, x])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a deadlock"
    assert not failures, failures
    seen.sort()
    assert len(seen) == 40
    for a, b in zip(seen, seen[1:]):
        assert a[0] < b[0] and a[1] < b[1], seen


def test_a_key_the_thread_holds_is_reentered(stack, key):
    a, b = f"{key}-a", f"{key}-b"
    with Client(stack.addr) as c:
        outer = c.lock(b, wait=0)
        with c.lock_all([a, b], wait=0) as locks:
            assert locks[b].hold_count == 2 and locks[b].fencing_token == outer.fencing_token
            assert locks[a].hold_count == 1
        assert c.describe(b).holders[0].hold_count == 1 and free(c, a)
        outer.release()


def test_bad_keys_are_refused(stack, key):
    with Client(stack.addr) as c:
        with pytest.raises(Rejected) as one:
            c.lock_all([key], wait=0)
        assert one.value.code == 3 and "2 to 64" in one.value.message
        with pytest.raises(Rejected) as twice:
            c.lock_all([key, key], wait=0)
        assert "twice" in twice.value.message
        with pytest.raises(TypeError):
            c.lock_all(key)  # a str is one key, not keys
        with pytest.raises(TypeError):
            c.lock_all([key, 7])
        # The session is fine afterwards.
        c.lock_all([f"{key}-1", f"{key}-2"], wait=0).release()


def test_async_lock_all_holds_every_key_and_releases_on_exit(stack, key):
    keys = [f"{key}-1", f"{key}-2"]

    async def main():
        async with AsyncClient(stack.addr) as c, AsyncClient(stack.addr) as other:
            async with c.lock_all(keys, wait=0) as locks:
                assert isinstance(locks, AsyncLocks) and locks.keys == keys
                for k in keys:
                    d = await other.describe(k)
                    assert d.holders[0].fencing_token == locks.fencing_tokens[k]
                with pytest.raises(NotAcquired):
                    await other.lock_all(list(reversed(keys)), wait=0)
            for k in keys:
                assert (await other.describe(k)).holders == ()
            again = await other.lock_all(keys, wait=0)
            assert again[keys[0]].fencing_token > locks[keys[0]].fencing_token
            await again.release()

    run(main())


def test_async_cancelled_wait_leaves_nothing_held(stack, key):
    a, b = f"{key}-a", f"{key}-b"

    async def main():
        async with AsyncClient(stack.addr) as c, AsyncClient(stack.addr) as owner:
            held = await owner.lock(b)
            waiting = asyncio.ensure_future(c.lock_all([a, b]))
            while (await owner.describe(b)).waiters == 0:
                await asyncio.sleep(0.01)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            await held.release()
            async with AsyncClient(stack.addr) as third:
                async with third.lock_all([a, b], wait=5.0) as locks:
                    for k in (a, b):
                        d = await c.describe(k)
                        assert [h.fencing_token for h in d.holders] == [locks.fencing_tokens[k]]

    run(main())


def test_every_key_comes_back_after_a_sidecar_restart(restartable, key):
    keys = [f"{key}-1", f"{key}-2", f"{key}-3"]
    with Client(restartable.addr) as c:
        locks = c.lock_all(keys, wait=0, ttl=30.0)
        assert wait_until(lambda: restartable.redis.recorded(c.session_id, 3))
        restartable.restart_sidecar()
        for lock in locks:
            assert lock.wait_restored(10.0), lock.lost_reason
        for k in keys:
            assert c.describe(k).holders[0].fencing_token == locks.fencing_tokens[k]
        locks.release()
        for k in keys:
            assert free(c, k)
