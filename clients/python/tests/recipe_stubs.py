"""Stubs of lockside.proto made with grpcio-tools, as an application that speaks gRPC
itself makes them (the README recipe's test runs on them): `lockside_pb2`, importable
once `stubs()` ran."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any


def stubs(out: Path) -> Any:
    """Generates `lockside_pb2.py` into `out`, puts `out` on `sys.path`, imports it."""
    import grpc_tools
    from grpc_tools import protoc

    root = Path(__file__).resolve().parents[3] / "proto" / "lockside" / "v1"
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    status = protoc.main(
        ["protoc", f"-I{root}", f"-I{well_known}", f"--python_out={out}", "lockside.proto"]
    )
    assert status == 0, "protoc failed"
    sys.path.insert(0, str(out))
    return importlib.import_module("lockside_pb2")
