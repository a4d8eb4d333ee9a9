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


def test_requests_are_encoded_as_the_generated_classes_encode_them():
    # The package encodes its requests itself (_wire.py says why); the bytes must be
    # the generated classes' own, field for field, for every shape of request.
    from lockside._wire import acquire_request, proclaim_request, release_request

    pb = lockside_pb2

    def duration(seconds: float):
        whole = int(seconds)
        return {"seconds": whole, "nanos": int(round((seconds - whole) * 1e9))}

    keys = ["k", "", "orders/é-ü-☃", "x" * 300]
    ids = [1, 127, 128, 300, 2**32, 2**63 - 1]
    holders = ["", "thread:1:MainThread", "task:12:Task-3 ☃", "h" * 128]
    for rid in ids:
        for key in keys:
            for holder in holders:
                assert release_request(rid, key, holder) == pb.LeaseRequest(
                    release=pb.Release(request_id=rid, key=key, holder=holder)
                ).SerializeToString()
            for value in (b"", b"10.0.0.7:8080", "é" * 3000):
                raw = value.encode() if isinstance(value, str) else value
                for holder in holders:
                    assert proclaim_request(rid, key, value, holder) == pb.LeaseRequest(
                        proclaim=pb.Proclaim(request_id=rid, key=key, value=raw, holder=holder)
                    ).SerializeToString()
    shapes = [
        dict(wait=0, ttl=None, shared=False, limit=0, fair=False, value=b""),
        dict(wait=None, ttl=10.0, shared=True, limit=0, fair=True, value="v"),
        dict(wait=5.5, ttl=0.25, shared=False, limit=3, fair=False, value=b"\x00" * 200),
        dict(wait=0.000000001, ttl=0, shared=False, limit=2**32 - 1, fair=True, value=b""),
        dict(wait=86400, ttl=3600.999999999, shared=True, limit=1, fair=False, value=b"x"),
    ]
    for rid, holder in zip(ids, holders * 2):
        for key in keys:
            for shape in shapes:
                data, _ = acquire_request(rid, key, **shape, holder=holder)
                acquire = pb.Acquire(
                    request_id=rid,
                    key=key,
                    holder=holder,
                    mode=pb.LOCK_MODE_SHARED if shape["shared"] else pb.LOCK_MODE_EXCLUSIVE,
                    limit=shape["limit"],
                    fair=shape["fair"],
                    value=shape["value"].encode()
                    if isinstance(shape["value"], str)
                    else shape["value"],
                )
                wait = 24 * 3600.0 if shape["wait"] is None else shape["wait"]
                if wait:
                    acquire.wait_timeout.CopyFrom(pb.Acquire().wait_timeout.__class__(**duration(wait)))
                if shape["ttl"] is not None:
                    acquire.ttl.CopyFrom(pb.Acquire().ttl.__class__(**duration(shape["ttl"])))
                assert data == pb.LeaseRequest(acquire=acquire).SerializeToString(), (rid, key, shape)


def test_holder_names_are_unique_short_and_printable():
    import threading

    from lockside._holders import MAX_HOLDER_BYTES, thread_holder

    names = []

    def named() -> None:
        names.append(thread_holder())

    for name in ("worker", "bad\nname\x00", "é" * 200):
        t = threading.Thread(target=named, name=name)
        t.start()
        t.join()
    assert len(set(names)) == 3 and all(n.startswith("thread:") for n in names)
    assert all(len(n.encode()) <= MAX_HOLDER_BYTES for n in names)
    assert all(n.isprintable() for n in names)
    assert thread_holder() == thread_holder()  # one thread, one holder
