"""What `Client` and `AsyncClient` share, without I/O (`ClientBase`): their options,
the channel they make and its calls, `lock()` and `campaign()` (the subclass takes the
lock), the session's id, the closed check, and whether a new session that found no
sidecar fails or waits for one."""

from __future__ import annotations

from typing import Any, Dict, Generic, NamedTuple, Optional, Sequence, Tuple, TypeVar

import grpc

from lockside._core import Options, SessionBase
from lockside._errors import LocksideError, Unavailable
from lockside._pb import lockside_pb2 as pb
from lockside._sidecar import (
    DESCRIBE_METHOD,
    KEEPALIVE_OPTIONS,
    LEASE_METHOD,
    WATCH_METHOD,
    call_metadata,
    channel_target,
    default_addr,
    wait_after_refusal,
)

#: What `lock()` and `campaign()` return: the held `Lock` (`Client`), or what awaits
#: the `AsyncLock` (`AsyncClient`).
Taken = TypeVar("Taken")


class Channel(NamedTuple):
    """A channel to the sidecar and its calls: `lease` in raw bytes both ways (the
    session encodes and decodes), `describe` and `watch` in messages."""

    channel: Any
    lease: Any
    describe: Any
    watch: Any


class ClientBase(Generic[Taken]):
    """A connection to a Lockside sidecar and one session on it, as both clients see
    it; `Client` and `AsyncClient` add the channel, the session and the waiting."""

    _sess: Optional[SessionBase[Any, Any]]

    def __init__(
        self,
        addr: Optional[str] = None,
        *,
        client_name: Optional[str] = None,
        auth_token: Optional[str] = None,
        credentials: Optional[grpc.ChannelCredentials] = None,
        options: Sequence[Tuple[str, Any]] = (),
        connect_timeout: float = 10.0,
        resume: bool = True,
        wait_for_sidecar: float = 0.0,
    ):
        self.addr = addr or default_addr()
        self.connect_timeout = connect_timeout
        self.resume = resume
        self.wait_for_sidecar = wait_for_sidecar
        self._credentials = credentials
        self._options = KEEPALIVE_OPTIONS + list(options)
        self._metadata = call_metadata(client_name, auth_token)
        self._sess = None
        self._closed = False
        self._setup()

    def _setup(self) -> None:
        """The subclass's own state (its channel is made on first use)."""

    def _take(self, key: str, options: Options, holder: Optional[str]) -> Taken:
        """Takes `key` for `holder` (None: the caller) with `lock()`'s options."""
        raise NotImplementedError

    @property
    def session_id(self) -> Optional[str]:
        """The current session's id (as `describe()` shows it; the same across a
        resume), None before the first lock."""
        s = self._sess
        return s.session_id if s is not None and s.ended is None else None

    def lock(
        self,
        key: str,
        *,
        wait: Optional[float] = None,
        ttl: Optional[float] = None,
        shared: bool = False,
        limit: int = 0,
        fair: bool = False,
        value: "bytes | str" = b"",
        holder: Optional[str] = None,
    ) -> Taken:
        """Takes `key` for the caller. `Client`: for the calling thread, and returns the
        held `Lock` (also a context manager). `AsyncClient`: for the calling task;
        `await c.lock(...)` returns the `AsyncLock`, `async with c.lock(...) as lock`
        releases it on exit, and it is a coroutine too
        (`asyncio.create_task(c.lock(...))`); cancelling the awaiting task cancels the
        wait. Threads (tasks) sharing a client exclude each other; one locking a key it
        holds re-enters it.

        wait:   seconds to wait while the key is busy; 0 fails at once; None (the
                default) waits as long as the sidecar allows (24 h).
        ttl:    seconds the store keeps the lock if the sidecar stops renewing it
                (1 s to the sidecar's maximum); None: the sidecar's default (10 s).
        shared: a reader lock: shared holders coexist and exclude exclusive ones.
        limit:  N > 1 makes the key a semaphore of N permits (not with `shared`).
        fair:   wait in arrival order.
        value:  the holder's value, shown by `describe()` and `watch()` (bytes, or
                str in UTF-8; at most 4 KiB). On a key this session already holds, a
                non-empty value replaces the value (as `proclaim`).
        holder: who holds it in the session; None (the default) is the calling
                thread (`thread:N:NAME`) or task (`task:N:NAME`), "" the session
                itself. At most 128 bytes, no control characters. `release()` may
                come from any thread.

        Raises `NotAcquired` (busy, timed out), `Rejected` (a bad value, a conflicting
        mode or limit, the store unreachable), `Unavailable` (no sidecar), and
        `TypeError`/`ValueError` for values that are not numbers of seconds.
        """
        return self._take(key, (wait, ttl, shared, limit, fair, value), holder)

    def campaign(
        self,
        key: str,
        value: "bytes | str" = b"",
        *,
        wait: Optional[float] = None,
        ttl: Optional[float] = None,
        holder: Optional[str] = None,
    ) -> Taken:
        """Campaigns for leadership of `key` with `value` (who you are, where to reach
        you) and returns once this client leads (`AsyncClient`: `await c.campaign(...)`;
        `async with` resigns on exit): the returned lock is leadership. Candidates lead
        in the order they campaigned, across every sidecar of the store (a fair
        EXCLUSIVE lock). Lead while `lock.lost` is not set; `proclaim()` changes the
        value followers see; `release()` (or leaving a `with` block) hands leadership to
        the next candidate. `wait`, `ttl` and `holder` as in `lock()`."""
        return self._take(key, (wait, ttl, False, 0, True, value), holder)

    def _make_channel(self, grpc_api: Any) -> Channel:
        """The client's channel on `grpc_api` (`grpc`, or `grpc.aio`: they make channels
        alike): TLS with `credentials`, else plain; keepalive and the caller's
        options."""
        target = channel_target(self.addr)
        if self._credentials is None:
            channel = grpc_api.insecure_channel(target, options=self._options)
        else:
            channel = grpc_api.secure_channel(target, self._credentials, options=self._options)
        return Channel(
            channel,
            channel.stream_stream(LEASE_METHOD),
            channel.unary_unary(
                DESCRIBE_METHOD,
                request_serializer=pb.DescribeRequest.SerializeToString,
                response_deserializer=pb.DescribeResponse.FromString,
            ),
            channel.unary_stream(
                WATCH_METHOD,
                request_serializer=pb.WatchRequest.SerializeToString,
                response_deserializer=pb.WatchResponse.FromString,
            ),
        )

    def _check_open(self) -> None:
        if self._closed:
            raise LocksideError("the client is closed")

    def _describe_options(self, timeout: float) -> Dict[str, Any]:
        """The options of a Describe call: it waits for the connection, `timeout` at
        most."""
        return {"timeout": timeout, "metadata": self._metadata, "wait_for_ready": True}

    @staticmethod
    def _refused(e: Unavailable) -> None:
        """A new session failed with `e`: raised again unless it failed at once
        (UNAVAILABLE, not waiting for the connection); then a plain connect to the
        address says why (`_sidecar_wait`)."""
        if e.code is not grpc.StatusCode.UNAVAILABLE:
            raise e

    def _sidecar_wait(self, cause: Optional[str]) -> float:
        """How long the second try of a new session waits for the sidecar, `cause`
        being why a plain connect to its address failed (`wait_after_refusal`)."""
        return wait_after_refusal(self.addr, cause, self.wait_for_sidecar, self.connect_timeout)
