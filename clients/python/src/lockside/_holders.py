"""Holders: who inside a session holds a lock (DESIGN.md, "Holders inside a session").
A `Client`'s threads and an `AsyncClient`'s tasks are holders of their own, each named
once `kind:N:name` with a number never reused in the process. No I/O."""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import weakref
from typing import Any, Optional

#: The longest holder name the sidecar accepts, in bytes of UTF-8.
MAX_HOLDER_BYTES = 128

# One numbering for threads and tasks, never reused in the process (thread idents and
# `id(task)` are): a thread that died holding a lock, or a task that handed its lock
# on, must not make a newcomer with the same ident reentrant on it.
_holder_numbers = itertools.count(1)
_thread_holder = threading.local()
_task_holders: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()
_task_holders_mu = threading.Lock()


def _holder_name(kind: str, name: str) -> str:
    """`kind:N:name`: N a number of its own, the name (for `describe()`) with its
    control characters replaced, the whole cut to `MAX_HOLDER_BYTES`."""
    shown = "".join(c if c.isprintable() else "?" for c in name)
    full = f"{kind}:{next(_holder_numbers)}:{shown}".encode("utf-8")
    return full[:MAX_HOLDER_BYTES].decode("utf-8", "ignore")


def thread_holder() -> str:
    """The calling thread as a holder (`Client`): `thread:N:NAME`."""
    name: Optional[str] = getattr(_thread_holder, "name", None)
    if name is None:
        name = _thread_holder.name = _holder_name("thread", threading.current_thread().name)
    return name


def task_holder() -> Optional[str]:
    """The calling asyncio task as a holder (`AsyncClient`): `task:N:NAME`; None
    outside a task."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running loop
        return None
    if task is None:
        return None
    with _task_holders_mu:
        name = _task_holders.get(task)
        if name is None:
            name = _task_holders[task] = _holder_name("task", task.get_name())
    return name


def _after_fork_in_child() -> None:
    global _task_holders_mu
    _task_holders_mu = threading.Lock()  # a parent's thread may have held it


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
