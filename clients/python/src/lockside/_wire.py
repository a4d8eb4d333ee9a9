"""The requests of a `Lease` stream, encoded by hand (no I/O, no state).

A `LeaseRequest` is a handful of fields, and building and serializing the generated
message objects was a tenth of the client's own time per cycle. The bytes are the
protobuf encoding of the same message, field for field (tests/test_package.py compares
them with the generated classes' `SerializeToString()`).
"""

from __future__ import annotations

import math
from typing import Any, Optional, Tuple

#: The longest wait the sidecar accepts; `wait=None` asks for it ("wait as long as it
#: takes").
MAX_WAIT = 24 * 3600.0

_ONE_BYTE = [bytes((n,)) for n in range(0x80)]


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _ONE_BYTE[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, data: bytes) -> bytes:
    """A length-delimited field: `tag`, then `data`'s length and `data`."""
    return tag + _varint(len(data)) + data


def _id(request_id: int) -> bytes:
    """Field 1, `request_id` (proto3 leaves out zeros)."""
    return b"\x08" + _varint(request_id) if request_id else b""


def _duration(name: str, value: Any) -> bytes:
    """A `google.protobuf.Duration` of `value` seconds (its encoding)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    if not math.isfinite(value) or not 0 <= value < 2**63:
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    whole = int(value)
    nanos = int(round((value - whole) * 1e9))
    if nanos >= 1_000_000_000:
        whole, nanos = whole + 1, nanos - 1_000_000_000
    out = b""
    if whole:
        out += b"\x08" + _varint(whole)
    if nanos:
        out += b"\x10" + _varint(nanos)
    return out


def _key_bytes(key: Any) -> bytes:
    if not isinstance(key, str):
        raise TypeError(f"key must be a str, not {type(key).__name__}")
    return key.encode("utf-8")  # a lone surrogate: UnicodeEncodeError, a ValueError


def value_bytes(value: Any) -> bytes:
    """A holder value as bytes: `bytes`-like as it is, `str` in UTF-8. (Its size is
    the sidecar's to check: over 4 KiB it answers `Rejected` INVALID_ARGUMENT.)"""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"value must be bytes or str, not {type(value).__name__}")


def _holder_bytes(holder: Any) -> bytes:
    if not isinstance(holder, str):
        raise TypeError(f"holder must be a str, not {type(holder).__name__}")
    return holder.encode("utf-8")


def acquire_request(
    request_id: int,
    key: str,
    wait: Optional[float],
    ttl: Optional[float],
    shared: bool,
    limit: int,
    fair: bool,
    value: Any = b"",
    holder: str = "",
) -> Tuple[bytes, float]:
    """The encoded `LeaseRequest` for one acquire, and the seconds it asks to wait.

    Only what cannot be encoded is checked here (types, negative or infinite numbers);
    the rules on values (key length and characters, TTL range, mode with limit) are the
    sidecar's, and break them and it answers `Rejected` with a clear message.
    """
    k = _key_bytes(key)
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be an int, not {type(limit).__name__}")
    if not 0 <= limit <= 0xFFFFFFFF:
        raise ValueError(f"limit must be between 0 and 2**32-1, got {limit}")
    v = value_bytes(value)
    h = _holder_bytes(holder)
    wait_s = MAX_WAIT if wait is None else wait
    body = _id(request_id)
    if k:
        body += _field(b"\x12", k)
    if isinstance(wait_s, (int, float)) and not isinstance(wait_s, bool) and wait_s == 0:
        pass  # unset: do not wait
    else:
        body += _field(b"\x1a", _duration("wait", wait_s))
    body += b"\x20\x02" if shared else b"\x20\x01"  # LOCK_MODE_SHARED / _EXCLUSIVE
    if limit:
        body += b"\x28" + _varint(limit)
    if fair:
        body += b"\x30\x01"
    if ttl is not None:
        body += _field(b"\x3a", _duration("ttl", ttl))
    if v:
        body += _field(b"\x4a", v)
    if h:
        body += _field(b"\x52", h)  # field 10
    return _field(b"\x0a", body), float(wait_s)


def release_request(request_id: int, key: str, holder: str = "") -> bytes:
    """The encoded `LeaseRequest` of a `Release` by `holder`."""
    k, h = _key_bytes(key), _holder_bytes(holder)
    body = _id(request_id) + (_field(b"\x12", k) if k else b"")
    if h:
        body += _field(b"\x1a", h)  # field 3
    return _field(b"\x12", body)


def proclaim_request(request_id: int, key: str, value: Any, holder: str = "") -> bytes:
    """The encoded `LeaseRequest` of a `Proclaim` by `holder`."""
    k, v, h = _key_bytes(key), value_bytes(value), _holder_bytes(holder)
    body = _id(request_id) + (_field(b"\x12", k) if k else b"")
    if v:
        body += _field(b"\x1a", v)
    if h:
        body += _field(b"\x22", h)  # field 4
    return _field(b"\x1a", body)
