"""Stages through pydsec against a real `dsec serve`: a sandbox created with an egress policy reaches what the
policy lists and nothing else, set_network() changes it while the sandbox runs, and violations() and /metrics show
what was refused. "The world" is a network namespace this test makes (no internet): a veth routed from the node
(198.18.N.0/30) with a TCP service answering "hi" on two addresses."""

import random
import subprocess
import time
import urllib.request
import uuid

import pytest

import pydsec

SERVER = r"""
import socket, sys, threading
def serve(addr, port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((addr, port)); s.listen(64)
    while True:
        c, _ = s.accept(); c.sendall(b"hi\n"); c.close()
port = int(sys.argv[1])
for a in sys.argv[2:]:
    threading.Thread(target=serve, args=(a, port), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""


def ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def world():
    tag = f"{random.randrange(100000)}"
    block = random.randrange(1 << 14) * 4
    base = (198 << 24) + (18 << 16) + block
    dotted = lambda n: ".".join(str((n >> s) & 255) for s in (24, 16, 8, 0))  # noqa: E731
    node_side, addr = dotted(base + 1), dotted(base + 2)
    other = dotted((198 << 24) + (19 << 16) + 1 + random.randrange(65000))
    ns, host_if, world_if = f"dsec-pyw-{tag}", f"dspwh{tag}", f"dspww{tag}"
    port = 20000 + random.randrange(20000)
    ip("netns", "add", ns)
    server = None
    try:
        ip("link", "add", host_if, "type", "veth", "peer", "name", world_if, "netns", ns)
        ip("addr", "add", node_side + "/30", "dev", host_if)
        ip("link", "set", host_if, "up")
        ip("-n", ns, "addr", "add", addr + "/30", "dev", world_if)
        ip("-n", ns, "addr", "add", other + "/32", "dev", world_if)
        ip("-n", ns, "link", "set", world_if, "up")
        ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", ns, "route", "add", "default", "via", node_side)
        ip("route", "add", other + "/32", "via", addr)
        server = subprocess.Popen(["ip", "netns", "exec", ns, "python3", "-c", SERVER, str(port), addr, other],
                                  stdout=subprocess.PIPE, text=True)
        assert server.stdout.readline().strip() == "ready"
        yield {"addr": addr, "other": other, "port": port}
    finally:
        if server is not None:
            server.kill()
            server.wait()
        subprocess.run(["ip", "route", "del", other + "/32"], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def reach(sb, addr, port):
    return sb.exec(f"echo | nc -w 3 {addr} {port} 2>&1", timeout=30).stdout.strip() == "hi"


def wait_for_violation(sb, target, deadline=20.0):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        found = [v for v in sb.violations() if v["target"] == target]
        if found:
            return found[0]
        time.sleep(0.05)
    return None


def test_policy_stages_and_violations(client, dsec, world):
    addr, other, port = world["addr"], world["other"], world["port"]
    sb = client.create(image=dsec.image, network={"egress": [f"{addr}:{port}"]},
                       labels={"suite": "pydsec", "test": uuid.uuid4().hex[:8]})
    try:
        assert sb.cached_info["network"] == "egress"
        assert sb.cached_info["egress"] == [f"{addr}:{port}"]
        # Setup stage: the listed server answers, the rest of its network does not, and the refusal is recorded.
        assert reach(sb, addr, port)
        assert not reach(sb, other, port)
        v = wait_for_violation(sb, f"{other}:{port}")
        assert v is not None, sb.violations()
        assert v["kind"] == "connect" and "policy" in v["detail"] and v["time"] > time.time() - 600
        # Agent stage: nothing.
        info = sb.set_network([])
        assert info["egress"] == []
        assert not reach(sb, addr, port)
        assert wait_for_violation(sb, f"{addr}:{port}") is not None
        # A later stage opens it again.
        assert sb.set_network([addr])["egress"] == [addr]
        assert reach(sb, addr, port)
        # Bad input is refused and changes nothing.
        with pytest.raises(pydsec.InvalidRequestError):
            sb.set_network(["10.0.0.1/8"])
        with pytest.raises(pydsec.InvalidRequestError):
            sb.set_network(["[2001:db8::1]:443"])
        assert sb.info()["egress"] == [addr]
        assert reach(sb, addr, port)
        req = urllib.request.Request(dsec.endpoint + "/metrics", headers={"Authorization": f"Bearer {dsec.token}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            metrics = r.read().decode()
        line = [ln for ln in metrics.splitlines() if ln.startswith('dsec_violations_total{kind="connect"}')]
        assert line and float(line[0].split()[-1]) >= 2, line
    finally:
        sb.destroy()


def test_a_sandbox_without_a_link_has_no_stages(client, dsec):
    sb = client.create(image=dsec.image, labels={"suite": "pydsec"})
    try:
        with pytest.raises(pydsec.ConflictError):
            sb.set_network(["0.0.0.0/0"])
        assert sb.violations() == []
    finally:
        sb.destroy()


def test_arguments_are_checked_before_any_request(client, dsec):
    with pytest.raises(pydsec.InvalidRequestError):
        client.create(image=dsec.image, network={"egres": []})
    with pytest.raises(pydsec.InvalidRequestError):
        client.create(image=dsec.image, network={"egress": "10.0.0.0/8"})
    with pytest.raises(pydsec.InvalidRequestError):
        client.create(image=dsec.image, protect=["relative/path"])


def test_stages_from_asyncio(dsec, world):
    import asyncio

    import pydsec.aio

    addr, port = world["addr"], world["port"]

    async def main():
        async with pydsec.aio.Client(endpoint=dsec.endpoint, token=dsec.token) as c:
            async with c.create(image=dsec.image, network={"egress": [addr]}, protect=["/bin"],
                                labels={"suite": "aio-egress"}) as sb:
                r = await sb.exec(f"echo | nc -w 3 {addr} {port}")
                assert r.stdout.strip() == "hi"
                info = await sb.set_network([])
                assert info["egress"] == []
                r = await sb.exec(f"echo | nc -w 3 {addr} {port} 2>&1")
                assert r.stdout.strip() != "hi"
                assert (await sb.set_protect([]))["protect"] == []
                found = []
                for _ in range(200):
                    found = [v for v in await sb.violations() if v["target"] == f"{addr}:{port}"]
                    if found:
                        break
                    await asyncio.sleep(0.05)
                assert found and found[0]["kind"] == "connect"

    asyncio.run(main())
