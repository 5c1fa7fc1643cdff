"""Gateway failover and the direct data path, against in-process fake servers.

- A client given several endpoints (a fleet's gateway candidates) moves on when one cannot be connected to, and
  sticks to the one that works; a request that went out and lost its connection is retried on the next endpoint
  only if its method is idempotent (a POST is not sent twice); when every endpoint is gone the error is a
  DsecConnectionError, an InfraError.
- The fleet file's "endpoints" are read in order; "endpoint" alone still works.
- The data path: a sandbox's exec and files go to the node its id names (from the gateway's node table) with the
  fleet token, and through the gateway when that node cannot be connected to or is lost.
"""

import asyncio
import json
import os
import socket
import threading

import pytest

import pydsec
import pydsec.aio
from conftest import FakeHTTPServer

TOKEN = "secret-token"
SID = "n2-0123456789abcdef"
RESULT = {"exit_code": 0, "signal": 0, "stdout": "hi\n", "stderr": "", "timed_out": False, "truncated": False,
          "oom_killed": False, "duration": 0.002}


@pytest.fixture
def servers():
    made = []

    def make():
        s = FakeHTTPServer()
        threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        made.append(s)
        return s

    yield make
    for s in made:
        s.shutdown()
        s.server_close()


def closed_endpoint() -> str:
    """An endpoint nothing listens on (connect refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def healthz(server, name):
    @server.route("GET", "/healthz")
    def _(h, seen):
        h.send_json(200, {"ok": True, "gateway": name})


def test_moves_on_from_an_endpoint_that_refuses_and_sticks(servers):
    b = servers()
    healthz(b, "b")
    dead = closed_endpoint()
    with pydsec.Client(endpoint=[dead, b.endpoint], token=TOKEN, timeout=10) as c:
        assert c.endpoints == [dead, b.endpoint]
        assert c.endpoint == dead
        assert c.health()["gateway"] == "b"
        assert c.endpoint == b.endpoint  # sticks to the one that works
        assert c.health()["gateway"] == "b"
    assert len(b.seen) == 2


def test_a_post_that_may_have_arrived_is_not_sent_again(servers):
    a, b = servers(), servers()

    @a.route("POST", "/v1/sandboxes")
    def drop(h, seen):
        h.close_connection = True  # the request arrived; the connection dies before any answer
        h.wfile.flush()
        h.connection.shutdown(socket.SHUT_RDWR)

    @b.route("POST", "/v1/sandboxes")
    def create(h, seen):
        h.send_json(201, {"id": SID, "node": "n2", "state": "running"})

    @a.route("GET", "/v1/node")
    def drop_get(h, seen):
        h.close_connection = True
        h.connection.shutdown(socket.SHUT_RDWR)

    @b.route("GET", "/v1/node")
    def node(h, seen):
        h.send_json(200, {"node": "gateway"})

    with pydsec.Client(endpoint=[a.endpoint, b.endpoint], token=TOKEN, timeout=10) as c:
        with pytest.raises(pydsec.DsecConnectionError) as ei:
            c.create("testbase:1")
        assert isinstance(ei.value, pydsec.InfraError)
        assert not [s for s in b.seen if s.method == "POST"], "the create was sent twice"
        # An idempotent request goes on to the next gateway.
        assert c.node() == {"node": "gateway"}
        assert c.endpoint == b.endpoint


def test_every_endpoint_gone_is_an_infra_error():
    dead = [closed_endpoint(), closed_endpoint()]
    with pydsec.Client(endpoint=dead, token=TOKEN, timeout=5) as c:
        with pytest.raises(pydsec.DsecConnectionError) as ei:
            c.create("testbase:1")
        assert isinstance(ei.value, pydsec.InfraError)
        assert dead[0] in str(ei.value) and dead[1] in str(ei.value)


def test_fleet_file_endpoints_in_order(tmp_path, monkeypatch, servers):
    b = servers()
    healthz(b, "b")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("DSEC_ENDPOINT", raising=False)
    monkeypatch.delenv("DSEC_TOKEN", raising=False)
    fleets = tmp_path / ".dsec" / "fleets"
    fleets.mkdir(parents=True)
    dead = closed_endpoint()
    (fleets / "two.json").write_text(json.dumps({"endpoint": dead, "endpoints": [dead, b.endpoint],
                                                 "token": TOKEN}))
    (fleets / "one.json").write_text(json.dumps({"endpoint": b.endpoint, "token": TOKEN}))
    with pydsec.Client(fleet="two") as c:
        assert c.endpoints == [dead, b.endpoint]
        assert c.health()["gateway"] == "b"
    with pydsec.Client(fleet="one") as c:
        assert c.endpoints == [b.endpoint]
    monkeypatch.setenv("DSEC_ENDPOINT", f"{dead}, {b.endpoint}/")
    with pydsec.Client(fleet="one") as c:
        assert c.endpoints == [dead, b.endpoint]
    with pytest.raises(pydsec.InvalidRequestError):
        pydsec.Client(endpoint=[" "], token=TOKEN)


def fleet_with_node(servers, node_endpoint, state="healthy"):
    gateway, node = servers(), servers()

    @gateway.route("GET", "/v1/fleet/nodes")
    def nodes(h, seen):
        h.send_json(200, {"fleet": "f", "nodes": [{"name": "n2", "endpoint": node_endpoint or node.endpoint,
                                                   "state": state}]})

    for server, name in ((gateway, "gateway"), (node, "node")):
        def exec_(h, seen, name=name):
            h.send_json(200, dict(RESULT, stdout=f"via {name}\n"))

        def read(h, seen, name=name):
            h.send_raw(200, f"file via {name}".encode())

        server.route("POST", f"/v1/sandboxes/{SID}/exec")(exec_)
        server.route("GET", f"/v1/sandboxes/{SID}/files")(read)
    return gateway, node


def test_direct_data_path_goes_to_the_node_with_the_fleet_token(servers):
    gateway, node = fleet_with_node(servers, None)
    with pydsec.Client(endpoint=gateway.endpoint, token=TOKEN, timeout=10, direct=True) as c:
        sb = c.sandbox(SID)
        assert sb.exec("x").stdout == "via node\n"
        assert sb.read_file("/f") == b"file via node"
    assert [s.headers["Authorization"] for s in node.seen] == [f"Bearer {TOKEN}"] * 2
    assert not [s for s in gateway.seen if "/sandboxes/" in s.path]

    async def through_aio():
        async with pydsec.aio.Client(endpoint=gateway.endpoint, token=TOKEN, timeout=10, direct=True) as ac:
            return (await ac.sandbox(SID).exec("x")).stdout

    assert asyncio.run(through_aio()) == "via node\n"


def test_direct_data_path_falls_back_to_the_gateway(servers):
    gateway, _ = fleet_with_node(servers, closed_endpoint())
    with pydsec.Client(endpoint=gateway.endpoint, token=TOKEN, timeout=10, direct=True) as c:
        assert c.sandbox(SID).exec("x").stdout == "via gateway\n"
    gateway, node = fleet_with_node(servers, None, state="lost")
    with pydsec.Client(endpoint=gateway.endpoint, token=TOKEN, timeout=10, direct=True) as c:
        assert c.sandbox(SID).exec("x").stdout == "via gateway\n"
    assert not node.seen


def test_direct_is_off_for_a_plain_node_and_by_default_for_an_explicit_endpoint(servers):
    plain = servers()  # no /v1/fleet/nodes: a single `dsec serve`

    @plain.route("POST", f"/v1/sandboxes/{SID}/exec")
    def exec_(h, seen):
        h.send_json(200, RESULT)

    with pydsec.Client(endpoint=plain.endpoint, token=TOKEN, timeout=10, direct=True) as c:
        assert c.sandbox(SID).exec("x").stdout == "hi\n"
        assert c.sandbox(SID).exec("x").stdout == "hi\n"
    assert [s.path for s in plain.seen].count("/v1/fleet/nodes") == 1
    gateway, node = fleet_with_node(servers, None)
    with pydsec.Client(endpoint=gateway.endpoint, token=TOKEN, timeout=10) as c:
        assert c.sandbox(SID).exec("x").stdout == "via gateway\n"
    assert not node.seen
