"""Infrastructure errors are their own family: every answer the gateway and the nodes give (the bodies below are
the ones launcher/fleet/src/GatewayRoutes.cc, GatewayForward.cc, GatewayCall.cc and launcher/api send) and every
transport failure maps to an InfraError when the platform is at fault, and to another DsecError when the
caller's request is; what the sandbox's own code does is an ExecResult, never an exception. Each answer comes
from an in-process fake server, through the sync and the asyncio clients."""

import asyncio
import json
import socket
import threading

import pytest

import pydsec
import pydsec.aio
from pydsec._tar import UnsafeArchiveError

SID = "n2-0123456789abcdef"
INFO = {"id": SID, "node": "n2", "image": "testbase:1", "backend": "container", "state": "running",
        "labels": {"rollout": "7"}, "memory": 536870912}
RESULT = {"exit_code": 0, "signal": 0, "stdout": "", "stderr": "", "timed_out": False, "truncated": False,
          "oom_killed": False, "duration": 0.002}

# What the gateway answers for a sandbox of a node it declared lost (Gateway::sendLost) ...
LOST = (503, {"error": {"code": "unavailable",
                        "message": f"node n2 is lost (last seen 4.1s ago); sandbox {SID} is lost",
                        "node": "n2", "node_state": "lost", "sandbox": SID, "retry_after": 5}}, {"Retry-After": "5"})
# ... and for one whose node did not answer the forwarded request (Gateway::sendNodeError).
UNREACHABLE = (503, {"error": {"code": "unavailable",
                               "message": f"node n2 is not answering (connecting to http://10.0.0.2:1: Connection "
                                          f"refused); sandbox {SID} may be lost",
                               "node": "n2", "node_state": "unreachable", "sandbox": SID, "retry_after": 2}},
               {"Retry-After": "2"})


def err(code, message, **more):
    return {"error": dict(code=code, message=message, **more)}


# (status, body, headers) -> the class, and whether the platform is at fault.
ANSWERS = {
    "node_lost": (LOST, pydsec.NodeLostError, True),
    "node_unreachable": (UNREACHABLE, pydsec.NodeLostError, True),
    "node_not_registered_yet": ((503, err("unavailable", "node n2 has not registered with the gateway yet (the "
                                          "gateway started 1.2 ago); retry", retry_after=1, node="n2"),
                                 {"Retry-After": "1"}), pydsec.UnavailableError, True),
    "no_live_node": ((503, err("unavailable", "no live node in fleet rollout"), {}), pydsec.UnavailableError, True),
    "call_no_node_answered": ((503, err("unavailable", "no node of fleet rollout answered the call (n1: reset)",
                                        retry_after=1), {"Retry-After": "1"}), pydsec.UnavailableError, True),
    "too_many_connections_503": ((503, err("unavailable", "too many connections (1024)"), {"Retry-After": "1"}),
                                 pydsec.UnavailableError, True),
    "capacity": ((429, err("capacity", "no node of fleet rollout has room", retry_after=1), {"Retry-After": "1"}),
                 pydsec.CapacityError, True),
    "output_budget": ((429, err("capacity", "output budget in use", resource="output_budget", retry_after=1), {}),
                      pydsec.CapacityError, True),
    "client_connections": ((429, err("too_many_connections", "too many connections without a valid token",
                                     limit=64, client="uid 0", retry_after=1), {}), pydsec.CapacityError, True),
    "platform_timeout": ((504, err("timeout", "sandbox init not ready after 30 s"), {}), pydsec.DsecTimeoutError,
                         True),
    "internal": ((500, err("internal", "mount: No space left on device"), {}), pydsec.ServerError, True),
    "proxy_502": ((502, "<html>bad gateway</html>", {}), pydsec.ServerError, True),
    "bad_request": ((400, err("invalid_request", "memory: not a size"), {}), pydsec.InvalidRequestError, False),
    "too_large": ((413, err("too_large", "body over 1 MiB"), {}), pydsec.TooLargeError, False),
    "unauthorized": ((401, err("unauthorized", "missing or wrong bearer token"), {}), pydsec.AuthError, False),
    "wrong_id": ((404, err("not_found", f"no sandbox '{SID}'"), {}), pydsec.NotFoundError, False),
    "conflict": ((409, err("conflict", "sandbox is being destroyed"), {}), pydsec.ConflictError, False),
    "unsupported": ((501, err("unsupported", "no healthy node offers fncall"), {}), pydsec.UnsupportedError, False),
}


def serve(fake, method, path, answer):
    status, body, headers = answer

    @fake.route(method, path)
    def handler(h, seen):
        if isinstance(body, str):
            h.send_raw(status, body.encode(), "text/html", headers)
        else:
            h.send_json(status, body, headers)


