"""Fixtures: real servers (servers.py) started by the tests and stopped after them."""

from __future__ import annotations

import uuid
from typing import Iterator

import pytest

from kinds import KINDS, client_factory
from servers import Stack


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
def election_addr(stack: Stack) -> str:
    """A sidecar for the election tests (values, proclaim, watch), on Redis."""
    return stack.addr


@pytest.fixture
def restartable() -> Iterator[Stack]:
    """A Redis and a sidecar of the test's own, whose sidecars hold their attachment
    600 ms rather than 3 s: a SIGKILLed sidecar's sessions can be resumed that soon."""
    s = Stack(sidecar_args=["--attachment-ttl", "600ms"])
    yield s
    s.stop()


@pytest.fixture(params=KINDS)
def make_client(request, monkeypatch):
    """Makes clients of each kind in turn (kinds.py): the sync `Client` and the
    `AsyncClient`; closes them after."""
    factory = client_factory(request.param, monkeypatch)
    made = []

    def make(addr, **options):
        c = factory(addr, **options)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()
