"""Protobuf stubs generated from proto/lockside/v1/lockside.proto when the package is
built (hatch_build.py); they are not in the source tree."""