def test_the_families():
    infra = [pydsec.CapacityError, pydsec.DsecTimeoutError, pydsec.DsecConnectionError, pydsec.ServerError,
             pydsec.UnavailableError, pydsec.NodeLostError]
    caller = [pydsec.InvalidRequestError, pydsec.TooLargeError, pydsec.AuthError, pydsec.NotFoundError,
              pydsec.ConflictError, pydsec.UnsupportedError, UnsafeArchiveError]
    for cls in infra:
        assert issubclass(cls, pydsec.InfraError), cls
    for cls in caller:
        assert not issubclass(cls, pydsec.InfraError), cls
    for cls in infra + caller + [pydsec.InfraError]:
        assert issubclass(cls, pydsec.DsecError), cls  # `except DsecError` still catches everything
    # What a 503 was before (a ServerError) it still is, and the builtin bases are kept.
    assert issubclass(pydsec.NodeLostError, pydsec.UnavailableError)
    assert issubclass(pydsec.UnavailableError, pydsec.ServerError)
    assert issubclass(pydsec.DsecTimeoutError, TimeoutError)
    assert issubclass(pydsec.DsecConnectionError, ConnectionError)
    for name in ("InfraError", "UnavailableError", "NodeLostError"):
        assert getattr(pydsec.aio, name) is getattr(pydsec, name)


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_each_answer_maps_to_its_family(fake, name):
    answer, cls, infra = ANSWERS[name]
    serve(fake, "POST", f"/v1/sandboxes/{SID}/exec", answer)
    with fake.client() as c, pytest.raises(pydsec.DsecError) as ei:
        c.sandbox(SID).exec("true")
    e = ei.value
    assert type(e) is cls, repr(e)
    assert isinstance(e, pydsec.InfraError) is infra
    assert e.status == answer[0]
    if isinstance(e, pydsec.InfraError) and answer[0] in (429, 503) and "retry_after" in answer[1]["error"]:
        assert e.retry_after == answer[1]["error"]["retry_after"]


def test_node_lost_names_node_sandbox_and_state(fake):
    serve(fake, "GET", f"/v1/sandboxes/{SID}/files", LOST)
    serve(fake, "POST", f"/v1/sandboxes/{SID}/pause", UNREACHABLE)
    with fake.client() as c:
        sb = c.sandbox(SID)
        with pytest.raises(pydsec.NodeLostError) as ei:
            sb.read_file("/etc/hostname")
        e = ei.value
        assert (e.node, e.node_state, e.sandbox_id, e.retry_after) == ("n2", "lost", SID, 5)
        assert e.code == "unavailable" and "node n2 is lost" in str(e)
        with pytest.raises(pydsec.NodeLostError) as ei:
            sb.pause()
        assert (ei.value.node_state, ei.value.retry_after) == ("unreachable", 2)


def test_info_of_a_sandbox_on_a_lost_node_says_lost(fake):
    answers = iter([(201, INFO, {}), LOST])

    @fake.route("POST", "/v1/sandboxes")
    def create(h, seen):
        h.send_json(*next(answers)[:2])

    serve(fake, "GET", f"/v1/sandboxes/{SID}", LOST)
    with fake.client() as c:
        sb = c.create(image="testbase:1", labels={"rollout": "7"})
        assert sb.state == "running"
        info = sb.info()
        assert info["state"] == "lost" and sb.state == "lost"
        assert info["id"] == SID and info["node"] == "n2"
        assert "node n2 is lost" in info["error"]
        assert sb.labels == {"rollout": "7"}  # the last info seen is kept: the trainer finds its rollout
        assert repr(sb).endswith(" lost>")
        # A handle made from the id alone (e.g. after a trainer restart) says lost as well.
        got = c.get(SID)
        assert got.state == "lost" and got.cached_info["node"] == "n2"


def test_info_of_an_unreachable_node_raises(fake):
    serve(fake, "GET", f"/v1/sandboxes/{SID}", UNREACHABLE)
    with fake.client() as c:
        sb = c.sandbox(SID)
        with pytest.raises(pydsec.NodeLostError) as ei:
            sb.info()
        assert ei.value.node_state == "unreachable"
        assert sb.cached_info is None


def test_aio_maps_the_same(fake):
    serve(fake, "GET", f"/v1/sandboxes/{SID}", LOST)
    serve(fake, "POST", f"/v1/sandboxes/{SID}/exec", LOST)
    serve(fake, "POST", "/v1/sandboxes", ANSWERS["capacity"][0])

    async def main():
        async with pydsec.aio.Client(endpoint=fake.endpoint, token="secret-token", timeout=10) as c:
            sb = c.sandbox(SID)
            info = await sb.info()
            assert info["state"] == "lost" and sb.state == "lost"
            with pytest.raises(pydsec.NodeLostError) as ei:
                await sb.exec("true")
            assert ei.value.node == "n2"
            with pytest.raises(pydsec.InfraError) as ei:
                await c.create(image="x")
            assert isinstance(ei.value, pydsec.CapacityError)

    asyncio.run(main())


# ---- transport failures ---------------------------------------------------------------------------------
def test_connection_refused_is_infra():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    with pydsec.Client(endpoint=f"http://127.0.0.1:{port}", token="t", timeout=2) as c:
        with pytest.raises(pydsec.InfraError) as ei:
            c.sandbox(SID).exec("true")
    assert isinstance(ei.value, pydsec.DsecConnectionError) and isinstance(ei.value, ConnectionError)


