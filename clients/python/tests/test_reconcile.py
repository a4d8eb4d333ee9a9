"""How a resumed session squares what it holds with what the store says came back
(`SessionBase._resumed`), for the cases a sidecar kill cannot produce on demand: a
Release the dead sidecar applied but never answered, a grant whose answer was lost, a
key that came back with another token; and what a broken stream does before that (every
lock suspended at once, lost when its TTL has passed since the break, or at once
without a resume token). No I/O: the greeting is what a resumed stream sends
(test_resume.py and test_broken_stream.py run the whole thing against real sidecars)."""

from __future__ import annotations

import time
from typing import List

import grpc

from lockside._core import OPEN, LockBase, Pending, SessionBase, release_request
from lockside._pb import lockside_pb2 as pb


class _Lock(LockBase):
    def _signal_lost(self) -> None:
        pass

    def _signal_suspended(self, suspended: bool) -> None:
        pass


class _Pending(Pending):
    def _notify(self) -> None:
        pass


class _Session(SessionBase):
    def __init__(self) -> None:
        super().__init__()
        self.session_id = "s"
        self.resume_token = "old"
        self.sent: List[bytes] = []

    def _send_nowait(self, request: bytes) -> None:
        self.sent.append(request)

    def _new_lock(self, key, holder, granted, ttl):
        return _Lock(self, key, holder, granted, ttl)


def grant(session: _Session, key: str, token: int, count: int, holder: str = "") -> _Lock:
    g = pb.Granted(request_id=0, key=key, fencing_token=token, hold_count=count, holder=holder)
    lock = session._new_lock(key, holder, g, 10.0)
    session._held.setdefault((holder, key), []).append(lock)
    return lock


def release(session: _Session, lock: _Lock) -> tuple:
    rid = next(session._ids)
    request = release_request(rid, lock.key, lock.holder)
    pending = _Pending("release", lock.key, request, holder=lock.holder)
    session._pending[rid] = pending
    return rid, pending


def back(key: str, token: int, count: int, holder: str = ""):
    return pb.LeaseResponse(
        granted=pb.Granted(
            request_id=0, key=key, fencing_token=token, hold_count=count, holder=holder
        )
    )


def lost(key: str, holder: str = ""):
    return pb.LeaseResponse(lost=pb.Lost(key=key, reason="expired", holder=holder))


def resume(session: _Session, *greeting) -> List[pb.LeaseRequest]:
    session.state = "resuming"
    started = pb.SessionStarted(session_id="s", resume_token="new", resumed_locks=len(greeting))
    out = session._resumed(started, greeting)
    assert session.state is OPEN and session.resume_token == "new"
    return [pb.LeaseRequest.FromString(data) for data in out]


def released_keys(requests) -> List[str]:
    return [r.release.key for r in requests if r.WhichOneof("command") == "release"]


def test_a_release_the_dead_sidecar_applied_counts_as_answered():
    s = _Session()
    outer, inner = grant(s, "k", 7, 1), grant(s, "k", 7, 2)
    rid, pending = release(s, inner)
    # The store holds the key once: the release was applied before the sidecar died.
    assert resume(s, back("k", 7, 1)) == []
    assert pending.response.WhichOneof("event") == "released" and rid not in s._pending
    assert outer.held


def test_a_release_not_applied_is_sent_again():
    s = _Session()
    grant(s, "k", 7, 1)
    inner = grant(s, "k", 7, 2)
    rid, pending = release(s, inner)
    sent = resume(s, back("k", 7, 2))
    assert [(r.release.request_id, r.release.key) for r in sent] == [(rid, "k")]
    assert s._pending[rid] is pending


def test_holds_nobody_knows_of_are_given_back():
    s = _Session()
    held = grant(s, "k", 7, 1)
    # A reentrant grant whose answer was lost, and a key this client never saw granted.
    sent = resume(s, back("k", 7, 2), back("other", 9, 1))
    assert sorted(released_keys(sent)) == ["k", "other"]
    assert held.held


