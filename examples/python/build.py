#!/usr/bin/env python3
"""Generate the Python gRPC stubs for Lockside from the repository's .proto.

Writes lockside_pb2.py, lockside_pb2.pyi and lockside_pb2_grpc.py next to this file
(they are git-ignored). Works from any current directory. Equivalent to, from the
repository root:

    python -m grpc_tools.protoc -I proto/lockside/v1 \
        --python_out=examples/python --pyi_out=examples/python \
        --grpc_python_out=examples/python proto/lockside/v1/lockside.proto

The proto is compiled from its own directory (not from proto/) so that the output is
a flat `lockside_pb2` module and no `lockside/` package shadows `lockside.py`.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_DIR = os.path.normpath(os.path.join(HERE, "..", "..", "proto", "lockside", "v1"))
PROTO = os.path.join(PROTO_DIR, "lockside.proto")


def main() -> int:
    try:
        import grpc_tools
        from grpc_tools import protoc
    except ImportError:
        print("build.py: grpcio-tools is missing; run: "
              "pip install -r examples/python/requirements.txt", file=sys.stderr)
        return 1
    if not os.path.isfile(PROTO):
        print(f"build.py: {PROTO} not found", file=sys.stderr)
        return 1
    # The well-known types (google/protobuf/duration.proto) ship with grpcio-tools.
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"-I{well_known}",
        f"--python_out={HERE}",
        f"--pyi_out={HERE}",
        f"--grpc_python_out={HERE}",
        PROTO,
    ]
    rc = protoc.main(args)
    if rc != 0:
        print(f"build.py: protoc failed with exit code {rc}", file=sys.stderr)
        return 1
    print(f"build.py: generated lockside_pb2.py, lockside_pb2_grpc.py in {HERE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
