"""CPU QoS on create (docs/qos.md): qos="latency" | "batch" goes on the wire as given (default: not sent, the
node's default is batch), bad values are refused before any request, and against a real node the sandbox's
info reports its class and cpuset."""

import asyncio
import json
import os

import pytest

import pydsec
import pydsec.aio

INFO = {"id": "n0-0123456789abcdef", "node": "n0", "image": "testbase:1", "backend": "container",
        "state": "running", "labels": {}}


@pytest.mark.parametrize("qos", ["latency", "batch"])
def test_qos_is_sent_sync_and_aio(fake, qos):
    @fake.route("POST", "/v1/sandboxes")
    def create(h, seen):
        h.send_json(201, dict(INFO, qos=json.loads(seen.body).get("qos", "batch")))

    with fake.client() as c:
        sb = c.create(image="testbase:1", cpus=1, qos=qos)
        assert sb.cached_info["qos"] == qos
        c.create(image="testbase:1")

    async def main():
        async with pydsec.aio.Client(endpoint=fake.endpoint, token="secret-token") as c:
            sb = await c.create(image="testbase:1", cpus=1, qos=qos)
            return sb.cached_info["qos"]

    assert asyncio.run(main()) == qos
    bodies = [json.loads(s.body) for s in fake.seen]
    assert bodies[0] == {"image": "testbase:1", "backend": "container", "cpus": 1, "qos": qos}
    assert "qos" not in bodies[1]
    assert bodies[2]["qos"] == qos


@pytest.mark.parametrize("qos", ["realtime", "", 1, "LATENCY"])
def test_bad_qos_is_refused_before_sending(qos):
    with pydsec.Client(endpoint="http://127.0.0.1:1", token="t", timeout=2) as c:
        with pytest.raises(pydsec.InvalidRequestError, match="qos"):
            c.create(image="x", qos=qos)

    async def main():
        async with pydsec.aio.Client(endpoint="http://127.0.0.1:1", token="t", timeout=2) as c:
            c.create(image="x", qos=qos)

    with pytest.raises(pydsec.InvalidRequestError, match="qos"):
        asyncio.run(main())


def test_latency_and_batch_info_on_a_real_node(client, dsec):
    batch = client.create(image=dsec.image, cpus=1)
    try:
        info = batch.info()
        assert info["qos"] == "batch"
        # The sandbox runs SCHED_IDLE (policy 5) inside.
        r = batch.exec("grep '^policy' /proc/self/sched | tr -s ' ' | cut -d' ' -f3")
        assert r.stdout.strip() == "5"
        if os.cpu_count() < 2:
            pytest.skip("a latency sandbox needs a core besides the shared one")
        try:
            lat = client.create(image=dsec.image, cpus=1, qos="latency")
        except pydsec.CapacityError as e:
            pytest.skip(f"no dedicated core free on this node: {e}")
        try:
            info = lat.info()
            assert info["qos"] == "latency"
            assert isinstance(info["cpuset"], str) and info["cpuset"]
            allowed = lat.exec("grep Cpus_allowed_list /proc/self/status | cut -f2").stdout.strip()
            assert allowed == info["cpuset"]
            # The batch sandbox no longer runs there.
            assert batch.info()["cpuset"] != info["cpuset"]
            # One core stays shared on this node: a second latency sandbox is refused with 429.
            if os.cpu_count() == 2:
                with pytest.raises(pydsec.CapacityError, match="dedicated cores"):
                    client.create(image=dsec.image, cpus=1, qos="latency")
        finally:
            lat.destroy()
    finally:
        batch.destroy()
