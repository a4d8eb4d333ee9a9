"""Where the sidecar is and how to reach it: its default address, the gRPC methods and
channel options, the metadata of every call, and what a failed plain connect to its
address says (so a new session fails at once or waits: `wait_after_refusal`). No I/O."""

from __future__ import annotations

import logging
import os
import socket
from typing import Any, List, Optional, Tuple

import grpc

from lockside._errors import Unavailable

log = logging.getLogger("lockside")

#: Where clients find the sidecar unless told otherwise (the sidecar's default).
DEFAULT_ADDR = "127.0.0.1:7420"

LEASE_METHOD = "/lockside.v1.LockService/Lease"
#: The request metadata that resumes a session (`SessionStarted.resume_token`).
RESUME_HEADER = "lockside-resume"
DESCRIBE_METHOD = "/lockside.v1.LockService/Describe"
WATCH_METHOD = "/lockside.v1.LockService/Watch"

#: The longest holder value the sidecar accepts (`Acquire.value`, `Proclaim.value`).
MAX_VALUE_BYTES = 4096

#: HTTP/2 keepalive well below the lock TTL (README, "Client guidance"): a frozen or
#: unreachable sidecar is noticed in about 2 s and the stream fails, which suspends
#: every lock of the session before the store lets it go, for a TTL of 3 s or more (a
#: frozen sidecar renews nothing: its locks expire 2/3 of a TTL after it froze at the
#: earliest).
KEEPALIVE_OPTIONS: List[Tuple[str, Any]] = [
    ("grpc.keepalive_time_ms", 1000),
    ("grpc.keepalive_timeout_ms", 1000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # gRPC core closes a connection on an unanswered PING after this, and with grpcio
    # 1.85 it is what governs keepalive pings too: without it a SIGSTOPped sidecar went
    # unnoticed for 10 s; with it the stream failed 1.5 s after the freeze.
    ("grpc.http2.ping_timeout_ms", 1000),
    # The sidecar is local: after it restarts, reconnect within a second rather than
    # after gRPC's default backoff (up to 120 s). Calls wait for the connection
    # (`wait_for_ready`), bounded by the client's `connect_timeout`.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


def default_addr() -> str:
    """$LOCKSIDE_ADDR, else 127.0.0.1:7420."""
    return os.environ.get("LOCKSIDE_ADDR") or DEFAULT_ADDR


def channel_target(addr: str) -> str:
    """A gRPC target from what users write: `host:port`, `unix:/path`, or an
    `http://host:port` URL as the sidecar's own CLI accepts."""
    if addr.startswith("http://"):
        return addr[len("http://") :].rstrip("/")
    return addr


def call_metadata(
    client_name: Optional[str], auth_token: Optional[str]
) -> Tuple[Tuple[str, str], ...]:
    """The metadata of every call: who the client is, and its token."""
    md: List[Tuple[str, str]] = []
    if client_name:
        md.append(("lockside-client-name", client_name))
    if auth_token:
        md.append(("authorization", f"Bearer {auth_token}"))
    return tuple(md)


def dial_address(addr: str) -> Optional[Tuple[str, Any]]:
    """Where a plain socket finds the sidecar of `addr`: ("unix", path) or ("tcp",
    (host, port)); None for targets this cannot tell (then gRPC's own wait decides)."""
    target = channel_target(addr)
    if target.startswith("unix:"):
        path = target[len("unix:") :]
        return ("unix", path[2:] if path.startswith("//") else path)
    if target.startswith("unix-abstract:"):
        return ("unix", "\0" + target[len("unix-abstract:") :])
    if target.startswith("dns:///"):
        target = target[len("dns:///") :]
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not host or "/" in host:
        return None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        return None
    return ("tcp", (host, int(port)))


def refusal(e: OSError) -> Optional[str]:
    """Why a plain connect to the sidecar's address failed, when it shows that nothing
    listens there; None when it does not tell (a timeout: something may be slow)."""
    if isinstance(e, ConnectionRefusedError):
        return "connection refused (nothing listens there)"
    if isinstance(e, FileNotFoundError):
        return "no such socket file"
    if isinstance(e, (TimeoutError, socket.timeout)):  # (one class since 3.10)
        return None
    return e.strerror or str(e)


def wait_after_refusal(
    addr: str, cause: Optional[str], wait_for_sidecar: float, connect_timeout: float
) -> float:
    """A new session's first stream failed at once (UNAVAILABLE, not waiting for the
    connection) and `cause` is why a plain connect to `addr` failed (None: something
    listens there, say a sidecar that just restarted while gRPC backs off). Returns how
    long to wait for the sidecar now, or raises `Unavailable` naming the address and
    the cause when the caller did not ask to wait (`wait_for_sidecar`)."""
    if cause is None:
        return max(connect_timeout, wait_for_sidecar)
    if wait_for_sidecar > 0:
        log.warning(
            "no sidecar at %s yet (%s): waiting up to %gs for it", addr, cause, wait_for_sidecar
        )
        return wait_for_sidecar
    raise Unavailable(
        f"no sidecar at {addr}: {cause}; start it first, or let the client wait for it "
        "with wait_for_sidecar=SECONDS",
        grpc.StatusCode.UNAVAILABLE,
    )