def test_keys_lost_or_missing_or_changed_are_lost_and_their_releases_fail():
    s = _Session()
    gone = grant(s, "gone", 1, 1)
    missing = grant(s, "missing", 2, 1)
    changed = grant(s, "changed", 3, 1)
    kept = grant(s, "kept", 4, 1)
    _, pending = release(s, gone)
    sent = resume(s, lost("gone"), back("changed", 30, 1), back("kept", 4, 1))
    assert not gone.held and "expired" in gone.lost_reason
    assert not missing.held and "did not list it" in missing.lost_reason
    assert not changed.held
    assert kept.held
    # The grant under another token is not this session's to keep: given back.
    assert released_keys(sent) == ["changed"]
    assert pending.error is not None and not s._pending


def test_each_holder_gets_its_own_grants_back():
    # Two threads of one session hold a shared key (and one of them a second hold);
    # the resumed session lists each holder's grant: each comes back to its own locks.
    s = _Session()
    a1, a2 = grant(s, "k", 7, 1, holder="thread:1"), grant(s, "k", 7, 2, holder="thread:1")
    b = grant(s, "k", 7, 1, holder="thread:2")
    _, pending = release(s, a2)
    sent = resume(s, back("k", 7, 2, holder="thread:1"), back("k", 7, 1, holder="thread:2"))
    # thread:1's release was not applied (still 2 holds): sent again, by thread:1.
    assert [(r.release.key, r.release.holder) for r in sent] == [("k", "thread:1")]
    assert a1.held and a2.held and b.held and pending.error is None


def test_a_holder_lost_alone_takes_no_other_holder_with_it():
    s = _Session()
    a = grant(s, "k", 7, 1, holder="task:1:a")
    b = grant(s, "k", 8, 1, holder="task:2:b")
    sent = resume(s, lost("k", holder="task:1:a"), back("k", 8, 1, holder="task:2:b"))
    assert not a.held and "expired" in a.lost_reason
    assert b.held and not b.lost_reason
    assert sent == []


def test_lost_and_jeopardy_events_reach_only_their_holder():
    s = _Session()
    a = grant(s, "k", 7, 1, holder="thread:1")
    b = grant(s, "k", 7, 1, holder="thread:2")
    s._dispatch(pb.LeaseResponse(jeopardy=pb.Jeopardy(key="k", holder="thread:2")))
    assert list(s._jeopardy) == [("thread:2", "k")]
    s._dispatch(lost("k", holder="thread:2"))
    assert a.held and not b.held and "expired" in b.lost_reason
    assert s._jeopardy == {}


# -- a broken stream: suspended at once, then restored or lost (no I/O) ------------------


def broke(session: _Session) -> bool:
    return session._broke("UNAVAILABLE: reset", grpc.StatusCode.UNAVAILABLE)


def test_a_break_suspends_every_lock_and_the_resume_restores_those_it_lists():
    s = _Session()
    kept, gone = grant(s, "kept", 4, 1), grant(s, "gone", 5, 1)
    assert broke(s) and s.state == "resuming"
    assert kept._suspended and gone._suspended and kept.held and not kept.lost_reason
    assert not kept._usable()
    resume(s, back("kept", 4, 1))
    assert kept._usable() and not kept._suspended
    # Lost stays suspended: never usable again.
    assert gone._suspended and not gone.held and "did not list it" in gone.lost_reason


def test_a_lock_not_back_when_its_ttl_has_passed_since_the_break_is_lost():
    s = _Session()
    short = grant(s, "short", 1, 1)  # grant() asks a TTL of 10 s
    short._ttl_asked = 1.0
    long = grant(s, "long", 2, 1)
    s._jeopardy[("", "long")] = time.monotonic() + 3.0  # the store lets it go sooner
    t = time.monotonic()
    assert broke(s)
    assert s._expire(t + 0.9) is not None and short.held
    assert s._expire(t + 1.1) is not None
    assert not short.held and "TTL passed" in short.lost_reason and long.held
    assert s._expire(t + 3.1) is None and not long.held and s.state == "ended"


def test_without_a_resume_token_a_break_loses_every_lock_at_once():
    s = _Session()
    s.resume_token = ""  # the embedded memory store gives none
    lock = grant(s, "k", 1, 1)
    assert not broke(s) and s.state == "ended"
    assert not lock.held and lock._suspended and "cannot resume sessions" in lock.lost_reason
