#!/usr/bin/env python3
"""Uncontended acquire->release cycle: the Lockside packages beside their peers, in one
run on one Redis. Run by hand (not in CI):

    cargo build --release --bin lockside --example cycles
    bash clients/prepare.sh      # the wheel in target/clients/venv, the Node tarball installed
    target/clients/venv/bin/pip install redis
    target/clients/venv/bin/python clients/python/bench.py [--rounds 15 --cycles 200]

It starts a redis-server on a free loopback port and `target/release/lockside serve
--store redis://127.0.0.1:PORT` (or --sidecar PATH), then runs the clients in turns,
`--cycles` cycles each per round, so a busy machine slows them alike; the first round
is warm-up. One cycle: take a free key without waiting, release it. The peers:
redis-py's `Lock` (`SET NX PX`, then its release script), `redis.asyncio`'s lock (the
same two commands from the event loop the AsyncClient runs on), and npm's `redlock` 4
on `ioredis` (one Redis; installed by npm into --node-peers, not a dependency of any
package). The floor under the packages, from the same rounds: the raw two commands
(redis-py, no lock object), the client core's own cycle with no binding
(`target/release/examples/cycles`: the gRPC hop, the sidecar and Redis), and the CPU
the sidecar and redis-server spend per cycle of each client (/proc/PID/stat). Prints
p50/p90/p99 per client, each p50 over its peer, and the floor's parts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "tests"))

from servers import Stack  # noqa: E402

from lockside import AsyncClient, Client  # noqa: E402

KEY = "bench-cycle"
# The Node peer, pinned (STACK.md: npm redlock 4.x on ioredis).
REDLOCK = "redlock@4.2.0"
IOREDIS = "ioredis@5.9.3"
# redis-py's release script (redis/lock.py, LUA_RELEASE_SCRIPT), for the raw cycle.
RELEASE = """
local token = redis.call('get', KEYS[1])
if not token or token ~= ARGV[1] then
    return 0
end
redis.call('del', KEYS[1])
return 1
"""
# Each Lockside client and its peer.
PEERS = [
    ("Client (sync)", "redis-py Lock"),
    ("AsyncClient", "redis.asyncio Lock"),
    ("Node Client", "redlock (ioredis)"),
]


def cpu_ns(pid: int) -> int:
    """CPU time (user + system) a process has spent, in ns."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def lines_child(argv: List[str], env: Dict[str, str]) -> subprocess.Popen:
    """A child that answers each line on stdin with one JSON line on stdout."""
    return subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )


def ask(child: subprocess.Popen, line: str) -> List[float]:
    assert child.stdin and child.stdout
    child.stdin.write(line + "\n")
    child.stdin.flush()
    answer = child.stdout.readline()
    if not answer:
        raise RuntimeError(f"{child.args[0]} exited")
    return json.loads(answer)


