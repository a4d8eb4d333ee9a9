"""What an installed package must carry, beyond behaviour."""

from __future__ import annotations

from importlib import resources

from google.protobuf import descriptor_pool

import lockside
from lockside._pb import lockside_pb2


def test_ships_its_type_information():
    files = resources.files("lockside")
    assert files.joinpath("py.typed").is_file()
    assert files.joinpath("_pb", "lockside_pb2.pyi").is_file()


def test_stubs_live_in_a_private_descriptor_pool():
    # An application with its own stubs of lockside.proto (registered in the default
    # pool, perhaps under another file name) must still be able to import the package.
    assert lockside_pb2.DESCRIPTOR.pool is not descriptor_pool.Default()
    assert lockside_pb2.DESCRIPTOR.name == "lockside/v1/lockside.proto"


def test_public_names():
    for name in ("Client", "AsyncClient", "NotAcquired", "LockLost", "Rejected", "Unavailable"):
        assert hasattr(lockside, name)
    assert issubclass(lockside.NotAcquired, lockside.LocksideError)
    assert issubclass(lockside.LockLost, lockside.LocksideError)
