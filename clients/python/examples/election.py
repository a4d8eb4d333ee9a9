"""Leader election with the `lockside` package. Start several copies: one leads at a
time, in the order they started; the others print who leads and take over, in turn,
when it goes (Ctrl-C resigns; a killed leader's sidecar releases at once).

    python election.py jobs/leader "$(hostname):8080"

The leader's work gets the fencing token, to pass along to what it writes.
"""

import sys
import threading
import time

import lockside


def follow(key: str) -> None:
    """What a follower does with each state: know who leads (and where)."""
    try:
        with lockside.Client() as c:
            for state in c.watch(key):
                leader = state.leader
                if leader is None:
                    print("no leader: the next candidate takes over")
                else:
                    print(f"leader: {leader.value.decode()} (token {leader.fencing_token})")
    except lockside.LocksideError as e:
        print(f"watch: {e}")


def work(token: int) -> None:
    print(f"leading: working with fencing token {token}")
    time.sleep(1.0)


def main() -> int:
    key, me = sys.argv[1], sys.argv[2]
    threading.Thread(target=follow, args=(key,), daemon=True).start()
    with lockside.Client(client_name=me) as c:
        lead = c.campaign(key, me)  # returns once this copy leads
        try:
            # Work while leading: wait_restored() returns at once unless the stream to the
            # sidecar broke (then it waits for the resume), and False once leadership is lost.
            while lead.wait_restored():
                work(lead.fencing_token)
            print(f"leadership lost: {lead.lost_reason}")
            return 1
        except KeyboardInterrupt:
            lead.release()  # resign: the next candidate leads now
            return 0


if __name__ == "__main__":
    sys.exit(main())
