"""Lockside: distributed locks held by a live gRPC stream to the sidecar in your pod.

    from lockside import Client, NotAcquired

    with Client() as c:                                   # $LOCKSIDE_ADDR or 127.0.0.1:7420
        with c.lock("orders", wait=5.0, ttl=10.0) as lock:
            for batch in batches:
                if lock.suspended.is_set() and not lock.wait_restored():
                    break                                 # lost: stop using the resource
                write(batch, fencing_token=lock.fencing_token)

`AsyncClient` is the same on asyncio (grpc.aio). One client is one session (one `Lease`
stream) holding any number of locks; the sidecar releases them all when the stream
ends, whatever ends it. When the stream breaks (a reset connection, a frozen or dead
sidecar), every lock is suspended at once (`lock.suspended` set: stop using it) while
the client resumes the session; a lock the resumed session lists is restored
(`suspended` cleared), any other is lost (`lock.lost` set).

Leader election: `c.campaign(key, value)` returns once this client leads (a `Lock`:
`proclaim(value)` changes what followers see, `release()` resigns); followers iterate
`c.watch(key)` and read `state.leader` (None while nobody leads).
"""

# Layout. Decisions are made without I/O in base classes that both clients share;
# the sync and asyncio modules keep only the sending, reading and waiting (as httpx's
# BaseClient, Client and AsyncClient).
#   _client.py        ClientBase: options, the channel and its calls, lock(), campaign(),
#                     the closed check, whether a new session waits for its sidecar
#   _core.py          SessionBase: requests and their timeouts, answers routed, holders'
#                     grants, Lost and Jeopardy, release and proclaim checks, the end
#   _resume.py        Resuming, SessionBase's base: a broken stream suspends every lock,
#                     loses each at its time, and the session resumes or ends
#   _greeting.py      a resume attempt's greeting, and the holds reconciled with it
#   _lock.py          LockBase: one lock's states    _holders.py  thread and task holders
#   _describe.py      the store's view of a key, WatchBase
#   _wire.py          requests encoded by hand        _errors.py   the errors
#   _sidecar.py       the address, methods, channel options, refusals of a plain connect
#   _sync.py          Client, Watch
#   _sync_session.py  Lock; the sync session's I/O: reader thread, resume attempts, waits
#   _sync_channel.py  the sync channel; ending collected clients; clients across fork()
#   _stream.py        the sync Lease stream as a session uses it; grpcio's public API
#   _aio.py           AsyncClient, AsyncWatch, what AsyncClient.lock() returns
#   _aio_session.py   AsyncLock; the asyncio session's I/O: reader task, resumes, watchdog
#   _aio_stream.py    the Lease stream on grpc.aio, stepped without a Task per message
#   _fastpath.py      below grpcio's public API, for speed (each with a fallback): the
#                     sync stream on a segregated call, and grpc.aio's call layer
#   _pb/              the generated stubs, made while the wheel is built (hatch_build.py)

from lockside._aio import AsyncClient, AsyncWatch
from lockside._aio_session import AsyncLock
from lockside._describe import Description, Holder, QueueEntry
from lockside._errors import LocksideError, LockLost, NotAcquired, Rejected, Unavailable
from lockside._sidecar import DEFAULT_ADDR
from lockside._sync import Client, Watch
from lockside._sync_session import Lock

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "AsyncLock",
    "AsyncWatch",
    "Client",
    "DEFAULT_ADDR",
    "Description",
    "Holder",
    "Lock",
    "LockLost",
    "LocksideError",
    "NotAcquired",
    "QueueEntry",
    "Rejected",
    "Unavailable",
    "Watch",
]
