"""What an installed package must carry, beyond behaviour."""

from __future__ import annotations

import subprocess
import sys
from importlib import resources

import lockside


def test_ships_its_type_information():
    files = resources.files("lockside")
    assert files.joinpath("py.typed").is_file()
    assert files.joinpath("_native.pyi").is_file()


def test_the_installed_package_imports_no_grpc_module():
    # The gRPC client is the compiled core's: the package pulls in neither grpcio nor
    # protobuf, whatever the test environment has installed. A process of its own,
    # since the README recipe's test imports grpc into this one.
    probe = (
        "import sys, lockside, lockside._native\n"
        "c = lockside.Client('127.0.0.1:1')\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'google'))\n"
        "print(lockside.__file__)\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    where, bad = out.stdout.splitlines()
    assert bad == "", f"grpc or protobuf modules imported: {bad}"
    assert "site-packages" in where, f"not the installed package: {where}"


def test_public_names():
    for name in ("Client", "AsyncClient", "NotAcquired", "LockLost", "Rejected", "Unavailable"):
        assert hasattr(lockside, name)
    assert issubclass(lockside.NotAcquired, lockside.LocksideError)
    assert issubclass(lockside.LockLost, lockside.LocksideError)


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
