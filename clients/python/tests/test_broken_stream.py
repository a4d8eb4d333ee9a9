"""A broken stream suspends every lock at once (DESIGN.md, "A broken stream"): a live
sidecar releases a broken stream's locks after its 30 ms grace and a waiter on another
sidecar is granted within milliseconds, so the holder must have stopped by then.

The overlap tests record a history (TESTING.md): the holder's t_ack when its grant
arrives and t_end when it is told to stop (a watcher thread or task waiting on
`lock.suspended`, which is set first whatever follows), the waiter's t_ack when its
grant arrives; then no interval may start before an earlier one ended, and fencing
tokens must increase in grant order. The faults: a connection reset between a live
client and a live sidecar (a TCP proxy, proxy.py), and a sidecar frozen (SIGSTOP) past
the client's keepalive (1 s + 1 s). Then: a restart in place (suspended, restored with
the same token), the memory store (no resume token: lost at once), and four threads or
tasks sharing one client (each gets its own lock back)."""

from __future__ import annotations

import asyncio
import logging
import queue
import signal
import threading
import time
from typing import Any, Callable, Iterator, List, Optional, Tuple

import pytest

from kinds import _Loop, in_thread
from proxy import Proxy
from servers import Sidecar, Stack, wait_until
from lockside import AsyncClient, Client, LockLost

now = time.monotonic


# -- the history ----------------------------------------------------------------------


class History:
    """Holding intervals of one key: (t_ack, t_end, who, fencing token)."""

    def __init__(self) -> None:
        self.intervals: List[Tuple[float, float, str, int]] = []
        self._mu = threading.Lock()

    def add(self, who: str, token: int, t_ack: float, t_end: float) -> None:
        with self._mu:
            self.intervals.append((t_ack, t_end, who, token))

    def check(self) -> None:
        """No overlap, and tokens that never go back (a restored holder keeps its
        token; a new holder's is larger)."""
        ordered = sorted(self.intervals)
        end, last = float("-inf"), None
        for interval in ordered:
            t_ack, t_end, who, token = interval
            assert t_ack >= end, f"overlap: {interval} began before {last} ended"
            if last is not None:
                assert token > last[3] or (token == last[3] and who == last[2]), (
                    f"token regression: {interval} after {last}"
                )
            end, last = max(end, t_end), interval


# -- holders of each kind, as their users hold them -------------------------------------


class SyncHolder:
    """A `Client` whose lock is watched by a thread that stamps the moment the lock
    is suspended."""

    def __init__(self, addr: str):
        self.client = Client(addr, connect_timeout=5.0)
        self._stopped: "queue.Queue[float]" = queue.Queue()

    def acquire(self, key: str, ttl: Optional[float]) -> Tuple[int, float]:
        self.lock = self.client.lock(key, wait=0, ttl=ttl)
        t_ack = now()

        def watch() -> None:
            self.lock.suspended.wait()
            self._stopped.put(now())

        threading.Thread(target=watch, daemon=True).start()
        return self.lock.fencing_token, t_ack

    def stopped_at(self, timeout: float) -> float:
        return self._stopped.get(timeout=timeout)

    def wait_restored(self, timeout: float) -> bool:
        return self.lock.wait_restored(timeout)

    def release(self) -> None:
        self.lock.release()

    def close(self) -> None:
        self.client.close()


class AsyncHolder:
    """An `AsyncClient` on an event loop of its own thread; its lock is watched by a
    task that stamps the moment the lock is suspended."""

    def __init__(self, addr: str):
        self._loop = _Loop()
        self.client = AsyncClient(addr, connect_timeout=5.0)
        self._stopped: "queue.Queue[float]" = queue.Queue()

    def acquire(self, key: str, ttl: Optional[float]) -> Tuple[int, float]:
        async def acquire() -> Tuple[int, float]:
            self.lock = await self.client.lock(key, wait=0, ttl=ttl)
            t_ack = now()

            async def watch() -> None:
                await self.lock.suspended.wait()
                self._stopped.put(now())

            self._watcher = asyncio.ensure_future(watch())
            return self.lock.fencing_token, t_ack

        return self._loop.run(acquire())

    def stopped_at(self, timeout: float) -> float:
        return self._stopped.get(timeout=timeout)

    def wait_restored(self, timeout: float) -> bool:
        async def restored() -> bool:
            try:
                return await asyncio.wait_for(self.lock.restored_wait(), timeout)
            except asyncio.TimeoutError:
                return False

        return self._loop.run(restored(), timeout + 10)

    def release(self) -> None:
        self._loop.run(self.lock.release())

    def close(self) -> None:
        if self._loop.thread.is_alive():
            self._loop.run(self.client.close())
            self._loop.stop()


HOLDERS = {"sync": SyncHolder, "async": AsyncHolder}


# -- one round: hold, let another sidecar's client wait, break, see who holds -------------


