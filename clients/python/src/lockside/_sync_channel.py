"""The sync client's channel and what outlives a client (no session here): `_Conn`,
the channel made on a client's first use; the thread that ends the sessions of
clients garbage-collected without `close()` (`_collected`); every client, handed a
session of its own in a forked child; and the plain connect that says whether
anything listens at the sidecar's address (`_probe`)."""

from __future__ import annotations

import os
import queue
import socket
import threading
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Optional

import grpc

from lockside._client import ClientBase
from lockside._sidecar import log, refusal
from lockside._stream import _Stream

if TYPE_CHECKING:
    from lockside._sync import Client


class _Conn:
    """A client's channel, and what its finalizer needs to end its session: the
    session's stream and reader thread. It refers to neither the client nor the
    session, so it keeps neither alive (see `Client`)."""

    def __init__(self, client: "ClientBase[Any]"):
        self.addr = client.addr
        self.pid = os.getpid()
        # (`raw_lease`: for `_IteratorStream`; the fast stream takes the channel)
        self.channel, self.raw_lease, self.describe, self.watch = client._make_channel(grpc)
        self.stream: Optional[_Stream] = None  # the open session's
        self.reader: Optional[threading.Thread] = None

    def shutdown(self) -> None:
        """Ends the session (a half-close: the sidecar releases every lock and ends
        the stream) and closes the channel; for a client nobody closed (`_closer`)."""
        stream, reader = self.stream, self.reader
        if stream is not None:
            stream.close_sending()
            if reader is not None:
                reader.join(2.0)
                if reader.is_alive():
                    stream.cancel()
                    reader.join(2.0)
        self.channel.close()


def _collected(conn: _Conn) -> None:
    """A `Client` was garbage-collected without `close()`: warn, and have its session
    ended (on `_closer`'s thread: this runs wherever the collector happens to run,
    perhaps inside one of this package's critical sections)."""
    if conn.pid != os.getpid():
        return  # the parent's, in a forked child: never touched here
    if conn.stream is not None:
        warnings.warn(
            f"lockside.Client({conn.addr!r}) was garbage-collected without close(): its "
            "session ends now and the sidecar releases its locks",
            ResourceWarning,
            stacklevel=2,
        )
    _closer.put(conn)


_closer: "queue.SimpleQueue[_Conn]" = queue.SimpleQueue()  # reentrant: a finalizer may put
_closer_thread: Optional[threading.Thread] = None
_closer_mu = threading.Lock()


def _closing() -> None:
    while True:
        conn = _closer.get()
        if conn.pid != os.getpid():
            continue  # queued in the parent before a fork: the parent's to end
        try:
            conn.shutdown()
        except Exception as e:  # noqa: BLE001 - one client's end must not stop the others'
            log.warning("ending the session of a collected client: %s", e)


def _start_closer() -> None:
    """Starts the thread that ends collected clients' sessions (once per process)."""
    global _closer_thread
    with _closer_mu:
        if _closer_thread is None or not _closer_thread.is_alive():
            _closer_thread = threading.Thread(target=_closing, name="lockside-closer", daemon=True)
            _closer_thread.start()


# -- fork() ----------------------------------------------------------------------------

#: Every client: a forked child gives each a session of its own (`Client._after_fork`);
#: `_fastpath.py` keeps gRPC sound across the fork itself.
_clients: "weakref.WeakSet[Client]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    global _closer, _closer_mu, _closer_thread
    _closer, _closer_mu, _closer_thread = queue.SimpleQueue(), threading.Lock(), None
    for client in list(_clients):
        client._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _probe(kind: str, address: Any) -> Optional[str]:
    """Why nothing listens at the sidecar's address (`dial_address`: "unix" or "tcp",
    and where), when a plain connect fails; None when something does or this cannot
    tell (see `wait_after_refusal`)."""
    try:
        if kind == "unix":
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(1.0)
                s.connect(address)
        else:
            socket.create_connection(address, timeout=1.0).close()
    except OSError as e:
        return refusal(e)
    return None
