"""Where the sidecar is: its default address. No I/O."""

from __future__ import annotations

import os

#: Where clients find the sidecar unless told otherwise (the sidecar's default).
DEFAULT_ADDR = "127.0.0.1:7420"

#: The longest holder value the sidecar accepts (`Acquire.value`, `Proclaim.value`).
MAX_VALUE_BYTES = 4096


def default_addr() -> str:
    """$LOCKSIDE_ADDR, else 127.0.0.1:7420."""
    return os.environ.get("LOCKSIDE_ADDR") or DEFAULT_ADDR
