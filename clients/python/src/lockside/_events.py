"""What the core tells the package without being asked: a lock's state changed
(suspended, restored, lost) and the core's log lines. One thread per process reads
them (`lockside._native.next_events`, which waits with the GIL released) and applies
each to its lock (`_locks`, by the core's id) or to the "lockside" logger; a forked
child starts its own."""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Any, Optional

from lockside import _native

log = logging.getLogger("lockside")

#: Every lock of this process, by the core's id of its grant.
_locks: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
_thread: Optional[threading.Thread] = None
_pid = 0
_mu = threading.Lock()

#: Notified whenever a lock's state was applied (`Lock.wait_restored` waits on it).
changed = threading.Condition()


def track(lock: Any) -> None:
    """Has `lock`'s state changes applied to it from now on."""
    _locks[lock._native.id] = lock
    _ensure_thread()


def _ensure_thread() -> None:
    global _thread, _pid
    if _thread is not None and _pid == os.getpid():
        return
    with _mu:
        if _thread is not None and _pid == os.getpid():
            return
        _pid = os.getpid()
        _thread = threading.Thread(target=_run, name="lockside-events", daemon=True)
        _thread.start()


def _run() -> None:
    while True:
        for kind, number, text, reason in _native.next_events(1.0):
            if kind == "log":
                log.log(number, "%s", text)
                continue
            lock = _locks.get(number)
            if lock is not None:
                try:
                    lock._apply(text, reason)
                except Exception as e:  # noqa: BLE001 - one lock must not stop the others
                    log.warning("applying a state to lock %r: %s", lock.key, e)
        with changed:
            changed.notify_all()


def _after_fork_in_child() -> None:
    global _thread, _mu, changed
    _thread = None
    _mu = threading.Lock()
    changed = threading.Condition()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def start_logging() -> None:
    """Starts the thread that forwards the core's log lines (clients do on creation)."""
    _ensure_thread()
