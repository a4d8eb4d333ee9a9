"""What a resume attempt's stream says first (`Greeting`), and how the holds the
store kept are squared with the locks held here (`reconcile`). No I/O: the clients
read the stream, `SessionBase._take_resume` decides."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, TypeVar

import grpc

from lockside._errors import Unavailable
from lockside._lock import HolderKey, LockBase, log_lost
from lockside._pb import lockside_pb2 as pb
from lockside._wire import release_request

if TYPE_CHECKING:
    from lockside._core import Pending

L = TypeVar("L", bound=LockBase)
P = TypeVar("P", bound="Pending")


class Greeting:
    """What a resume attempt's stream says first: `SessionStarted` (a new resume token,
    and how many grants the session's record has), then a `Granted` or `Lost` per
    grant. The client reads the stream and feeds each message (`feed`), or says how
    reading failed (`fail`, `ended`); `SessionBase._take_resume` decides."""

    def __init__(self) -> None:
        #: The first message (None: none came, or reading failed).
        self.started: Any = None
        #: The new resume token, once the attempt gave one: the old one is spent.
        self.token: Optional[str] = None
        self.locks: List[Any] = []
        #: Why the attempt failed, when it says; and the stream's status code.
        self.failure: Optional[str] = None
        self.code: Optional[grpc.StatusCode] = None

    def feed(self, data: bytes) -> bool:
        """Takes one message as read; True while more are due."""
        resp = pb.LeaseResponse.FromString(data)
        if self.started is None:
            self.started = resp
            if resp.WhichOneof("event") == "started":
                self.token = resp.started.resume_token
        else:
            self.locks.append(resp)
        due: int = self.started.started.resumed_locks
        return len(self.locks) < due

    def fail(self, failure: str, code: Optional[grpc.StatusCode] = None) -> None:
        """Reading failed (a broken stream, a message that does not parse)."""
        self.started = None
        self.failure, self.code = failure, code

    def ended(self, code: Optional[grpc.StatusCode], details: str) -> None:
        """The attempt's stream ended with `code`: what it says when nothing started."""
        if self.started is None and code is not None:
            self.failure, self.code = f"{code.name}: {details}", code

    @property
    def answered(self) -> bool:
        """The whole greeting came: the session goes on on this stream."""
        s = self.started
        return (
            s is not None
            and s.WhichOneof("event") == "started"
            and len(self.locks) == s.started.resumed_locks
        )


def reconcile(
    held: Dict[HolderKey, List[L]],
    pending: Dict[int, P],
    ids: "itertools.count[int]",
    greeting: Sequence[Any],
) -> List[bytes]:
    """Squares what each holder holds here (`held`, by holder and key) with `greeting`,
    a `Granted` (with its holder and hold count) or `Lost` per grant of the resumed
    session's record; returns the requests to send on the new stream, in order.

    A holder's key comes back with its hold count in the store; a Release that was
    not answered may have been applied before the sidecar died, so as many of those
    as the count says were are taken as answered, and the others are sent again.
    Holds the store has and nobody here knows of (a grant whose answer was lost, a
    lock already reported lost) are given back. A key that did not come back, or came
    back under another token, is lost (taken out of `held`), and the releases and
    proclaims of its locks fail (taken out of `pending`).
    """
    granted: Dict[HolderKey, Any] = {}
    lost: Dict[HolderKey, str] = {}
    for resp in greeting:
        kind = resp.WhichOneof("event")
        if kind == "granted":
            granted[(resp.granted.holder, resp.granted.key)] = resp.granted
        elif kind == "lost":
            lost[(resp.lost.holder, resp.lost.key)] = resp.lost.reason
    out: List[bytes] = []
    gone: List[L] = []

    def give_back(hk: HolderKey, holds: int) -> None:
        for _ in range(holds):
            out.append(release_request(next(ids), hk[1], hk[0]))

    def lose(hk: HolderKey, reason: str) -> None:
        for lock in held.pop(hk):
            lock._mark_lost(reason, quiet=True)
            gone.append(lock)

    releases: Dict[HolderKey, List[int]] = {}
    for rid in sorted(pending):
        p = pending[rid]
        if p.kind == "release":
            releases.setdefault((p.holder, p.key), []).append(rid)
    for hk in list(held):
        locks = held[hk]
        back = granted.pop(hk, None)
        if back is None or back.fencing_token != locks[0].fencing_token:
            reason = lost.get(hk) or "the resumed session did not list it"
            lose(hk, f"lost while the sidecar was away: {reason}")
            if back is not None:
                give_back(hk, back.hold_count)
            continue
        unanswered = releases.get(hk, [])
        applied = min(len(unanswered), max(0, len(locks) - back.hold_count))
        for rid in unanswered[:applied]:
            done = pending.pop(rid)
            done.resolve(
                pb.LeaseResponse(released=pb.Released(request_id=rid, key=hk[1], holder=hk[0]))
            )
        surplus = back.hold_count + applied - len(locks)
        if surplus < 0:
            # Fewer holds than grants known here: nothing explains it; do not
            # count on any of them.
            lose(hk, "the resumed session holds the key fewer times than granted")
            give_back(hk, back.hold_count)
            continue
        give_back(hk, surplus)
    for hk, back in granted.items():
        give_back(hk, back.hold_count)
    log_lost(gone, "not held by the resumed session (each lock's lost_reason says why)")
    # Unanswered releases and proclaims go again, in their order; those of locks
    # that did not come back fail now (their locks are lost).
    for rid in sorted(pending):
        p = pending[rid]
        if p.kind != "acquire" and (p.holder, p.key) in held:
            out.append(p.request)
            continue
        del pending[rid]
        if p.kind == "acquire":  # (none: acquires wait for the resume to end)
            p.resolve(error=Unavailable("the session was resumed: ask again"))
        else:
            p.resolve(error=Unavailable("the lock was lost while the sidecar was away"))
    return out
