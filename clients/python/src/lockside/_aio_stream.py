"""A `Lease` stream on grpc.aio, as the asyncio client's session uses it: written and
read on the event loop without a Task per message (`_AioStream`)."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Callable, Coroutine, List, Optional, Tuple

import grpc
import grpc.aio

from lockside._fastpath import aio_call_ops


def _advance(coro: Coroutine[Any, Any, Any]) -> Tuple[Optional["asyncio.Future[Any]"], Any]:
    """Runs `coro` on until it waits: returns the future it waits on and None, or None
    and its result once it ended; raises what it raises.

    This is what an asyncio Task does on each step, without the Task: the stream's
    operations are coroutines of grpc.aio that only wait on futures, and stepping them
    from those futures' callbacks spares a Task, its wake-ups and the coroutines
    between (see `_AioStream`)."""
    loop: Optional[asyncio.AbstractEventLoop] = None
    while True:
        try:
            waited = coro.send(None)
        except StopIteration as e:
            return None, e.value
        if waited is None:  # a bare yield (asyncio.sleep(0)): step again next round
            if loop is None:
                loop = asyncio.get_running_loop()
            waited = loop.create_future()
            loop.call_soon(waited.set_result, None)
            return waited, None
        if not waited.done():
            waited._asyncio_future_blocking = False  # as Task does once it takes it
            return waited, None


class _AioStream:
    """One `Lease` stream as the session uses it, driven on the event loop without a
    Task per message: what the client adds to grpc.aio's own write/read cycle.

    Reads: one receive is always pending; its future's callback parses nothing and
    hands the raw message to `on_message`, then starts the next receive. `run()` waits
    for the end and raises as the stream ended (grpc.aio's public `read` says how).

    Sends do not wait: `send` starts the message at once (gRPC allows one in flight;
    later ones queue and go when it completes). The answer to a request proves its
    message left, so a send's completion is only collected when the next send starts,
    and costs no wake-up of its own unless messages queue behind it.

    On grpc.aio's private call layer (`_fastpath.aio_call_ops`: what `call.write` and
    `call.read` end in) the messages skip two coroutines each way; without it (another
    grpcio, or `fast` False) the public `write`/`read` are stepped alike.
    """

    def __init__(self, call: Any, on_message: Callable[[bytes], None], fast: bool = True):
        self.call = call
        self._on_message = on_message
        self._loop = asyncio.get_running_loop()
        ops = aio_call_ops(call) if fast else None
        self.fast = ops is not None
        self._send_op: Callable[[bytes], Any] = call.write if ops is None else ops[0]
        self._recv_op: Callable[[], Any] = call.read if ops is None else ops[1]
        # The send last started and the future it waits on, until collected: that
        # future done means the send completed (gRPC allows one send in flight).
        self._sending: Optional[Coroutine[Any, Any, Any]] = None
        self._sent: Optional["asyncio.Future[Any]"] = None
        self._queued: "deque[bytes]" = deque()
        self._watching = False  # `_on_sent` is to be called (see `_watch`)
        self._drained: "List[asyncio.Future[None]]" = []  # set when the queue is empty
        self._over = False  # no more sends: the stream broke or was half-closed
        self._reading: Optional[Coroutine[Any, Any, Any]] = None
        self._ended: "Optional[asyncio.Future[Optional[BaseException]]]" = None

    # -- sending ---------------------------------------------------------------

    def send(self, data: bytes) -> None:
        """Starts sending `data`, or queues it behind the send in flight. A failed send
        is dropped: the stream broke, and the reader sees how."""
        if self._over:
            return
        if self._queued or self._busy():
            self._queued.append(data)
            self._watch()
            return
        self._start(data)

    def _busy(self) -> bool:
        """A send is in flight (not merely uncollected)."""
        return self._sent is not None and not self._sent.done()

    def _start(self, data: bytes) -> None:
        done = self._sending  # completed (not `_busy`), its coroutine not at its end
        self._sending = self._sent = None
        coro = self._send_op(data)
        try:
            sent, _ = _advance(coro)
        except Exception:  # noqa: BLE001 - the stream broke: the reader sees it
            sent = None
            self._over = True
        if sent is not None:
            self._sending, self._sent = coro, sent
        if done is not None:
            # After the new send started: the answer it asks for does not wait on it.
            self._finish(done)

    def _finish(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Steps a completed send's coroutine to its end (grpc.aio frees the message
        there, and a failed send's error is retrieved rather than logged)."""
        try:
            waited, _ = _advance(coro)
        except Exception:  # noqa: BLE001 - the send failed: the stream broke
            self._over = True
            return
        if waited is not None:  # the public write waits for the call's status: failed
            coro.close()
            self._over = True

    def _watch(self) -> None:
        """Has `_on_sent` called once the send in flight completes."""
        if self._watching:
            return
        self._watching = True
        if self._sent is None:
            self._loop.call_soon(self._on_sent, None)
        else:
            self._sent.add_done_callback(self._on_sent)

    def _on_sent(self, _: Any) -> None:
        """Starts the queued sends in their order, one at a time; collects the last."""
        self._watching = False
        while self._queued and not self._over and not self._busy():
            self._start(self._queued.popleft())
        if self._over:
            self._queued.clear()
        if self._queued or self._busy():
            self._watch()
        elif self._sending is not None:
            done, self._sending, self._sent = self._sending, None, None
            self._finish(done)
        waiters, self._drained = self._drained, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def close_sending(self) -> None:
        """Half-closes the stream once what was sent before it has gone."""
        while not self._over and (self._queued or self._busy()):
            drained = self._loop.create_future()
            self._drained.append(drained)
            self._watch()
            await drained  # (not a send's own future: a cancel here must not reach it)
        if self._over:
            return
        if self._sending is not None:
            done, self._sending, self._sent = self._sending, None, None
            self._finish(done)
        self._over = True
        try:
            await self.call.done_writing()
        except (grpc.RpcError, asyncio.InvalidStateError):
            pass

    # -- reading ---------------------------------------------------------------

    async def run(self) -> None:
        """Reads the stream until it ends; raises as grpc.aio's `read` does then
        (`grpc.RpcError`, `asyncio.CancelledError` when cancelled here), and what
        `on_message` raised."""
        self._ended = ended = self._loop.create_future()
        self._receive()
        error = await ended
        if error is not None:
            raise error
        # The end: grpc.aio's public read raises unless the status is OK.
        while True:
            data = await self.call.read()
            if data is grpc.aio.EOF:
                return
            self._on_message(data)

    def _receive(self) -> None:
        """Starts the next receive (and takes the messages that are there at once)."""
        while self._step(self._recv_op()):
            pass

    def _on_received(self, _: Any) -> None:
        coro = self._reading
        if coro is not None and self._step(coro):
            self._receive()

    def _step(self, coro: Coroutine[Any, Any, Any]) -> bool:
        """Steps a receive on; True when it gave a message and the next is to start."""
        self._reading = None
        try:
            waited, data = _advance(coro)
        except (Exception, asyncio.CancelledError) as e:  # handed to `run`
            self._end(e)
            return False
        if waited is not None:
            self._reading = coro
            waited.add_done_callback(self._on_received)
            return False
        return self._got(data)

    def _got(self, data: Any) -> bool:
        """One message read (or the end); True to read on."""
        if data is grpc.aio.EOF:
            self._end(None)
            return False
        try:
            self._on_message(data)
        except Exception as e:  # noqa: BLE001 - a bad message ends the stream
            self._end(e)
            return False
        return True

    def _end(self, error: Optional[BaseException]) -> None:
        self._reading = None
        self._over = True
        if self._sent is not None or self._drained:
            self._watch()  # collects the last send, wakes `close_sending`
        if self._ended is not None and not self._ended.done():
            self._ended.set_result(error)