def test_connection_reset_before_the_answer_is_infra(fake):
    @fake.route("POST", f"/v1/sandboxes/{SID}/exec")
    def reset(h, seen):
        # SO_LINGER 0: close with a RST, as a node that died does.
        h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        h.connection.close()
        h.close_connection = True

    with fake.client() as c, pytest.raises(pydsec.InfraError) as ei:
        c.sandbox(SID).exec("true")
    assert isinstance(ei.value, pydsec.DsecConnectionError)


def test_no_answer_in_time_is_infra(fake):
    release = threading.Event()

    @fake.route("GET", f"/v1/sandboxes/{SID}")
    def hang(h, seen):
        release.wait(10)

    try:
        with fake.client(timeout=0.3) as c, pytest.raises(pydsec.InfraError) as ei:
            c.sandbox(SID).info()
        assert isinstance(ei.value, pydsec.DsecTimeoutError) and isinstance(ei.value, TimeoutError)
    finally:
        release.set()


def test_stream_cut_midway_is_infra(fake):
    # The gateway ends a forwarded stream early (the connection closes) when the node dies under it.
    @fake.route("POST", f"/v1/sandboxes/{SID}/exec/stream")
    def cut(h, seen):
        h.start_chunked()
        h.chunk(b'{"stdout": "step 1\\n"}\n')
        h.wfile.write(b"40\r\n{\"stdout\": \"st")  # a chunk announced, then the connection is gone
        h.wfile.flush()
        h.close_connection = True

    with fake.client() as c:
        stream = c.sandbox(SID).exec_stream("train")
        assert next(stream) == ("stdout", "step 1\n")
        with pytest.raises(pydsec.InfraError) as ei:
            list(stream)
    assert isinstance(ei.value, pydsec.DsecConnectionError)


@pytest.mark.parametrize("code,cls", [("internal", pydsec.ServerError), ("capacity", pydsec.CapacityError),
                                      ("timeout", pydsec.DsecTimeoutError)])
def test_stream_error_line_is_an_error_not_a_result(fake, code, cls):
    # ExecRoute.cc: a failure after the output started is the last line, with "done" (never an exit code).
    @fake.route("POST", f"/v1/sandboxes/{SID}/exec/stream")
    def failing(h, seen):
        h.start_chunked()
        h.chunk(b'{"stdout": "partial"}\n')
        h.chunk(json.dumps({"error": {"code": code, "message": "reading the output: EIO"}, "done": True}).encode()
                + b"\n")
        h.end_chunked()

    with fake.client() as c:
        with pytest.raises(pydsec.InfraError) as ei:
            c.sandbox(SID).exec_stream("x").wait()
    assert type(ei.value) is cls and ei.value.code == code and "EIO" in ei.value.message


def test_the_sandbox_code_failing_is_a_result(fake):
    # Non-zero exit, the command's own timeout and an OOM kill of user code are the policy's: results.
    answers = iter([dict(RESULT, exit_code=3), dict(RESULT, exit_code=137, signal=9, timed_out=True),
                    dict(RESULT, exit_code=137, signal=9, oom_killed=True)])

    @fake.route("POST", f"/v1/sandboxes/{SID}/exec")
    def exec_(h, seen):
        h.send_json(200, next(answers))

    with fake.client() as c:
        sb = c.sandbox(SID)
        results = [sb.exec("x", timeout=5) for _ in range(3)]
    assert [r.ok for r in results] == [False, False, False]
    assert (results[1].timed_out, results[2].oom_killed) == (True, True)


def test_a_trainer_masks_lost_rollouts(fake):
    # The pattern of docs/fleet.md, "Masking rollouts lost to the infrastructure".
    results = {"n1-00000000000000aa": (200, dict(RESULT, exit_code=0)),
               "n1-00000000000000bb": (200, dict(RESULT, exit_code=1)),
               SID: LOST[:2]}
    for sid, (status, body) in results.items():
        serve(fake, "POST", f"/v1/sandboxes/{sid}/exec", (status, body, {}))

    def rollout(client, sid):
        r = client.sandbox(sid).exec("python3 grade.py", timeout=60)
        return 1.0 if r.ok else 0.0

    rewards, masked = {}, []
    with fake.client() as c:
        for sid in results:
            try:
                rewards[sid] = rollout(c, sid)
            except pydsec.InfraError:
                masked.append(sid)  # lost to the platform: not a zero reward
    assert rewards == {"n1-00000000000000aa": 1.0, "n1-00000000000000bb": 0.0}
    assert masked == [SID]


def test_retry_after_falls_back_to_the_header(fake):
    serve(fake, "DELETE", f"/v1/sandboxes/{SID}", (503, err("unavailable", "node n2 is lost", node="n2",
                                                            node_state="lost", sandbox=SID), {"Retry-After": "7"}))
    with fake.client() as c, pytest.raises(pydsec.NodeLostError) as ei:
        c.sandbox(SID).destroy()
    assert ei.value.retry_after == 7
