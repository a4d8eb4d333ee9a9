#!/usr/bin/env python3
"""Lockside example.

Hold one lock and print its fencing token:

    python examples/python/lockside_example.py --addr 127.0.0.1:7420 --key demo [--hold 2]

Contention test (used to check mutual exclusion; run several at once):

    python examples/python/lockside_example.py contend --addr 127.0.0.1:7420 \
        --key demo --iterations 50 --out holds.txt

`contend` takes the lock N times (waiting up to 30 s), records `start = time.monotonic_ns()`
right after the grant and `end = time.monotonic_ns()` just before releasing, holding it for
a random 0-2 ms in between, and appends one line `start_ns end_ns fencing_token` per
hold to FILE. Both modes exit 0 on success and non-zero with a message on any error,
and give up after 60 s in total.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import threading
import time

import lockside

TOTAL_LIMIT_S = 60.0


def _watchdog(limit: float) -> None:
    """Last resort: never run longer than `limit` seconds, whatever hangs."""
    def fire() -> None:
        print(f"error: gave up after {limit:.0f}s", file=sys.stderr, flush=True)
        os._exit(3)
    t = threading.Timer(limit, fire)
    t.daemon = True
    t.start()


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--addr", default=lockside.DEFAULT_ADDR,
                   help="sidecar address (default: $LOCKSIDE_ADDR or 127.0.0.1:7420)")
    p.add_argument("--key", required=True, help="lock name")
    p.add_argument("--wait", type=float, default=30.0,
                   help="seconds to wait for a busy lock (default 30)")
    p.add_argument("--ttl", type=float, default=None,
                   help="lock TTL in seconds (default: the sidecar's)")


def hold(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + TOTAL_LIMIT_S
    with lockside.Client(args.addr, client_name=f"lockside-example/{os.getpid()}") as c:
        wait = min(args.wait, deadline - time.monotonic())
        with c.lock(args.key, wait=wait, ttl=args.ttl) as lock:
            print(f"acquired {args.key!r}: fencing_token={lock.fencing_token} "
                  f"session={lock.session_id} ttl={lock.ttl:.3f}s", flush=True)
            hold_s = max(0.0, min(args.hold, deadline - time.monotonic() - 5))
            if lock.lost.wait(hold_s):
                print(f"error: lock {args.key!r} lost while held: {lock.lost_reason}",
                      file=sys.stderr)
                return 1
        print(f"released {args.key!r}", flush=True)
    return 0


def contend(args: argparse.Namespace) -> int:
    if args.iterations < 1:
        print("error: --iterations must be >= 1", file=sys.stderr)
        return 2
    deadline = time.monotonic() + TOTAL_LIMIT_S
    fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        with lockside.Client(args.addr,
                             client_name=f"lockside-example/{os.getpid()}") as c:
            for i in range(args.iterations):
                left = deadline - time.monotonic() - 5  # keep time to release
                if left <= 0:
                    print(f"error: gave up after {TOTAL_LIMIT_S:.0f}s "
                          f"({i} of {args.iterations} holds done)", file=sys.stderr)
                    return 1
                with c.lock(args.key, wait=min(args.wait, left), ttl=args.ttl) as lock:
                    start = time.monotonic_ns()
                    time.sleep(random.uniform(0.0, 0.002))
                    end = time.monotonic_ns()
                    if lock.lost.is_set():
                        print(f"error: lock {args.key!r} lost while held: "
                              f"{lock.lost_reason}", file=sys.stderr)
                        return 1
                    token = lock.fencing_token
                # One write(2) per line on an O_APPEND fd: lines from concurrent
                # processes sharing FILE do not interleave.
                os.write(fd, f"{start} {end} {token}\n".encode())
    finally:
        os.close(fd)
    print(f"contend: {args.iterations} holds of {args.key!r} recorded in {args.out}",
          flush=True)
    return 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "contend":
        p = argparse.ArgumentParser(prog="lockside_example.py contend",
                                    description="Take KEY N times; log each hold.")
        _common(p)
        p.add_argument("--iterations", type=int, required=True)
        p.add_argument("--out", required=True,
                       help="file to append 'start_ns end_ns fencing_token' lines to")
        args = p.parse_args(argv[1:])
        run = contend
    else:
        p = argparse.ArgumentParser(
            prog="lockside_example.py",
            description="Hold a Lockside lock and print its fencing token. "
                        "See also: lockside_example.py contend --help")
        _common(p)
        p.add_argument("--hold", type=float, default=2.0,
                       help="seconds to hold the lock (default 2)")
        args = p.parse_args(argv)
        run = hold

    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    _watchdog(TOTAL_LIMIT_S)
    try:
        return run(args)
    except lockside.LocksideError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
