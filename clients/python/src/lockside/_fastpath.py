"""What the package does below grpcio's public API, for speed; each has a fallback on
the public API, used by itself when a grpcio release changes what this reaches (the
tests run both):

- `_SegregatedStream`: the sync client's `Lease` stream on a grpcio "segregated call"
  (grpcio's private `cygrpc` layer), and how a fork() keeps gRPC's state sound around
  its reader (`_before_fork`). Fallback: `_stream._IteratorStream`.
- `aio_call_ops`: the send and receive of serialized messages on grpc.aio's call layer
  (`call._cython_call`), which `_aio_stream._AioStream` steps. Fallback: the call's
  public `write`/`read`.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import deque
from typing import Any, Callable, List, Optional, Tuple

try:  # grpcio's private layer, for `_SegregatedStream`; the public API without it
    from grpc._cython import cygrpc
except ImportError:  # pragma: no cover - every grpcio has it today
    cygrpc = None

from lockside._errors import status_code
from lockside._sidecar import LEASE_METHOD, log
from lockside._stream import _Stream, inherited

#: Whether grpcio's private call layer is there at all (`_SegregatedStream` needs it).
HAVE_CYGRPC = cygrpc is not None


# Tags of the operations a _SegregatedStream starts.
_STATUS, _METADATA, _RECV, _SEND, _HALF_CLOSE = "status", "metadata", "recv", "send", "close"


class _SegregatedStream(_Stream):
    """The stream on a grpcio "segregated call": the call's own completion queue,
    polled by the session's reader thread (`read`), while callers start sends
    directly (`send`). It is what grpcio itself uses for blocking calls, reached
    through its private `cygrpc` layer; measured on one cycle (acquire, release) it
    saves the two thread hand-offs of the public API (the request iterator's thread
    and grpcio's channel thread): 700 against 930 µs. `_sync_session._open_stream`
    falls back to `_IteratorStream` if a grpcio release changes it.

    grpc core allows one send in flight: a send while one is in flight is queued and
    started by the reader when the first completes. The call's completion queue is
    destroyed by grpcio once no operation is due, so every operation is started and
    counted under `_mu`, and `read` stops polling when the count reaches zero.

    fork(): gRPC's own fork handlers reset its state in the child only when no thread
    is inside gRPC at that moment; the reader polls the call's queue all the time, so
    `park` (before the fork) takes it out and `unpark` (after, in the parent) lets it
    go on. See `_before_fork`.
    """

    def __init__(self, channel: Any, metadata: Tuple[Any, ...], wait_for_ready: bool):
        flags = cygrpc.InitialMetadataFlags.wait_for_ready_explicitly_set
        if wait_for_ready:
            flags |= cygrpc.InitialMetadataFlags.wait_for_ready
        operations = (
            (
                (
                    cygrpc.SendInitialMetadataOperation(metadata, flags),
                    cygrpc.ReceiveStatusOnClientOperation(0),
                ),
                _STATUS,
            ),
            ((cygrpc.ReceiveInitialMetadataOperation(0),), _METADATA),
        )
        self._mu = threading.Lock()
        self._parked = threading.Condition(self._mu)  # notified when polling stops
        self._parking = False  # a fork() is under way: do not poll
        self._polling = False  # the reader is inside gRPC, waiting for the next event
        self._sending = False
        self._queued: "deque[bytes]" = deque()
        self._close_after_send = False
        self._over = False
        self._call = channel._channel.segregated_call(
            cygrpc.PropagationConstants.GRPC_PROPAGATE_DEFAULTS,
            LEASE_METHOD.encode(),
            None,
            None,
            metadata,
            None,
            operations,
            None,
            None,
        )
        self._due = 2
        with self._mu:
            self._start((cygrpc.ReceiveMessageOperation(0),), _RECV)
        _streams.add(self)

    def _start(self, operations: Tuple[Any, ...], tag: str) -> bool:
        """Starts operations on the call (`_mu` held); False when the call is over."""
        try:
            started = self._call.operate(operations, tag)
        except ValueError:  # grpc core refused the batch: the call is unusable
            started = False
        if started:
            self._due += 1
        else:
            self._over = True
        return bool(started)

    def send(self, data: bytes) -> bool:
        with self._mu:
            if self._over:
                return False
            if self._sending:
                self._queued.append(data)
                return True
            self._sending = True
            return self._start((cygrpc.SendMessageOperation(data, 0),), _SEND)

    def read(self) -> Optional[bytes]:
        while True:
            with self._mu:
                if self._due == 0:
                    self._over = True
                    return None
                while self._parking:
                    self._parked.wait()
                self._polling = True
            event = self._call.next_event()
            tag = event.tag
            with self._mu:
                self._polling = False
                if self._parking:
                    self._parked.notify_all()
                self._due -= 1
                if tag == _RECV:
                    message: Optional[bytes] = event.batch_operations[0].message()
                    if message is not None:
                        self._start((cygrpc.ReceiveMessageOperation(0),), _RECV)
                        return message
                elif tag == _SEND:
                    if event.success and self._queued:
                        data = self._queued.popleft()
                        self._start((cygrpc.SendMessageOperation(data, 0),), _SEND)
                    else:
                        self._sending = False
                        self._queued.clear()
                        if self._close_after_send and event.success:
                            self._start((cygrpc.SendCloseFromClientOperation(0),), _HALF_CLOSE)
                elif tag == _STATUS:
                    for op in event.batch_operations:
                        if isinstance(op, cygrpc.ReceiveStatusOnClientOperation):
                            details = op.details()
                            if isinstance(details, bytes):
                                details = details.decode("utf-8", "replace")
                            self.status = (status_code(op.code()), details or "")
                    self._over = True

    def close_sending(self) -> None:
        with self._mu:
            if self._over:
                return
            if self._sending:
                self._close_after_send = True
            else:
                self._start((cygrpc.SendCloseFromClientOperation(0),), _HALF_CLOSE)

    def cancel(self) -> None:
        try:
            self._call.cancel(cygrpc.StatusCode.cancelled, "cancelled by the client")
        except ValueError:
            pass  # over already

    def park(self, timeout: float) -> bool:
        """Before fork(): keeps the reader out of gRPC until `unpark`; True once it
        is out. A reader waiting for the next event is woken by a send that completes
        at once: an empty `LeaseRequest` (the sidecar answers it `Rejected` with
        request_id 0, which no request waits for) unless a send is in flight already."""
        with self._mu:
            self._parking = True
            if not self._polling:
                return True
            if not self._sending and not self._over:
                self._sending = True
                self._start((cygrpc.SendMessageOperation(b"", 0),), _SEND)
            return self._parked.wait_for(lambda: not self._polling, timeout)

    def unpark(self) -> None:
        with self._mu:
            self._parking = False
            self._parked.notify_all()


# -- fork() ----------------------------------------------------------------------------

#: Every live fast stream: parked across a fork() (`_SegregatedStream.park`).
_streams: "weakref.WeakSet[_SegregatedStream]" = weakref.WeakSet()
_parked: List[_SegregatedStream] = []

#: How long a fork() waits for a session's reader to step out of gRPC.
PARK_TIMEOUT = 1.0


def _before_fork() -> None:
    """Takes every session's reader out of gRPC (they all poll it while idle) so that
    gRPC's own fork handlers can run: they reset gRPC's state in the child, where a
    new channel then works. Without this they are skipped ("Other threads are
    currently calling into gRPC, skipping fork() handlers"), and with the package
    before this a child's first call failed or aborted in gRPC's poller one fork in
    four to six."""
    for stream in list(_streams):
        _parked.append(stream)
        if not stream.park(PARK_TIMEOUT):
            log.warning(
                "fork(): a lockside session's reader did not leave gRPC within %gs; "
                "gRPC in the child may not work",
                PARK_TIMEOUT,
            )


def _after_fork_in_parent() -> None:
    parked, _parked[:] = list(_parked), []
    for stream in parked:
        stream.unpark()


def _after_fork_in_child() -> None:
    global _streams
    inherited.extend(_parked)
    _parked[:] = []
    inherited.extend(_streams)
    _streams = weakref.WeakSet()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )


# -- grpc.aio ----------------------------------------------------------------------------


def aio_call_ops(
    call: Any,
) -> Optional[Tuple[Callable[[bytes], Any], Callable[[], Any]]]:
    """The send and receive operations of grpc.aio's call layer under `call`
    (`call._cython_call`, what `call.write` and `call.read` end in), or None when this
    grpcio has no such layer: then `_AioStream` steps the public `write`/`read`."""
    cy = getattr(call, "_cython_call", None)
    if cy is None:
        return None
    send = getattr(cy, "send_serialized_message", None)
    receive = getattr(cy, "receive_serialized_message", None)
    if send is None or receive is None:
        return None
    return send, receive
