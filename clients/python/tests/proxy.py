"""A TCP proxy for the tests, between a client and its sidecar, that can reset every
connection it carries while both ends stay alive (TESTING.md, "Faults that work on
these machines"). It runs on an asyncio loop in a thread of its own, so sync and async
tests use it alike."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from typing import Any, Coroutine, Set, Tuple


def _abort(writer: asyncio.StreamWriter) -> None:
    """Closes the connection with a reset (RST), not a FIN: SO_LINGER 0, then abort."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass  # already closed
    writer.transport.abort()


class Proxy:
    """Listens on a free port of 127.0.0.1 (`addr`) and carries each connection to
    `upstream` (`host:port`) and back. `reset()` resets every open connection, both
    ways; new connections are carried as before."""

    def __init__(self, upstream: str):
        host, port = upstream.rsplit(":", 1)
        self._upstream = (host, int(port))
        self._pairs: Set[Tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server = self._run(self._listen())
        self.addr = "127.0.0.1:%d" % self._server.sockets[0].getsockname()[1]

    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    async def _listen(self) -> asyncio.AbstractServer:
        return await asyncio.start_server(self._carry, "127.0.0.1", 0)

    async def _carry(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        except OSError:
            _abort(writer)
            return
        pair = (writer, up_writer)
        self._pairs.add(pair)
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            self._pairs.discard(pair)
            writer.close()
            up_writer.close()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()  # pass a half-close on
        except (ConnectionError, OSError, RuntimeError):
            pass  # reset (by us or by an end)

    def reset(self) -> int:
        """Resets every connection open now, both ways; returns how many there were."""
        return self._run(self._reset())

    async def _reset(self) -> int:
        pairs, self._pairs = self._pairs, set()
        for client_side, upstream_side in pairs:
            _abort(client_side)
            _abort(upstream_side)
        return len(pairs)

    def close(self) -> None:
        async def close() -> None:
            self._server.close()
            await self._reset()
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        self._run(close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
