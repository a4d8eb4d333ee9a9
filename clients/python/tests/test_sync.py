"""The blocking `Client` against a real sidecar on a real Redis."""

from __future__ import annotations

import threading

import pytest

from servers import free_port, wait_until
from lockside import Client, LockLost, LocksideError, NotAcquired, Rejected, Unavailable


def test_grant_carries_a_fencing_token_and_shows_in_describe(stack, key):
    with Client(stack.addr, client_name="pytest-grant") as c:
        with c.lock(key, wait=0, ttl=10.0) as lock:
            assert isinstance(lock.fencing_token, int) and lock.fencing_token > 0
            assert 0 < lock.ttl <= 10.0
            assert not lock.lost.is_set()
            d = c.describe(key)
            assert d.fencing_token == lock.fencing_token
            assert [(h.session_id, h.client_name) for h in d.holders] == [
                (c.session_id, "pytest-grant")
            ]


def test_busy_key_raises_not_acquired(stack, key):
    with Client(stack.addr) as holder, Client(stack.addr) as other:
        with holder.lock(key, wait=0):
            with pytest.raises(NotAcquired) as busy:
                other.lock(key, wait=0)
            assert busy.value.reason == "BUSY"
            with pytest.raises(NotAcquired) as late:
                other.lock(key, wait=0.1)
            assert late.value.reason == "TIMEOUT"


def test_a_waiter_gets_the_lock_when_the_holder_releases(stack, key):
    with Client(stack.addr) as holder, Client(stack.addr) as waiter:
        first = holder.lock(key, wait=0)
        got = []
        t = threading.Thread(target=lambda: got.append(waiter.lock(key, wait=10.0)))
        t.start()
        assert wait_until(lambda: waiter.describe(key).waiters == 1)
        first.release()
        t.join(10)
        assert got and got[0].fencing_token > first.fencing_token
        got[0].release()


def test_reentrant_grants_share_the_token_and_count_holds(stack, key):
    with Client(stack.addr) as c, Client(stack.addr) as other:
        with c.lock(key, wait=0) as outer:
            with c.lock(key, wait=0) as inner:
                assert inner.hold_count == 2
                assert inner.fencing_token == outer.fencing_token
            assert c.describe(key).holders[0].hold_count == 1
            with pytest.raises(NotAcquired):
                other.lock(key, wait=0)
        assert c.describe(key).holders == ()


def test_leaving_the_block_releases_even_on_an_exception(stack, key):
    with Client(stack.addr) as c, Client(stack.addr) as other:
        with pytest.raises(ZeroDivisionError):
            with c.lock(key, wait=0) as lock:
                1 / 0
        assert not lock.held
        with other.lock(key, wait=0) as next_lock:
            assert next_lock.fencing_token > lock.fencing_token
        lock.release()  # a second release does nothing


def test_many_locks_on_one_session_from_many_threads(stack, key):
    keys = [f"{key}-{i}" for i in range(40)]
    with Client(stack.addr) as c:
        locks = {}
        errors = []

        def take(chunk):
            try:
                for k in chunk:
                    locks[k] = c.lock(k, wait=0)
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=take, args=(keys[i::4],)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors
        assert sorted(locks) == sorted(keys)
        assert {lock.session_id for lock in locks.values()} == {c.session_id}
        assert len({lock.fencing_token for lock in locks.values()}) >= 1
        for k in keys:
            assert c.describe(k).holders[0].session_id == c.session_id
        for lock in locks.values():
            lock.release()
        assert all(c.describe(k).holders == () for k in keys)


def test_shared_holders_and_semaphore_permits(stack, key):
    with Client(stack.addr) as a, Client(stack.addr) as b, Client(stack.addr) as x:
        with a.lock(key, wait=0, shared=True), b.lock(key, wait=0, shared=True):
            assert len(a.describe(key).holders) == 2
            with pytest.raises(NotAcquired):
                x.lock(key, wait=0)
        sem = f"{key}-sem"
        with a.lock(sem, wait=0, limit=2), b.lock(sem, wait=0, limit=2):
            with pytest.raises(NotAcquired):
                x.lock(sem, wait=0, limit=2)
        with x.lock(sem, wait=0, limit=2, fair=True):
            pass


def test_bad_input_is_a_clear_error_and_the_session_goes_on(stack, key):
    with Client(stack.addr) as c:
        with c.lock(key, wait=0) as held:
            with pytest.raises(Rejected) as empty:
                c.lock("", wait=0)
            assert empty.value.code == 3 and empty.value.code_name == "INVALID_ARGUMENT"
            assert "empty" in empty.value.message
            with pytest.raises(Rejected) as control:
                c.lock("bad\nkey", wait=0)
            assert control.value.code == 3
            with pytest.raises(Rejected) as long_key:
                c.lock("k" * 600, wait=0)
            assert long_key.value.code == 3  # over 512 bytes
            with pytest.raises(Rejected) as huge:
                c.lock("k" * 100_000, wait=0)
            assert huge.value.code == 8  # RESOURCE_EXHAUSTED: over the message limit
            assert len(str(huge.value)) < 500
            with pytest.raises(Rejected) as short_ttl:
                c.lock(f"{key}-ttl", wait=0, ttl=0.5)
            assert short_ttl.value.code == 3
            with pytest.raises(Rejected) as upgrade:
                c.lock(f"{key}-rw", wait=0, shared=True)
                c.lock(f"{key}-rw", wait=0)
            assert upgrade.value.code == 9  # FAILED_PRECONDITION: no silent upgrade
            with pytest.raises(ValueError):
                c.lock(key, wait=-1)
            with pytest.raises(ValueError):
                c.lock(key, ttl=float("nan"))
            with pytest.raises(ValueError):
                c.lock(key, limit=-1)
            with pytest.raises(TypeError):
                c.lock(None)  # type: ignore[arg-type]
            with pytest.raises(TypeError):
                c.lock(key, wait="5")  # type: ignore[arg-type]
            with pytest.raises(Rejected) as describe:
                c.describe("")
            assert describe.value.code == 3
            assert held.held and not held.lost.is_set()
            assert c.describe(key).holders[0].session_id == c.session_id


