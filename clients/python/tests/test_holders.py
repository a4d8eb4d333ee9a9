"""Holders inside a session (DESIGN.md): one client shared by a thread pool or by
concurrent tasks excludes the way a client each would, and nesting on one thread or
task re-enters. These fail on a sidecar that ignores `Acquire.holder` (every thread of
a client then "holds" an exclusive lock at once), which is how they were seen to fail."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from kinds import in_thread
from servers import wait_until
from lockside import AsyncClient, Client, NotAcquired

THREADS = 4
ROUNDS = 5


class Inside:
    """Counts who is inside a critical section at once (lock-protected)."""

    def __init__(self) -> None:
        self.mu = threading.Condition()
        self.now = 0
        self.most = 0
        self.entries = 0

    def enter(self) -> None:
        with self.mu:
            self.now += 1
            self.entries += 1
            self.most = max(self.most, self.now)
            self.mu.notify_all()

    def leave(self) -> None:
        with self.mu:
            self.now -= 1


def run_threads(target, n: int = THREADS) -> None:
    errors: list = []

    def guarded() -> None:
        try:
            target()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            errors.append(e)

    threads = [threading.Thread(target=guarded) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "threads still running after 60 s"
    assert not errors, errors


def test_threads_sharing_a_client_are_inside_one_at_a_time(stack, key):
    inside = Inside()
    start = threading.Barrier(THREADS)
    with Client(stack.addr) as c:

        def work() -> None:
            start.wait(10)
            for _ in range(ROUNDS):
                with c.lock(key, wait=5):
                    inside.enter()
                    time.sleep(0.005)  # the work: room for an overlap to show
                    inside.leave()

        run_threads(work)
        assert inside.entries == THREADS * ROUNDS
        assert inside.most == 1, f"{inside.most} threads held {key!r} at once"
        assert c.describe(key).holders == ()


def test_tasks_sharing_an_async_client_are_inside_one_at_a_time(stack, key):
    inside = Inside()

    async def main() -> None:
        async with AsyncClient(stack.addr) as c:

            async def work() -> None:
                for _ in range(ROUNDS):
                    async with c.lock(key, wait=5):
                        inside.enter()
                        await asyncio.sleep(0.005)  # the work: other tasks run meanwhile
                        inside.leave()

            await asyncio.gather(*(work() for _ in range(THREADS)))
            assert (await c.describe(key)).holders == ()

    asyncio.run(asyncio.wait_for(main(), 60))
    assert inside.entries == THREADS * ROUNDS
    assert inside.most == 1, f"{inside.most} tasks held the lock at once"


def test_a_semaphore_of_two_shared_by_four_threads_admits_two_never_three(stack, key):
    inside = Inside()
    start = threading.Barrier(THREADS)
    reached_two = threading.Event()
    with Client(stack.addr) as c:

        def work() -> None:
            start.wait(10)
            for _ in range(ROUNDS):
                with c.lock(key, limit=2, wait=10):
                    inside.enter()
                    with inside.mu:
                        # Stay until a second permit holder is in (once), so the test
                        # sees two at once rather than hoping for it.
                        if inside.mu.wait_for(lambda: inside.now >= 2, timeout=5):
                            reached_two.set()
                    time.sleep(0.005)
                    inside.leave()

        run_threads(work)
        assert reached_two.is_set(), "two threads never held a permit at once"
        assert inside.most == 2, f"{inside.most} threads held a permit of 2 at once"
        assert c.describe(key).holders == ()


def test_shared_holders_of_one_client_coexist_and_exclude_a_writer(stack, key):
    with Client(stack.addr) as c:
        mine = c.lock(key, shared=True, wait=0)
        theirs = in_thread(lambda: c.lock(key, shared=True, wait=0))(10)
        assert not isinstance(theirs, BaseException), theirs
        holders = c.describe(key).holders
        assert {h.session_id for h in holders} == {c.session_id}
        assert sorted(h.holder for h in holders) == sorted([mine.holder, theirs.holder])
        assert mine.holder != theirs.holder
        writer = in_thread(lambda: c.lock(key, wait=0))(10)
        assert isinstance(writer, NotAcquired) and writer.reason == "BUSY", writer
        theirs.release()  # from another thread than the one that locked: allowed
        mine.release()
        assert c.describe(key).holders == ()


def test_nesting_on_one_thread_reenters_and_excludes_the_others(stack, key):
    with Client(stack.addr) as c:
        with c.lock(key, wait=0) as outer:
            assert outer.holder.startswith("thread:")
            with c.lock(key, wait=0) as inner:
                assert inner.hold_count == 2 and inner.fencing_token == outer.fencing_token
                [holder] = c.describe(key).holders
                assert (holder.session_id, holder.holder, holder.hold_count) == (
                    c.session_id,
                    outer.holder,
                    2,
                )
                busy = in_thread(lambda: c.lock(key, wait=0))(10)
                assert isinstance(busy, NotAcquired) and busy.reason == "BUSY", busy
            assert c.describe(key).holders[0].hold_count == 1
        assert c.describe(key).holders == ()


def test_nesting_in_one_task_reenters_and_excludes_other_tasks(stack, key):
    async def main() -> None:
        async with AsyncClient(stack.addr) as c:
            async with c.lock(key, wait=0) as outer:
                assert outer.holder.startswith("task:")
                async with c.lock(key, wait=0) as inner:
                    assert inner.hold_count == 2
                    [holder] = (await c.describe(key)).holders
                    assert (holder.holder, holder.hold_count) == (outer.holder, 2)

                    async def other_task() -> None:
                        await c.lock(key, wait=0)

                    with pytest.raises(NotAcquired) as busy:
                        await asyncio.create_task(other_task())
                    assert busy.value.reason == "BUSY"
            assert (await c.describe(key)).holders == ()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_waiting_thread_is_granted_when_its_sibling_releases(stack, key):
    with Client(stack.addr) as c:
        first = c.lock(key, wait=0, fair=True)
        waiting = in_thread(lambda: c.lock(key, wait=10, fair=True))
        assert wait_until(lambda: len(c.describe(key).queue) == 1)
        entry = c.describe(key).queue[0]
        assert entry.session_id == c.session_id and entry.holder != first.holder
        first.release()
        second = waiting(10)
        assert not isinstance(second, BaseException), second
        assert second.fencing_token > first.fencing_token
        assert second.holder == entry.holder
        second.release()


def test_each_holder_gets_its_grants_back_after_a_sidecar_restart(restartable, key):
    with Client(restartable.addr) as c:
        mine = [c.lock(key, shared=True, wait=0), c.lock(key, shared=True, wait=0)]
        theirs = in_thread(lambda: c.lock(key, shared=True, wait=0))(10)
        solo = in_thread(lambda: c.lock(f"{key}-solo", wait=0))(10)
        for lock in (theirs, solo):
            assert not isinstance(lock, BaseException), lock
        session = c.session_id
        # The journal lists a grant once held 50 ms (only what it lists resumes): two
        # keys, three grants, in two or three fields of the record.
        assert wait_until(lambda: any(restartable.redis.recorded(session, n) for n in (2, 3)))
        wait_until(lambda: restartable.redis.recorded(session, 3), timeout=0.5)
        restartable.restart_sidecar()
        probe = c.lock(f"{key}-probe", wait=0)  # waits for the resume
        assert c.session_id == session
        assert not any(lock.lost.is_set() for lock in mine + [theirs, solo])
        counts = {h.holder: h.hold_count for h in c.describe(key).holders}
        assert counts == {mine[0].holder: 2, theirs.holder: 1}
        theirs.release()
        assert {h.holder for h in c.describe(key).holders} == {mine[0].holder}
        for lock in mine + [solo, probe]:
            lock.release()
        assert c.describe(key).holders == ()
