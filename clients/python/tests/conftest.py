"""Fixtures: real servers (servers.py) started by the tests and stopped after them."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from typing import Iterator

import pytest

from servers import Sidecar, Stack


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    """One Redis and one sidecar for the tests that harm nothing."""
    s = Stack()
    yield s
    s.stop()


@pytest.fixture
def own_stack() -> Iterator[Stack]:
    """A Redis and a sidecar of the test's own, for tests that kill one of them."""
    s = Stack()
    yield s
    s.stop()


@pytest.fixture
def key() -> str:
    """A key no other test uses."""
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def election_addr() -> Iterator[str]:
    """A sidecar for the election tests (values, proclaim, watch): on the memory store
    until the Redis store carries holder values and tells watchers of changes (the
    Redis data model v2). LEAD: use `stack` once it does."""
    workdir = tempfile.mkdtemp(prefix="lockside-py-")
    sidecar = Sidecar("memory", workdir)
    yield sidecar.addr
    sidecar.stop()
    shutil.rmtree(workdir, ignore_errors=True)
