"""Lockside: distributed locks held by a live gRPC stream to the sidecar in your pod.

    from lockside import Client, NotAcquired

    with Client() as c:                                   # $LOCKSIDE_ADDR or 127.0.0.1:7420
        with c.lock("orders", wait=5.0, ttl=10.0) as lock:
            for batch in batches:
                if lock.suspended.is_set() and not lock.wait_restored():
                    break                                 # lost: stop using the resource
                write(batch, fencing_token=lock.fencing_token)

`AsyncClient` is the same on asyncio. One client is one session (one `Lease` stream)
holding any number of locks; the sidecar releases them all when the stream ends,
whatever ends it. When the stream breaks (a reset connection, a frozen or dead
sidecar), every lock is suspended at once (`lock.suspended` set: stop using it) while
the client resumes the session; a lock the resumed session lists is restored
(`suspended` cleared), any other is lost (`lock.lost` set).

Several keys at once, all or none and without deadlock in any order:
`with c.lock_all(["acct:alice", "acct:bob"]) as locks:` gives each key's lock
(`locks["acct:alice"].fencing_token`, `locks.fencing_tokens`).

Leader election: `c.campaign(key, value)` returns once this client leads (a `Lock`:
`proclaim(value)` changes what followers see, `release()` resigns); followers iterate
`c.watch(key)` and read `state.leader` (None while nobody leads).
"""

# Layout. The session's rules are the client core's (crates/lockside-client, in Rust),
# reached through `_native` (clients/python/native/, PyO3); this package keeps the
# idioms: context managers, events, holders named after threads and tasks, typing.
#   _native           the binding (a compiled module; its types in _native.pyi)
#   _client.py        ClientBase: options, the core's client (one of its own in a forked
#                     child), lock() and campaign(), the values a request may carry
#   _sync.py          Client, Lock, Watch: the core's waits with the GIL released
#   _aio.py           AsyncClient, AsyncLock, AsyncWatch: answers through a socket the
#                     event loop watches
#   _lock.py          LockBase: one lock's states as the core reports them
#   _locks.py         Locks, AsyncLocks: several keys taken at once (lock_all)
#   _events.py        the thread that applies the core's news (states, log lines)
#   _holders.py       thread and task holders    _describe.py  the store's view of a key
#   _errors.py        the errors                 _sidecar.py   the default address

from lockside._aio import AsyncClient, AsyncLock, AsyncWatch
from lockside._client import TLS
from lockside._describe import Description, Holder, QueueEntry
from lockside._errors import LocksideError, LockLost, NotAcquired, Rejected, Unavailable
from lockside._locks import AsyncLocks, Locks
from lockside._sidecar import DEFAULT_ADDR
from lockside._sync import Client, Lock, Watch

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "AsyncLock",
    "AsyncLocks",
    "AsyncWatch",
    "Client",
    "DEFAULT_ADDR",
    "Description",
    "Holder",
    "Lock",
    "Locks",
    "LockLost",
    "LocksideError",
    "NotAcquired",
    "QueueEntry",
    "Rejected",
    "TLS",
    "Unavailable",
    "Watch",
]
