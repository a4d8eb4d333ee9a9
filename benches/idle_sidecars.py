#!/usr/bin/env python3
"""What idle sidecars pay for another pod's contention (issue 13, goal 4). Run by hand:

    cargo build --release
    python3 benches/idle_sidecars.py [--sidecar target/release/lockside] [--idle 20]
        [--sessions 4] [--seconds 4]

Needs python3 with grpcio and grpcio-tools (the stubs are generated from
proto/lockside/v1/lockside.proto into a temporary directory) and `redis-server`.

It starts one redis-server on a free loopback port and `--idle` + 1 `lockside serve`
processes on it, all in one namespace. Then, for `--seconds` each:
  1. quiet: nobody does anything (what an idle sidecar costs by itself);
  2. handoffs: `--sessions` sessions of the one busy sidecar hand one key around
     (acquire with a wait, release, again), so every release has waiters.
It prints the CPU time (user + system, from /proc/PID/stat) of the idle sidecars
together, of the busy one and of redis-server in each period, the handoffs made, and
how many PUBLISH, SUBSCRIBE and UNSUBSCRIBE calls Redis served (INFO commandstats).
Every process it starts is stopped at the end, also after an error.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List

REPO = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU of `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        # The command name may hold spaces: fields count from after its ')'.
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def wait_for_port(port: int, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port}")


def command_calls(port: int) -> dict:
    """Calls per command name from redis-server's INFO commandstats."""
    out = subprocess.run(
        ["redis-cli", "-p", str(port), "info", "commandstats"],
        capture_output=True, text=True, check=True,
    ).stdout
    calls = {}
    for line in out.splitlines():
        if line.startswith("cmdstat_"):
            name, stats = line[len("cmdstat_"):].split(":", 1)
            calls[name] = int(stats.split(",")[0].split("=")[1])
    return calls


def stubs(out: str):
    """Generates the Python stubs of the contract into `out` and imports them."""
    from grpc_tools import protoc
    import grpc_tools

    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    proto = REPO / "proto"
    code = protoc.main(
        [
            "protoc",
            f"-I{proto}",
            f"-I{include}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            str(proto / "lockside" / "v1" / "lockside.proto"),
        ]
    )
    if code != 0:
        raise RuntimeError("protoc failed")
    sys.path.insert(0, out)
    from lockside.v1 import lockside_pb2, lockside_pb2_grpc

    return lockside_pb2, lockside_pb2_grpc


async def hand_around(addr: str, sessions: int, seconds: float, pb, pb_grpc) -> int:
    """`sessions` sessions take and give back one key until `seconds` have passed;
    returns the grants made."""
    import grpc

    from google.protobuf.duration_pb2 import Duration

    deadline = time.monotonic() + seconds
    grants = 0

    async def session() -> None:
        nonlocal grants
        async with grpc.aio.insecure_channel(addr) as channel:
            stub = pb_grpc.LockServiceStub(channel)
            requests: asyncio.Queue = asyncio.Queue()

            async def outbound():
                while True:
                    yield await requests.get()

            call = stub.Lease(outbound())
            events = call.__aiter__()
            await events.__anext__()  # SessionStarted
            rid = 0
            while time.monotonic() < deadline:
                rid += 1
                acquire = pb.Acquire(
                    request_id=rid, key="k", wait_timeout=Duration(seconds=30)
                )
                await requests.put(pb.LeaseRequest(acquire=acquire))
                while True:
                    event = await events.__anext__()
                    kind = event.WhichOneof("event")
                    if kind == "granted":
                        break
                    if kind != "waiting":
                        raise RuntimeError(f"unexpected {event}")
                grants += 1
                rid += 1
                await requests.put(
                    pb.LeaseRequest(release=pb.Release(request_id=rid, key="k"))
                )
                while (await events.__anext__()).WhichOneof("event") != "released":
                    pass
            call.cancel()

    await asyncio.gather(*(session() for _ in range(sessions)))
    return grants


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sidecar", default=str(REPO / "target" / "release" / "lockside"))
    p.add_argument("--idle", type=int, default=20)
    p.add_argument("--sessions", type=int, default=4)
    p.add_argument("--seconds", type=float, default=4.0)
    args = p.parse_args()

    procs: List[subprocess.Popen] = []
    tmp = tempfile.TemporaryDirectory(prefix="lockside-idle-")
    try:
        pb, pb_grpc = stubs(tmp.name)
        redis_port = free_port()
        redis = subprocess.Popen(
            ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, cwd=tmp.name,
        )
        procs.append(redis)
        wait_for_port(redis_port)
        sidecars = []
        for _ in range(args.idle + 1):
            port = free_port()
            proc = subprocess.Popen(
                [args.sidecar, "serve", "--listen", f"127.0.0.1:{port}",
                 "--admin-listen", "none", "--store", f"redis://127.0.0.1:{redis_port}",
                 "--namespace", "bench-idle"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            procs.append(proc)
            sidecars.append((proc, port))
        for _, port in sidecars:
            wait_for_port(port)
        busy, idle = sidecars[0], sidecars[1:]
        # Let start-up work (connections, first health checks) settle.
        time.sleep(1.0)

        def snapshot():
            return (
                sum(cpu_seconds(p.pid) for p, _ in idle),
                cpu_seconds(busy[0].pid),
                cpu_seconds(redis.pid),
            )

        before = snapshot()
        time.sleep(args.seconds)
        quiet = snapshot()
        grants = asyncio.run(
            hand_around(f"127.0.0.1:{busy[1]}", args.sessions, args.seconds, pb, pb_grpc)
        )
        loaded = snapshot()

        def row(name, a, b):
            return (f"{name:<28} {b[0] - a[0]:>8.2f} s {b[1] - a[1]:>8.2f} s "
                    f"{b[2] - a[2]:>8.2f} s")

        print(f"sidecar: {args.sidecar}")
        print(f"{args.idle} idle sidecars, 1 busy sidecar with {args.sessions} sessions, "
              f"{args.seconds:g} s per period, one redis-server")
        print(f"{'CPU (user + system)':<28} {'idle (all)':>10} {'busy':>10} {'redis':>10}")
        print(row("quiet", before, quiet))
        print(row(f"handoffs ({grants} grants)", quiet, loaded))
        calls = command_calls(redis_port)
        print("redis calls: " + ", ".join(
            f"{calls.get(c, 0)} {c.upper()}" for c in ("publish", "subscribe", "unsubscribe")
        ))
        return 0
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in reversed(procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
