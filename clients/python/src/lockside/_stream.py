"""A `Lease` stream on grpcio's threaded API, as the sync client's session uses it:
raw messages in and out. `_Stream` says what the session needs of one;
`_IteratorStream` is grpcio's public API (the fallback; the fast one,
`_SegregatedStream`, is in `_fastpath.py`)."""

from __future__ import annotations

import queue
from typing import Any, List, Optional, Tuple

import grpc

_CLOSE = object()  # ends the request iterator: the stream is half-closed

#: In a forked child, the parent's gRPC objects (its channels, sessions and streams):
#: kept, never used nor destroyed, so nothing of the child reaches the parent's
#: connection.
inherited: List[Any] = []


class _Stream:
    """One `Lease` stream as the session uses it: raw messages in and out.

    `send` never blocks (False when the stream is over); `read` blocks for the next
    message and returns None at the end, `status` then saying how it ended. Only the
    session's reader thread reads.
    """

    status: Tuple[Optional[grpc.StatusCode], str] = (None, "")

    def send(self, data: bytes) -> bool:
        raise NotImplementedError

    def read(self) -> Optional[bytes]:
        raise NotImplementedError

    def close_sending(self) -> None:
        raise NotImplementedError

    def cancel(self) -> None:
        raise NotImplementedError

    def discard(self) -> None:
        """Cancels the stream and reads what is left of it (the reader thread only):
        nothing of the call stays behind."""
        self.cancel()
        while self.read() is not None:
            pass


class _IteratorStream(_Stream):
    """grpcio's public API: a request iterator fed by a queue (grpcio drains it on a
    thread of its own), responses read from the call. The fallback when
    `_SegregatedStream` cannot be used."""

    def __init__(self, lease: Any, metadata: Tuple[Any, ...], wait_for_ready: bool):
        self._requests: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._call = lease(
            iter(self._requests.get, _CLOSE), metadata=metadata, wait_for_ready=wait_for_ready
        )

    def send(self, data: bytes) -> bool:
        self._requests.put(data)
        return True

    def read(self) -> Optional[bytes]:
        try:
            data: bytes = next(self._call)
            return data
        except StopIteration:
            self.status = (grpc.StatusCode.OK, "")
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            details = e.details() if hasattr(e, "details") else str(e)
            self.status = (code, details or "")
        return None

    def close_sending(self) -> None:
        self._requests.put(_CLOSE)

    def cancel(self) -> None:
        self._call.cancel()
        self._requests.put(_CLOSE)  # grpcio's request thread waits on the queue: free it
