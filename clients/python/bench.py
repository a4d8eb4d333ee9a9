#!/usr/bin/env python3
"""Uncontended acquire->release cycle: AsyncClient, Client, redis-py's Lock (sync and
asyncio) and the Node client, in the same run on the same Redis. Run by hand (not in CI):

    cargo build --release
    python -m venv /tmp/v && /tmp/v/bin/pip install ./clients/python redis
    npm --prefix clients/node ci && npm --prefix clients/node run build   # for Node
    /tmp/v/bin/python clients/python/bench.py [--rounds 15 --cycles 200]

It starts a redis-server on a free loopback port and `target/release/lockside serve
--store redis://127.0.0.1:PORT` (or --sidecar PATH), then runs the clients in turns,
`--cycles` cycles each per round, so a busy machine slows them alike; the first round
is warm-up. One cycle: take a free key without waiting, release it, wait for the
answer (redis-py: `SET NX PX` then its release script, as `Lock.acquire` and
`Lock.release` do; `redis.asyncio`'s lock sends the same two commands from the event
loop the AsyncClient runs on). Prints p50/p90/p99 per client and each p50 over both
redis-py baselines: the issue's goal is stated against the sync `Lock`, while the
asyncio lock is the like-for-like yardstick for the AsyncClient (both pay for asyncio).
"""

from __future__ import annotations

import argparse
import asyncio
import json
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
    args = p.parse_args()

    stack = Stack(binary=args.sidecar)
    node = None
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

        script = Path(args.node_script)
        if script.is_file() and shutil.which("node"):
            node = subprocess.Popen(
                ["node", str(script), stack.addr, KEY + "-node"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )

            def node_run(n: int) -> List[float]:
                assert node is not None and node.stdin and node.stdout
                node.stdin.write(f"{n}\n")
                node.stdin.flush()
                line = node.stdout.readline()
                if not line:
                    raise RuntimeError("the Node bench exited")
                return json.loads(line)

            runners["Node Client"] = node_run
        else:
            print(f"no Node figures: {script} or node missing (build clients/node)", file=sys.stderr)

        for rnd in range(args.rounds + 1):
            for name, run in runners.items():
                xs = run(args.cycles)
                if rnd:  # round 0 warms up connections, scripts and JITs
                    samples.setdefault(name, []).extend(xs)

        base = percentile(samples["redis-py Lock"], 0.5)
        abase = percentile(samples["redis.asyncio Lock"], 0.5)
        print(
            f"uncontended cycle, {args.rounds} rounds x {args.cycles} cycles, "
            f"sidecar {args.sidecar}, redis-server {stack.redis.port}"
        )
        print(
            f"{'client':18s} {'p50 us':>8s} {'p90 us':>8s} {'p99 us':>8s} "
            f"{'p50 / sync Lock':>16s} {'p50 / asyncio Lock':>19s}"
        )
        for name, xs in samples.items():
            p50 = percentile(xs, 0.5)
            print(
                f"{name:18s} {p50:8.0f} {percentile(xs, 0.9):8.0f} {percentile(xs, 0.99):8.0f} "
                f"{p50 / base:15.2f}x {p50 / abase:18.2f}x"
            )
        ap50 = percentile(samples["AsyncClient"], 0.5)
        print(
            f"AsyncClient p50: {ap50 / base:.2f}x redis-py's sync Lock (the issue's goal: "
            f"<= 1.8x), {ap50 / abase:.2f}x redis.asyncio's Lock (like for like)"
        )
        client.close()
        loop.run_until_complete(aclient.close())
        loop.run_until_complete(ar.aclose())
        loop.close()
    finally:
        # The servers stop whatever happened to Node (a script that died at start
        # leaves a broken pipe, and raising here used to leave them running).
        try:
            if node is not None:
                try:
                    if node.stdin:
                        node.stdin.close()
                except OSError:
                    pass
                try:
                    node.wait(5)
                except subprocess.TimeoutExpired:
                    node.kill()
                    node.wait()
        finally:
            stack.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
