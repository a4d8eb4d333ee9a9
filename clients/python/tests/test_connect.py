"""No sidecar behind the address: a new session fails at once, naming the address and
the cause, unless the client was asked to wait for the sidecar (`wait_for_sidecar`),
for apps that start before it; then it logs one line and connects once the sidecar is
there."""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import time

import pytest

from kinds import in_thread
from servers import free_port, wait_until
from lockside import AsyncClient, Client, Unavailable


def waiting_lines(caplog) -> list:
    return [r for r in caplog.records if r.name == "lockside" and "waiting up to" in r.getMessage()]


def test_nothing_listening_fails_at_once_naming_the_address():
    addr = f"127.0.0.1:{free_port()}"
    with Client(addr) as c:  # the default connect_timeout (10 s) is not what is waited
        started = time.monotonic()
        with pytest.raises(Unavailable) as e:
            c.lock("nobody-listens", wait=0)
        assert time.monotonic() - started < 1.0
    assert addr in str(e.value) and "connection refused" in str(e.value)
    assert "wait_for_sidecar" in str(e.value)


def test_a_missing_unix_socket_fails_at_once_naming_it():
    path = os.path.join(tempfile.mkdtemp(prefix="lockside-py-"), "absent.sock")
    with Client(f"unix:{path}") as c:
        started = time.monotonic()
        with pytest.raises(Unavailable) as e:
            c.lock("nobody-listens", wait=0)
        assert time.monotonic() - started < 1.0
    assert path in str(e.value) and "no such socket file" in str(e.value)


def test_the_async_client_fails_at_once_too():
    addr = f"127.0.0.1:{free_port()}"

    async def main() -> None:
        async with AsyncClient(addr) as c:
            started = time.monotonic()
            with pytest.raises(Unavailable) as e:
                await c.lock("nobody-listens", wait=0)
            assert time.monotonic() - started < 1.0
            assert addr in str(e.value) and "connection refused" in str(e.value)

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_client_told_to_wait_connects_once_the_sidecar_starts(own_stack, key, caplog):
    caplog.set_level(logging.INFO, logger="lockside")
    addr = f"127.0.0.1:{free_port()}"
    with Client(addr, wait_for_sidecar=30.0) as c:
        taking = in_thread(lambda: c.lock(key, wait=0))
        assert wait_until(lambda: waiting_lines(caplog), timeout=5.0), "no line said it waits"
        own_stack.start_sidecar(listen=addr)  # only now: the client is waiting
        lock = taking(20.0)
        assert not isinstance(lock, BaseException), lock
        assert c.describe(key).holders[0].session_id == c.session_id
        lock.release()
    [line] = waiting_lines(caplog)
    assert addr in line.getMessage() and "connection refused" in line.getMessage()


def test_an_async_client_told_to_wait_connects_once_the_sidecar_starts(own_stack, key, caplog):
    caplog.set_level(logging.INFO, logger="lockside")
    addr = f"127.0.0.1:{free_port()}"

    async def main() -> None:
        async with AsyncClient(addr, wait_for_sidecar=30.0) as c:
            taking = asyncio.ensure_future(c.lock(key, wait=0))
            while not waiting_lines(caplog):  # the client's own line says it waits
                assert not taking.done(), taking
                await asyncio.sleep(0.01)
            own_stack.start_sidecar(listen=addr)
            lock = await asyncio.wait_for(taking, 20.0)
            assert (await c.describe(key)).holders[0].session_id == c.session_id
            await lock.release()

    asyncio.run(asyncio.wait_for(main(), 60))
    assert len(waiting_lines(caplog)) == 1


def test_a_sidecar_restarted_on_the_address_is_found_without_waiting_options(own_stack, key):
    # The channel may still be backing off from the dead sidecar: something listens at
    # the address, so the new session waits for the connection (connect_timeout).
    addr = own_stack.addr
    with Client(addr, resume=False) as c:
        c.lock(key, wait=0).release()
        # The release returns once it is on the stream: describe() waits for its
        # answer, so the key is free in the store before the sidecar dies.
        assert c.describe(key).holders == ()
        own_stack.sidecar.kill()
        with pytest.raises(Unavailable):
            c.lock(key, wait=0)
        own_stack.sidecar = own_stack.start_sidecar(listen=addr)
        with c.lock(key, wait=0):
            pass
