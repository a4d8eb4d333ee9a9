"""How a resumed session squares what it holds with what the store says came back
(`SessionBase._resumed`), for the cases a sidecar kill cannot produce on demand: a
Release the dead sidecar applied but never answered, a grant whose answer was lost, a
key that came back with another token. No I/O: the greeting is what a resumed stream
sends (test_resume.py runs the whole thing against real sidecars)."""

from __future__ import annotations

from typing import List

from lockside._core import OPEN, LockBase, Pending, SessionBase, release_request
from lockside._pb import lockside_pb2 as pb


class _Lock(LockBase):
    def _signal_lost(self) -> None:
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

    def _new_lock(self, key, granted, ttl):
        return _Lock(self, key, granted, ttl)


def grant(session: _Session, key: str, token: int, count: int) -> _Lock:
    g = pb.Granted(request_id=0, key=key, fencing_token=token, hold_count=count)
    lock = session._new_lock(key, g, 10.0)
    session._held.setdefault(key, []).append(lock)
    return lock


def release(session: _Session, lock: _Lock) -> tuple:
    rid = next(session._ids)
    pending = _Pending("release", lock.key, release_request(rid, lock.key))
    session._pending[rid] = pending
    return rid, pending


def back(key: str, token: int, count: int):
    return pb.LeaseResponse(
        granted=pb.Granted(request_id=0, key=key, fencing_token=token, hold_count=count)
    )


def lost(key: str):
    return pb.LeaseResponse(lost=pb.Lost(key=key, reason="expired"))


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