def percentile(xs: List[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def timed(n: int, cycle: Callable[[], None]) -> List[float]:
    out = []
    clock = time.perf_counter
    for _ in range(n):
        t = clock()
        cycle()
        out.append((clock() - t) * 1e6)
    return out


def main() -> int:
    repo = HERE.parent.parent
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sidecar", default=str(repo / "target" / "release" / "lockside"))
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--cycles", type=int, default=200)
    p.add_argument("--node-script", default=str(repo / "clients" / "node" / "bench.mjs"))
    p.add_argument(
        "--node-modules",
        default=str(repo / "target" / "clients" / "node" / "node_modules"),
        help="where the installed Node package is (clients/prepare.sh puts it there)",
    )
    p.add_argument(
        "--node-peers",
        default=str(repo / "target" / "bench-peers"),
        help="a folder for npm's redlock and ioredis (installed there if missing)",
    )
    p.add_argument(
        "--core-cycles",
        default=str(repo / "target" / "release" / "examples" / "cycles"),
        help="the core's own cycle (cargo build --release --example cycles)",
    )
    args = p.parse_args()

    stack = Stack(binary=args.sidecar)
    children: List[subprocess.Popen] = []
    try:
        samples: Dict[str, List[float]] = {}
        runners: Dict[str, Callable[[int], List[float]]] = {}

        try:
            import redis
        except ImportError:
            print("redis-py is missing (pip install redis): no baseline", file=sys.stderr)
            return 2
        r = redis.Redis(host="127.0.0.1", port=stack.redis.port)

        def redis_cycle() -> None:
            lock = r.lock(KEY + "-redis", timeout=10)
            if not lock.acquire(blocking=False):
                raise RuntimeError("redis-py lock busy")
            lock.release()

        runners["redis-py Lock"] = lambda n: timed(n, redis_cycle)
        release = r.register_script(RELEASE)

        def raw_cycle() -> None:
            if not r.set(KEY + "-raw", "token", nx=True, px=10000):
                raise RuntimeError("raw key busy")
            release(keys=[KEY + "-raw"], args=["token"])

        runners["raw SET+script"] = lambda n: timed(n, raw_cycle)

        import redis.asyncio

        loop = asyncio.new_event_loop()
        ar = redis.asyncio.Redis(host="127.0.0.1", port=stack.redis.port)

        async def aredis_run(n: int) -> List[float]:
            out = []
            clock = time.perf_counter
            for _ in range(n):
                t = clock()
                lock = ar.lock(KEY + "-aredis", timeout=10)
                if not await lock.acquire(blocking=False):
                    raise RuntimeError("redis.asyncio lock busy")
                await lock.release()
                out.append((clock() - t) * 1e6)
            return out

        runners["redis.asyncio Lock"] = lambda n: loop.run_until_complete(aredis_run(n))
        aclient = AsyncClient(stack.addr)

        async def async_run(n: int) -> List[float]:
            out = []
            clock = time.perf_counter
            for _ in range(n):
                t = clock()
                async with aclient.lock(KEY + "-async", wait=0):
                    pass
                out.append((clock() - t) * 1e6)
            return out

        runners["AsyncClient"] = lambda n: loop.run_until_complete(async_run(n))

        client = Client(stack.addr)

        def sync_cycle() -> None:
            with client.lock(KEY + "-sync", wait=0):
                pass

        runners["Client (sync)"] = lambda n: timed(n, sync_cycle)

        core_bin = Path(args.core_cycles)
        if core_bin.is_file():
            core = lines_child([str(core_bin), stack.addr, KEY + "-core"], {})
            children.append(core)
            runners["core (no binding)"] = lambda n: ask(core, f"{n}")
        else:
            print(f"no core figures: {core_bin} missing", file=sys.stderr)

        script = Path(args.node_script)
        if script.is_file() and shutil.which("node") and Path(args.node_modules).is_dir():
            peers = Path(args.node_peers)
            if not (peers / "node_modules" / "redlock").is_dir():
                subprocess.run(
                    ["npm", "install", "--silent", "--no-audit", "--no-fund", "--prefix",
                     str(peers), REDLOCK, IOREDIS],
                    check=True,
                )
            node = lines_child(
                ["node", str(script), stack.addr, KEY + "-node", str(stack.redis.port),
                 str(peers / "node_modules")],
                {"NODE_PATH": args.node_modules},
            )
            children.append(node)
            runners["Node Client"] = lambda n: ask(node, f"lockside {n}")
            runners["redlock (ioredis)"] = lambda n: ask(node, f"redlock {n}")
        else:
            print(f"no Node figures: {script}, node or {args.node_modules} missing", file=sys.stderr)

        cpu: Dict[str, List[int]] = {}
        procs = {"sidecar": stack.sidecar.proc.pid, "redis": stack.redis.proc.pid}
        for rnd in range(args.rounds + 1):
            for name, run in runners.items():
                before = {k: cpu_ns(pid) for k, pid in procs.items()}
                xs = run(args.cycles)
                if rnd:  # round 0 warms up connections, scripts and JITs
                    samples.setdefault(name, []).extend(xs)
                    spent = cpu.setdefault(name, [0, 0])
                    spent[0] += cpu_ns(procs["sidecar"]) - before["sidecar"]
                    spent[1] += cpu_ns(procs["redis"]) - before["redis"]

        n = args.rounds * args.cycles
        print(
            f"uncontended cycle, {args.rounds} rounds x {args.cycles} cycles, "
            f"sidecar {args.sidecar}, redis-server {stack.redis.port}"
        )
        print(
            f"{'client':20s} {'p50 us':>8s} {'p90 us':>8s} {'p99 us':>8s} "
            f"{'sidecar CPU us':>15s} {'redis CPU us':>13s}"
        )
        p50 = {}
        for name, xs in samples.items():
            p50[name] = percentile(xs, 0.5)
            side, red = (v / n / 1000 for v in cpu[name])
            print(
                f"{name:20s} {p50[name]:8.0f} {percentile(xs, 0.9):8.0f} "
                f"{percentile(xs, 0.99):8.0f} {side:15.0f} {red:13.0f}"
            )
        print("each p50 over its peer's (the goal: <= 1.2x):")
        for ours, peer in PEERS:
            if ours in p50 and peer in p50:
                print(f"  {ours:18s} / {peer:20s} {p50[ours] / p50[peer]:.2f}x")
        if "core (no binding)" in p50:
            core50 = p50["core (no binding)"]
            print(
                f"the floor: the core's cycle {core50:.0f} us (the gRPC hop, the sidecar "
                f"{cpu['core (no binding)'][0] / n / 1000:.0f} us of CPU, Redis "
                f"{cpu['core (no binding)'][1] / n / 1000:.0f} us of CPU; the raw two "
                f"commands from redis-py: {p50['raw SET+script']:.0f} us); each binding "
                "over it:"
            )
            for name in ("Client (sync)", "AsyncClient", "Node Client"):
                if name in p50:
                    print(f"  {name:18s} +{p50[name] - core50:.0f} us")
        client.close()
        loop.run_until_complete(aclient.close())
        loop.run_until_complete(ar.aclose())
        loop.close()
    finally:
        # The servers stop whatever happened to the children (one that died at start
        # leaves a broken pipe, and raising here used to leave them running).
        try:
            for child in children:
                try:
                    if child.stdin:
                        child.stdin.close()
                except OSError:
                    pass
                try:
                    child.wait(5)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
        finally:
            stack.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
