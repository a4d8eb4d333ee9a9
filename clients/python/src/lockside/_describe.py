"""The store's view of one key, as `describe()` and `watch()` give it: `Description`,
its `Holder`s (one per holder of a session) and its fair `QueueEntry`s; what the sync
and asyncio watches share (`WatchBase`), and how a failed Describe or Watch call
becomes this package's error (`call_errors`). No I/O."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence

import grpc

from lockside._errors import LocksideError, call_error

try:
    from lockside._pb import lockside_pb2 as pb
except ImportError as e:  # pragma: no cover - only a source tree without a build
    raise ImportError(
        "lockside: the generated stubs (lockside._pb) are missing; install the package "
        "(`pip install ./clients/python`) rather than importing it from the source tree"
    ) from e


def seconds(d: Any) -> float:
    """A `google.protobuf.Duration` in seconds."""
    return float(d.seconds + d.nanos / 1e9)


@dataclass(frozen=True)
class Holder:
    """One grant of a key: a session, or one holder inside a session (a thread of a
    `Client`, a task of an `AsyncClient`; two holders of one session are two
    entries)."""

    session_id: str
    hold_count: int
    #: Seconds before the store lets the lock go if it is not renewed.
    ttl_remaining: float
    client_name: str
    #: The holder's value (`lock(value=...)`, `campaign()`, `proclaim()`): in an
    #: election, who leads and where. b"" for none.
    value: bytes = b""
    #: The fencing token of the holder's grant: successive leaders have larger ones.
    fencing_token: int = 0
    #: The holder inside its session (`Lock.holder`); "" for the session itself.
    holder: str = ""


@dataclass(frozen=True)
class QueueEntry:
    """One fair waiter of a key; `position` 1 is next in line."""

    session_id: str
    client_name: str
    mode: str
    position: int
    #: The waiting holder inside its session (`Lock.holder`).
    holder: str = ""


@dataclass(frozen=True)
class Description:
    """The store's view of one key (`Client.describe`, each state of `Client.watch`)."""

    key: str
    #: "EXCLUSIVE", "SHARED", or "UNSPECIFIED" when nobody holds it.
    mode: str
    #: 1 for a lock, N for a semaphore of N permits, 0 when nobody holds the key.
    limit: int
    holders: Sequence[Holder]
    waiters: int
    #: The last fencing token issued for the key (0 if none ever was).
    fencing_token: int
    queue: Sequence[QueueEntry]

    @property
    def leader(self) -> Optional[Holder]:
        """The holder of an election key (None when nobody leads); for a key held by
        several (shared, a semaphore), the oldest grant."""
        return min(self.holders, key=lambda h: h.fencing_token, default=None)


def _mode_name(mode: int) -> str:
    name: str = pb.LockMode.Name(mode)
    return name.replace("LOCK_MODE_", "")


def description(r: Any) -> Description:
    return Description(
        key=r.key,
        mode=_mode_name(r.mode),
        limit=r.limit,
        holders=tuple(
            Holder(
                h.session_id,
                h.hold_count,
                seconds(h.ttl_remaining),
                h.client_name,
                bytes(h.value),
                h.fencing_token,
                h.holder,
            )
            for h in r.holders
        ),
        waiters=r.waiters,
        fencing_token=r.fencing_token,
        queue=tuple(
            QueueEntry(q.session_id, q.client_name, _mode_name(q.mode), q.position, q.holder)
            for q in r.queue
        ),
    )


@contextlib.contextmanager
def call_errors(key: str) -> Iterator[None]:
    """Raises a failed Describe or Watch call (`grpc.RpcError`) as this package's
    error (`call_error`)."""
    try:
        yield
    except grpc.RpcError as e:
        raise call_error(key, e) from None


class WatchBase:
    """What `Watch` and `AsyncWatch` share: the call, and how it ends."""

    def __init__(self, call: Any, key: str):
        self._call = call
        self._key = key
        self._cancelled = False

    def cancel(self) -> None:
        """Ends the watch."""
        self._cancelled = True
        self._call.cancel()

    def _failed(self, e: grpc.RpcError) -> Optional[LocksideError]:
        """What iterating raises when the call failed with `e`; None when the watch
        was cancelled: the iteration stops."""
        return None if self._cancelled else call_error(self._key, e)