def fault_round(
    history: History,
    holder: Any,
    waiter: Client,
    key: str,
    ttl: Optional[float],
    fault: Callable[[], None],
    heal: Callable[[], None] = lambda: None,
    heal_first: bool = True,
    give_up_holder: bool = False,
    patience: float = 20.0,
) -> bool:
    """The holder takes `key`, `waiter` (on another sidecar) waits for it, `fault()`
    breaks the holder's stream, and `heal()` runs once the holder is suspended
    (`heal_first`) or once the first of the two has an outcome. A holder restored (its
    sidecar resumed the session) uses the lock again and releases it; the waiter, once
    granted, releases at once. `give_up_holder`: once the waiter holds the key, the
    holder's client is closed rather than left to find its lock lost at the TTL.
    Returns whether the holder was restored."""
    token, t_ack = holder.acquire(key, ttl)
    outcomes: "queue.Queue[Tuple[str, Any]]" = queue.Queue()

    def wait_elsewhere() -> None:
        try:
            lock = waiter.lock(key, wait=patience)
            t = now()
            history.add("waiter", lock.fencing_token, t, t)
            lock.release()
            outcomes.put(("waiter", True))
        except BaseException as e:  # noqa: BLE001 - handed to the test
            outcomes.put(("waiter", e))

    threading.Thread(target=wait_elsewhere, daemon=True).start()
    assert wait_until(lambda: waiter.describe(key).waiters == 1), "the waiter waits"
    fault()
    history.add("holder", token, t_ack, holder.stopped_at(timeout=patience))

    def after_break() -> None:
        try:
            restored = holder.wait_restored((ttl or 10.0) + 5.0)
            if restored:
                t = now()
                history.add("holder", token, t, now())
                holder.release()
            outcomes.put(("holder", restored))
        except BaseException as e:  # noqa: BLE001 - handed to the test
            outcomes.put(("holder", e))

    threading.Thread(target=after_break, daemon=True).start()
    if heal_first:
        heal()
    seen = dict([outcomes.get(timeout=patience)])
    if not heal_first:
        heal()
    if "waiter" in seen and give_up_holder:
        holder.close()
    seen.update([outcomes.get(timeout=patience)])
    for outcome in seen.values():
        assert not isinstance(outcome, BaseException), outcome
    return seen["holder"]


@pytest.fixture
def two_sidecars() -> Iterator[Stack]:
    """A Redis and two sidecars on it: the holder's (`stack.sidecar`) and the
    waiter's (`stack.sidecars[1]`)."""
    s = Stack()
    s.start_sidecar()
    yield s
    s.stop()


@pytest.mark.parametrize("kind", HOLDERS)
def test_a_connection_reset_stops_the_holder_before_a_waiter_elsewhere_is_granted(
    two_sidecars, kind, key
):
    proxy = Proxy(two_sidecars.sidecar.addr)

    def reset() -> None:
        assert proxy.reset() >= 1, "the holder's connection goes through the proxy"

    history = History()
    try:
        with Client(two_sidecars.sidecars[1].addr) as waiter:
            for _ in range(10):
                holder = HOLDERS[kind](proxy.addr)
                try:
                    # The default TTL (10 s): the old rule used the lock 4.5 s on.
                    fault_round(history, holder, waiter, key, None, reset, give_up_holder=True)
                finally:
                    holder.close()
    finally:
        proxy.close()
    history.check()


@pytest.mark.parametrize("kind", HOLDERS)
def test_a_frozen_sidecar_stops_the_holder_before_a_waiter_elsewhere_is_granted(
    two_sidecars, kind, key
):
    # TTL 5 s: a frozen sidecar's lock expires 2/3 of it (3.3 s) after the freeze at
    # the earliest; the client's keepalive (1 s + 1 s) notices the freeze in about 2 s.
    sidecar = two_sidecars.sidecar
    history = History()

    def freeze() -> None:
        sidecar.proc.send_signal(signal.SIGSTOP)

    def thaw() -> None:
        sidecar.proc.send_signal(signal.SIGCONT)

    restored = []
    try:
        with Client(two_sidecars.sidecars[1].addr) as waiter:
            # Thawed once the holder is suspended (the sidecar then sees the broken
            # stream and releases), or once the waiter was granted at the expiry.
            for heal_first in (True, False, True):
                holder = HOLDERS[kind](sidecar.addr)
                try:
                    restored.append(
                        fault_round(
                            history,
                            holder,
                            waiter,
                            key,
                            5.0,
                            freeze,
                            thaw,
                            heal_first,
                            give_up_holder=heal_first,
                        )
                    )
                finally:
                    thaw()
                    holder.close()
    finally:
        thaw()
    history.check()
    assert restored[1] is False, "expired and granted elsewhere: it cannot come back"


# -- a restart in place, the memory store, a client shared by threads and tasks --------------


