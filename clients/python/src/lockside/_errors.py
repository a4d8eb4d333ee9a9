"""The errors this package raises, and how the core's failures become them."""

from __future__ import annotations

from typing import Any, Optional

#: The google.rpc code names, by number.
_CODE_NAMES = {
    0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND", 6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION", 10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED",
    13: "INTERNAL", 14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}


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
        self.code_name = _CODE_NAMES.get(code, "UNKNOWN_CODE")
        self.message = message
        super().__init__(f"request for {_short(key)} rejected: {self.code_name} ({code}): {message}")


class LockLost(LocksideError):
    """The lock was lost while held: the sidecar sent `Lost` (renewals failed) or the
    session's stream broke and the lock did not come back. Raised by `release()` (so by
    leaving a `with` block) when the lock was lost before it: the work done under it
    may have overlapped with another holder; the fencing token protects the resource
    then."""

    def __init__(self, key: str, reason: str, fencing_token: int):
        super().__init__(f"lock {_short(key)} lost: {reason}")
        self.key = key
        self.reason = reason
        self.fencing_token = fencing_token


class Unavailable(LocksideError):
    """The sidecar could not be reached, or the session's stream broke before it
    answered (a wait in progress when the stream breaks fails with it: the sidecar
    does not resume waits). `code` is the gRPC status number when there was one."""

    def __init__(self, message: str, code: Optional[int] = None):
        super().__init__(message)
        self.code = code


def from_failure(f: BaseException, key: str = "") -> LocksideError:
    """The core's `Failure(kind, message, code, reason)` as this package's error."""
    kind, message, code, reason = _args(f)
    if kind == "not_acquired":
        return NotAcquired(key, reason)
    if kind == "rejected":
        return Rejected(key, code, message)
    if kind == "no_sidecar":
        return Unavailable(
            f"no sidecar at {message}: {reason}; start it first, or let the client wait "
            "for it with wait_for_sidecar=SECONDS",
            14,
        )
    if kind == "unavailable":
        return Unavailable(message, code)
    return LocksideError(message or kind)


def _args(f: Any) -> Any:
    args = getattr(f, "args", f)
    if len(args) == 1 and isinstance(args[0], tuple):
        args = args[0]
    return args
