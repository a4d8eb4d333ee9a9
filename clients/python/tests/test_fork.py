"""fork() of a process whose client is in use, as gunicorn --preload, Celery prefork and
multiprocessing do: the child gets a session of its own on first use, the parent's
locks stay the parent's, and the parent goes on with its client. The child is a real
os.fork() of the test process; it reports on a pipe and always leaves by os._exit."""

from __future__ import annotations

import json
import os
import select
import signal
import time
from typing import Callable, Dict

import pytest

from lockside import Client, NotAcquired

CHILD_TIMEOUT = 15.0


def in_child(work: Callable[[], Dict]) -> Dict:
    """Runs `work` in a forked child; returns what it returned (a dict, through a pipe)
    or fails the test when it raised, hung or died."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            signal.alarm(int(CHILD_TIMEOUT))  # a hang ends the child, not the suite
            os.close(r)
            try:
                report = {"ok": True, **work()}
            except BaseException as e:  # noqa: BLE001 - reported to the parent
                report = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            os.write(w, json.dumps(report).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    data = b""
    deadline = time.monotonic() + CHILD_TIMEOUT + 5
    try:
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([r], [], [], max(0.0, left))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                pytest.fail("the forked child did not report in time")
            chunk = os.read(r, 65536)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(r)
        _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status}"
    report = json.loads(data)
    assert report["ok"], report["error"]
    return report


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded")
def test_a_forked_child_gets_a_session_of_its_own_and_the_parent_keeps_its_locks(stack, key):
    with Client(stack.addr, client_name="forking") as c:
        held = c.lock(key, wait=0)
        parent_session = c.session_id

        def child() -> Dict:
            report: Dict = {"inherited_held": held.held, "inherited_lost": held.lost.is_set()}
            held.release()  # not the child's: does nothing, sends nothing
            started = time.monotonic()
            other = c.lock(f"{key}-child", wait=0)
            report["first_lock_s"] = time.monotonic() - started
            report["session"] = c.session_id
            try:
                c.lock(key, wait=0)
                report["busy"] = "granted"
            except NotAcquired as e:
                report["busy"] = e.reason
            try:
                c.lock(key, wait=0.3)
                report["waited"] = "granted"
            except NotAcquired as e:
                report["waited"] = e.reason
            report["holder_seen"] = c.describe(key).holders[0].session_id
            other.release()
            c.close()  # the child's session only
            return report

        report = in_child(child)
        assert report["inherited_held"] is False and report["inherited_lost"] is True
        assert report["first_lock_s"] < 1.0, report
        assert report["session"] not in (None, parent_session)
        assert report["busy"] == "BUSY" and report["waited"] == "TIMEOUT"
        assert report["holder_seen"] == parent_session
        # The parent's lock is untouched, and its client goes on.
        assert held.held and not held.lost.is_set()
        [holder] = c.describe(key).holders
        assert (holder.session_id, holder.hold_count) == (parent_session, 1)
        assert c.describe(f"{key}-child").holders == ()
        after = c.lock(f"{key}-after", wait=0)
        assert after.session_id == parent_session
        after.release()
        held.release()
        assert c.describe(key).holders == ()


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded")
def test_forks_in_a_row_each_get_a_working_session(stack, key):
    # gRPC's state in the child is only sound when no thread was inside gRPC at the
    # fork; one fork in several used to find the session's reader there (and the
    # child then aborted in gRPC's poller), so fork more than once.
    with Client(stack.addr) as c:
        held = c.lock(key, wait=0)
        for i in range(8):

            def child() -> Dict:
                with c.lock(f"{key}-{i}", wait=0):
                    pass
                return {}

            in_child(child)
            assert held.held
            c.lock(f"{key}-parent-{i}", wait=0).release()
        held.release()
