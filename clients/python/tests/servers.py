"""Real servers for the tests and the benchmark: a `redis-server` on a free loopback
port and the `lockside` sidecar binary on it, started by the caller and stopped by it.

The binary: $LOCKSIDE_BIN, else the newest of target/debug/lockside and
target/release/lockside in the Lockside checkout above this directory (build it first:
`cargo build`).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable, List, Optional, Sequence

STARTUP_TIMEOUT = 15.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sidecar_binary() -> str:
    explicit = os.environ.get("LOCKSIDE_BIN")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise RuntimeError(f"LOCKSIDE_BIN={explicit} is not an executable")
        return explicit
    here = Path(__file__).resolve()
    for root in here.parents:
        cargo = root / "Cargo.toml"
        if cargo.is_file() and re.search(r'^name\s*=\s*"lockside"', cargo.read_text(), re.M):
            built = [
                p
                for p in (root / "target" / "debug" / "lockside", root / "target" / "release" / "lockside")
                if p.is_file() and os.access(p, os.X_OK)
            ]
            if built:
                return str(max(built, key=lambda p: p.stat().st_mtime))
            raise RuntimeError(f"no lockside binary under {root}/target: run `cargo build` there")
    raise RuntimeError("set LOCKSIDE_BIN to the lockside binary (not in a Lockside checkout)")


class Redis:
    """A throwaway redis-server on 127.0.0.1, stopped by `stop()`."""

    def __init__(self, workdir: str):
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        for _attempt in range(5):
            self.port = free_port()
            self.proc = subprocess.Popen(
                [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", workdir],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            if self._ready():
                return
            self.stop()
        raise RuntimeError("redis-server did not start")

    def _ready(self) -> bool:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return True
            except OSError:
                time.sleep(0.02)
        return False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def command(self, *args: str) -> bytes:
        """One command in RESP; the raw reply (enough for integer replies)."""
        request = f"*{len(args)}\r\n".encode()
        for arg in args:
            data = arg.encode()
            request += b"$%d\r\n%s\r\n" % (len(data), data)
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            s.sendall(request)
            return s.recv(65536)

    def recorded(self, session_id: str, keys: int, namespace: str = "lockside") -> bool:
        """Whether the session's record in the store lists `keys` keys: the sidecar's
        journal writes a grant there once it has been held 50 ms, and only what is
        there can be resumed."""
        record = f"{{{namespace}:session/{session_id}}}:s"
        reply = self.command("HLEN", record)
        return reply.startswith(b":") and int(reply[1:].strip()) == 3 + keys

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class Sidecar:
    """`lockside serve` on a free port of 127.0.0.1, on the given Redis."""

    def __init__(
        self,
        store: str,
        workdir: str,
        listen: str = "127.0.0.1:0",
        binary: Optional[str] = None,
        args: Sequence[str] = (),
    ):
        self.log = os.path.join(workdir, f"sidecar-{uuid.uuid4().hex[:8]}.log")
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [binary or sidecar_binary(), "serve", "--listen", listen,
                 "--admin-listen", "127.0.0.1:0", "--store", store, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                # The tests' own environment must not configure the sidecar.
                env={k: v for k, v in os.environ.items() if not k.startswith("LOCKSIDE_")},
            )
        self.addr = self._bound_address()

    def _bound_address(self) -> str:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            with open(self.log, encoding="utf-8", errors="replace") as f:
                m = re.search(r" listening address=(\S+)", f.read())
            if m:
                return m.group(1)
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        self.stop()
        with open(self.log, encoding="utf-8", errors="replace") as f:
            raise RuntimeError(f"the sidecar did not start:\n{f.read()}")

    def kill(self) -> None:
        """SIGKILL: the sidecar dies without a word (its streams just break)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.wait()


class Stack:
    """A Redis and a sidecar on it (started with `sidecar_args`, as every later
    sidecar); stops both, in that order of need."""

    def __init__(self, binary: Optional[str] = None, sidecar_args: Sequence[str] = ()) -> None:
        self.dir = tempfile.mkdtemp(prefix="lockside-py-")
        self.binary = binary
        self.sidecar_args = tuple(sidecar_args)
        self.redis = Redis(self.dir)
        self.sidecars: List[Sidecar] = []
        try:
            self.sidecar = self.start_sidecar()
        except BaseException:
            self.redis.stop()
            raise

    @property
    def addr(self) -> str:
        return self.sidecar.addr

    def start_sidecar(self, listen: str = "127.0.0.1:0") -> Sidecar:
        sidecar = Sidecar(self.redis.url, self.dir, listen, self.binary, self.sidecar_args)
        self.sidecars.append(sidecar)
        return sidecar

    def restart_sidecar(self) -> Sidecar:
        """SIGKILLs the sidecar and starts another on its address and Redis (as the
        kubelet restarts a crashed native sidecar in place)."""
        addr = self.sidecar.addr
        self.sidecar.kill()
        self.sidecar = self.start_sidecar(listen=addr)
        assert self.sidecar.addr == addr
        return self.sidecar

    def stop(self) -> None:
        for sidecar in self.sidecars:
            sidecar.stop()
        self.redis.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def wait_until(predicate: Callable[[], object], timeout: float = 5.0) -> object:
    """Polls `predicate` (for state only the sidecar knows, like `describe`)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.01)