def held_in_store(stack: Stack, session_id: str, keys: int) -> None:
    """Waits until the session's record lists `keys` keys (only those resume)."""
    assert wait_until(lambda: stack.redis.recorded(session_id, keys)), "recorded in time"


def test_a_sidecar_restarted_in_place_suspends_the_lock_then_restores_it(
    restartable, make_client, key
):
    c = make_client(restartable.addr)
    lock = c.lock(key, wait=0)
    held_in_store(restartable, c.session_id, 1)
    restartable.sidecar.kill()
    assert lock.suspended.wait(2.0), "suspended at the break"
    assert not lock.lost.is_set() and lock.held
    restartable.sidecar = restartable.start_sidecar(listen=restartable.sidecar.addr)
    assert lock.wait_restored(10.0), "restored by the resumed session"
    assert not lock.suspended.is_set() and not lock.lost.is_set()
    [holder] = c.describe(key).holders
    assert (holder.session_id, holder.fencing_token) == (lock.session_id, lock.fencing_token)
    lock.release()  # no LockLost
    assert c.describe(key).holders == ()


@pytest.fixture
def memory_sidecar(tmp_path) -> Iterator[Sidecar]:
    """A sidecar on its embedded memory store: its locks die with it, so it gives
    sessions no resume token."""
    sidecar = Sidecar("memory", str(tmp_path))
    yield sidecar
    sidecar.stop()


def test_with_the_memory_store_a_sidecar_kill_loses_every_lock_at_once(
    memory_sidecar, make_client, key, caplog
):
    caplog.set_level(logging.INFO, logger="lockside")
    c = make_client(memory_sidecar.addr, connect_timeout=2.0)
    locks = [c.lock(f"{key}-{i}", wait=0) for i in range(2)]  # TTL 10 s
    memory_sidecar.kill()
    for lock in locks:
        assert lock.lost.wait(2.0), "lost at the break, not at the TTL"
        assert lock.suspended.is_set()
        assert "cannot resume sessions" in lock.lost_reason
        with pytest.raises(LockLost):
            lock.release()
    assert not [r for r in caplog.records if "resuming session" in r.getMessage()]


def test_four_threads_sharing_a_client_each_get_their_own_lock_back(restartable, key):
    with Client(restartable.addr) as c:
        taken = threading.Barrier(5)
        checked = threading.Event()

        def hold(i: int) -> Tuple[str, int, bool, bool]:
            lock = c.lock(f"{key}-{i}", wait=0)
            taken.wait(10)
            suspended = lock.suspended.wait(10)
            restored = lock.wait_restored(10)
            assert checked.wait(10)
            lock.release()  # from its own thread, as it took it
            return lock.holder, lock.fencing_token, suspended, restored

        outcomes = [in_thread(lambda i=i: hold(i)) for i in range(4)]
        taken.wait(10)
        session = c.session_id
        held_in_store(restartable, session, 4)
        restartable.restart_sidecar()
        c.lock(f"{key}-probe", wait=0).release()  # after the resume
        descriptions = [c.describe(f"{key}-{i}").holders for i in range(4)]
        checked.set()
        results = [outcome(20) for outcome in outcomes]
    for i, result in enumerate(results):
        assert not isinstance(result, BaseException), result
        holder, token, suspended, restored = result
        assert suspended and restored
        [back] = descriptions[i]
        assert (back.holder, back.fencing_token, back.session_id) == (holder, token, session)
    assert len({r[0] for r in results}) == 4, "a holder per thread"


def test_four_tasks_sharing_an_async_client_each_get_their_own_lock_back(restartable, key):
    async def main() -> None:
        async with AsyncClient(restartable.addr) as c:
            taken = [asyncio.Event() for _ in range(4)]
            checked = asyncio.Event()

            async def hold(i: int) -> Tuple[str, int, bool]:
                async with c.lock(f"{key}-{i}", wait=0) as lock:
                    taken[i].set()
                    await lock.suspended.wait()
                    restored = await lock.restored_wait()
                    await checked.wait()
                return lock.holder, lock.fencing_token, restored

            tasks = [asyncio.ensure_future(hold(i)) for i in range(4)]
            for event in taken:
                await event.wait()
            session = c.session_id
            await asyncio.to_thread(held_in_store, restartable, session, 4)
            await asyncio.to_thread(restartable.restart_sidecar)
            await (await c.lock(f"{key}-probe", wait=0)).release()  # after the resume
            descriptions = [(await c.describe(f"{key}-{i}")).holders for i in range(4)]
            checked.set()
            results = await asyncio.gather(*tasks)
            for i, (holder, token, restored) in enumerate(results):
                assert restored
                [back] = descriptions[i]
                assert (back.holder, back.fencing_token, back.session_id) == (
                    holder,
                    token,
                    session,
                )
            assert len({r[0] for r in results}) == 4, "a holder per task"
            for i in range(4):
                assert (await c.describe(f"{key}-{i}")).holders == ()

    asyncio.run(asyncio.wait_for(main(), 60))
