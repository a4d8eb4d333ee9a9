"""The README's recipe for resuming a session after a sidecar restart, run as written:
the code block is taken from README.md, so the documentation cannot drift from what
works."""

from __future__ import annotations

import queue
import re
import time
from pathlib import Path

from recipe_stubs import stubs


def recipe() -> dict:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("Underneath, on the gRPC stream itself", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code, "the README has the recipe"
    scope: dict = {}
    exec(compile(code.group(1), "README.md", "exec"), scope)
    return scope


def test_the_readme_recipe_resumes_a_session_on_the_restarted_sidecar(own_stack, key, tmp_path):
    # The recipe is for applications that speak gRPC themselves: it runs on grpcio and
    # stubs of their own (the package itself needs neither).
    pb = stubs(tmp_path)
    r = recipe()
    sidecar = own_stack.sidecar
    requests: queue.SimpleQueue = queue.SimpleQueue()
    lease = r["grpc"].insecure_channel(sidecar.addr).stream_stream(
        r["LEASE"],
        request_serializer=pb.LeaseRequest.SerializeToString,
        response_deserializer=pb.LeaseResponse.FromString,
    )
    responses = lease(iter(requests.get, None))
    started = next(responses).started
    requests.put(pb.LeaseRequest(acquire=pb.Acquire(request_id=1, key=key)))
    granted = next(responses).granted
    assert granted.key == key and started.resume_token
    # The sidecar's journal lists a grant once it has been held 50 ms.
    time.sleep(0.3)
    sidecar.kill()
    broke = time.monotonic()
    restarted = own_stack.start_sidecar(listen=sidecar.addr)
    assert restarted.addr == sidecar.addr
    # Until the TTL (the sidecar's default, 10 s) has passed since the break.
    resumed = r["resume_session"](restarted.addr, started.resume_token, broke + 10.0)
    assert resumed is not None, "resumed before the TTL passed"
    new_requests, new_responses, new_started, events = resumed
    assert new_started.session_id == started.session_id
    assert new_started.resume_token != started.resume_token
    back = events[key].granted
    assert (back.request_id, back.fencing_token, back.hold_count) == (0, granted.fencing_token, 1)
    new_requests.put(pb.LeaseRequest(release=pb.Release(request_id=2, key=key)))
    assert next(new_responses).released.hold_count == 0
    new_requests.put(None)
    requests.put(None)
