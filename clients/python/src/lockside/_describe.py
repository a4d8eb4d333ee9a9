"""The store's view of one key, as `describe()` and `watch()` give it: `Description`,
its `Holder`s (one per holder of a session) and its fair `QueueEntry`s. No I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

_MODES = {0: "UNSPECIFIED", 1: "EXCLUSIVE", 2: "SHARED"}


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


def description(row: Any) -> Description:
    """A `Description` from the core's row."""
    key, mode, limit, holders, waiters, token, queue = row
    return Description(
        key=key,
        mode=_MODES.get(mode, "UNSPECIFIED"),
        limit=limit,
        holders=tuple(Holder(s, c, t, n, bytes(v), f, h) for s, c, t, n, v, f, h in holders),
        waiters=waiters,
        fencing_token=token,
        queue=tuple(
            QueueEntry(s, n, _MODES.get(m, "UNSPECIFIED"), p, h) for s, n, m, p, h in queue
        ),
    )