def test_lost_when_redis_dies(own_stack, key):
    with Client(own_stack.addr) as c:
        lock = c.lock(key, wait=0, ttl=1.0)
        own_stack.redis.stop()
        # Renewals fail; the sidecar says Lost before the store's 1 s TTL runs out.
        assert lock.lost.wait(5.0), "no Lost within 5 s of Redis dying"
        assert lock.lost_reason
        with pytest.raises(LockLost) as lost:
            lock.release()
        assert lost.value.fencing_token == lock.fencing_token
        lock.release()  # reported once
        with pytest.raises(Rejected) as down:
            c.lock(f"{key}-2", wait=0)
        assert down.value.code == 14  # UNAVAILABLE: the store, not the key, is the problem


def test_leaving_a_block_whose_lock_was_lost_raises_lock_lost(own_stack, key):
    with Client(own_stack.addr) as c:
        with pytest.raises(LockLost):
            with c.lock(key, wait=0, ttl=1.0) as lock:
                own_stack.redis.stop()
                assert lock.lost.wait(5.0)


def test_a_broken_stream_loses_every_lock_and_the_next_lock_opens_a_new_session(own_stack, key):
    # Without resuming (test_resume.py resumes); connect_timeout: long enough for
    # gRPC's reconnect backoff (at most 1 s here).
    with Client(own_stack.addr, connect_timeout=2.0, resume=False) as c:
        locks = [c.lock(f"{key}-{i}", wait=0) for i in range(3)]
        first_session = c.session_id
        port = own_stack.addr.rsplit(":", 1)[1]
        own_stack.sidecar.kill()
        for lock in locks:
            assert lock.lost.wait(5.0), "a broken stream must mark the lock lost"
        with pytest.raises(Unavailable):
            c.lock(f"{key}-x", wait=0)
        # A sidecar again on the same address: the next lock opens a new session.
        own_stack.sidecar = own_stack.start_sidecar(f"127.0.0.1:{port}")
        with c.lock(f"{key}-new", wait=0) as fresh:
            assert c.session_id != first_session
            assert fresh.session_id == c.session_id


def test_close_ends_the_session_and_releases(stack, key):
    c = Client(stack.addr)
    lock = c.lock(key, wait=0)
    c.close()
    assert lock.lost.is_set() and lock.lost_reason == "client closed"
    with Client(stack.addr) as other:
        with other.lock(key, wait=5.0):
            pass
    with pytest.raises(Exception):
        c.lock(key, wait=0)


def test_no_sidecar_is_unavailable():
    with Client(f"127.0.0.1:{free_port()}", connect_timeout=0.5) as c:
        with pytest.raises(Unavailable):
            c.lock("nobody-listens", wait=0)


def test_a_leader_campaigns_proclaims_and_followers_watch(election_addr, key):
    with Client(election_addr, client_name="web-1") as c, Client(election_addr) as follower:
        with follower.watch(key) as states:
            assert next(states).leader is None
            with c.campaign(key, "web-1:8080", ttl=5.0) as lead:
                state = next(states)
                assert (state.leader.value, state.leader.fencing_token) == (
                    b"web-1:8080",
                    lead.fencing_token,
                )
                assert state.leader.client_name == "web-1"
                described = follower.describe(key).leader
                assert (described.value, described.fencing_token) == (
                    b"web-1:8080",
                    lead.fencing_token,
                )
                lead.proclaim(b"web-1:9090")
                assert next(states).leader.value == b"web-1:9090"
            state = next(states)
            assert state.leader is None and state.fencing_token == lead.fencing_token


def test_candidates_lead_in_the_order_they_campaigned(election_addr, key):
    with Client(election_addr) as a, Client(election_addr) as b, Client(election_addr) as w:
        first = a.campaign(key, b"a")
        led = []
        t = threading.Thread(target=lambda: led.append(b.campaign(key, b"b", wait=10.0)))
        t.start()
        assert wait_until(lambda: len(w.describe(key).queue) == 1)
        first.release()
        t.join(10)
        assert led and led[0].fencing_token > first.fencing_token
        assert w.describe(key).leader.value == b"b"
        led[0].release()


def test_bad_values_keys_and_lost_leaders_are_refused(election_addr, key):
    with Client(election_addr) as c:
        with pytest.raises(Rejected) as bad:
            next(c.watch(""))
        assert bad.value.code == 3
        with pytest.raises(Rejected) as big:
            c.campaign(key, b"x" * 4097)
        assert big.value.code == 3
        with pytest.raises(TypeError):
            c.campaign(key, 42)
        lead = c.campaign(key, "a")
        with pytest.raises(Rejected) as big:
            lead.proclaim(b"x" * 4097)
        assert big.value.code == 3
        lead.proclaim(b"")  # clears it
        assert c.describe(key).leader.value == b""
        lead.release()
        with pytest.raises(LocksideError):
            lead.proclaim(b"after")
