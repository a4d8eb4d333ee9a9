"""The errors this package raises, and how failed gRPC calls become them."""

from __future__ import annotations

from typing import Optional, Tuple

import grpc


class LocksideError(Exception):
    """Base class of every error this package raises."""


def _short(key: str) -> str:
    """A key as messages show it: a bad 100 KB key is not repeated in full."""
    return repr(key) if len(key) <= 80 else f"{key[:60]!r}... ({len(key)} characters)"


class NotAcquired(LocksideError):
    """The lock was not acquired: `reason` is "BUSY" (held and `wait=0`), "TIMEOUT"
    (still held when `wait` ran out) or "CANCELLED"."""

    def __init__(self, key: str, reason: str):
        super().__init__(f"lock {_short(key)} not acquired: {reason}")
        self.key = key
        self.reason = reason


class Rejected(LocksideError):
    """The sidecar refused a request: a bad value (`code` 3 INVALID_ARGUMENT), a limit
    reached (8 RESOURCE_EXHAUSTED), a conflicting mode or limit (9 FAILED_PRECONDITION),
    or a store it cannot reach (14 UNAVAILABLE). The session and its other locks go on.
    """

    def __init__(self, key: str, code: int, message: str):
        self.key = key
        self.code = code
        self.code_name = _code_name(code)
        self.message = message
        super().__init__(f"request for {_short(key)} rejected: {self.code_name} ({code}): {message}")


class LockLost(LocksideError):
    """The lock was lost while held: the sidecar sent `Lost` (renewals failed) or the
    session's stream broke. Raised by `release()` (so by leaving a `with` block) when
    the lock was lost before it: the work done under it may have overlapped with
    another holder; the fencing token is what protects the resource then."""

    def __init__(self, key: str, reason: str, fencing_token: int):
        super().__init__(f"lock {_short(key)} lost: {reason}")
        self.key = key
        self.reason = reason
        self.fencing_token = fencing_token


class Unavailable(LocksideError):
    """The sidecar could not be reached, or the session's stream broke before it
    answered (a wait in progress when the stream breaks fails with it: the sidecar
    does not resume waits). `code` is the gRPC status of the stream when there was
    one."""

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None):
        super().__init__(message)
        self.code = code


_STATUS_CODES = {s.value[0]: s for s in grpc.StatusCode}


def _code_name(code: int) -> str:
    status = _STATUS_CODES.get(code)
    return status.name if status is not None else "UNKNOWN_CODE"


def rpc_error_text(e: BaseException) -> Tuple[str, Optional[grpc.StatusCode]]:
    """A short description of a failed stream or call, and its status code."""
    if isinstance(e, grpc.RpcError) and hasattr(e, "code"):
        code = e.code()
        details = e.details() if hasattr(e, "details") else ""
        return f"{code.name}: {details}", code
    return f"{type(e).__name__}: {e}", None


def status_code(number: int) -> Optional[grpc.StatusCode]:
    """The `grpc.StatusCode` of a status number (None for an unknown one)."""
    return _STATUS_CODES.get(number)


def call_error(key: str, e: grpc.RpcError) -> LocksideError:
    """A failed unary call (Describe) as this package's error."""
    text, code = rpc_error_text(e)
    if code is None or code in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
    ):
        return Unavailable(text, code)
    return Rejected(key, code.value[0], e.details() or "")
