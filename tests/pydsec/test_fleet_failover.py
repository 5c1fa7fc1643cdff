"""Losing the node of the first gateway, with real processes and no Slurm: `dsec-launch --no-mpi` (node g0 and its
gateway A), a second gateway B (`dsec-launch --gateway-only`, the same token and node table, as rank 1 of a
Slurm fleet runs it), and a node n1 that joins through the fleet file listing [A, B] (so it registers with both).
Then g0 dies whole (SIGKILL of its process group: the node and gateway A). The same pydsec client, with no
change by the caller, must go on through B: n1's sandbox answers, new creates land on n1, g0's sandboxes are
lost (NodeLostError, info state "lost"). Simulated nodes (real HTTP API, admission, records; no processes).
Skipped when DSEC_LAUNCH_BIN is unset (ctest sets it to the built dsec-launch)."""

import asyncio
import json
import os
import shutil
import signal
import time
from typing import Dict, List

import pytest
from local_fleet import LocalProcesses, node_states, read_json

import pydsec
import pydsec.aio


@pytest.fixture
def two_gateways(monkeypatch):
    local = LocalProcesses("pydsec-failover-")
    name = f"failover{os.getpid()}"
    root = os.path.join(local.base, "root")
    common = ["--simulate", "--root", root, "--address", "127.0.0.1", "--fncall-workers", "0"]
    try:
        local.start("g0", ["--no-mpi", "--fleet", name, *common, "--node-name", "g0"])
        fleet_file = local.fleet_file(name)
        doc = local.until("the fleet file", lambda: read_json(fleet_file))
        assert doc["endpoints"] == [doc["endpoint"]], doc  # dsec-launch lists its gateways
        # Gateway B: its own copies of the token and node table (g0's directory dies with it in spirit).
        gw_dir = os.path.join(local.base, "gateway-b")
        os.makedirs(gw_dir, mode=0o700)
        for f in ("fleet-token", "fleet-nodes.json"):
            shutil.copy(os.path.join(root, "nodes", "g0", f), os.path.join(gw_dir, f))
            os.chmod(os.path.join(gw_dir, f), 0o600)
        config = {"fleet_name": name, "token_file": os.path.join(gw_dir, "fleet-token"),
                  "seed_file": os.path.join(gw_dir, "fleet-nodes.json"),
                  "port_file": os.path.join(gw_dir, "gateway-port"), "address": "127.0.0.1", "port": 0,
                  "lost_after_seconds": 3}
        config_path = os.path.join(gw_dir, "gateway-config.json")
        with open(os.open(config_path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            json.dump(config, f)
        local.start("gateway-b", ["--gateway-only", "--fleet", name, "--gateway-config", config_path])
        port = local.until("gateway B's port", lambda: (read_json(config["port_file"]) or None))
        endpoints = [doc["endpoint"], f"http://127.0.0.1:{port}"]
        with open(fleet_file, "w") as f:  # what rank 0 writes for a fleet with two gateway ranks
            json.dump(dict(doc, endpoints=endpoints), f)
        local.start("n1", ["--join", name, *common, "--node-name", "n1"])
        for ep in endpoints:
            local.until(f"g0 and n1 healthy at {ep}",
                        lambda ep=ep: node_states(ep, doc["token"]) == {"g0": "healthy", "n1": "healthy"})
        monkeypatch.setenv("HOME", local.home)
        monkeypatch.setenv("DSEC_FLEET", name)
        monkeypatch.delenv("DSEC_ENDPOINT", raising=False)
        monkeypatch.delenv("DSEC_TOKEN", raising=False)
        yield {"local": local, "procs": local.procs, "endpoints": endpoints, "token": doc["token"], "name": name}
    finally:
        local.stop(["n1", "gateway-b", "g0"])


def test_the_fleet_serves_on_when_the_first_gateways_node_dies(two_gateways):
    fl = two_gateways
    with pydsec.Client(timeout=30) as c:  # from the fleet file: both gateways, in order
        assert c.endpoints == fl["endpoints"] and c.endpoint == fl["endpoints"][0]
        placed: Dict[str, List[pydsec.Sandbox]] = {"g0": [], "n1": []}
        for _ in range(20):
            sb = c.create(image="debian:12", memory="64M", labels={"rollout": "failover"})
            placed[sb.cached_info["node"]].append(sb)
            if placed["g0"] and placed["n1"]:
                break
        assert placed["g0"] and placed["n1"], {k: len(v) for k, v in placed.items()}
        on_g0, on_n1 = placed["g0"][0], placed["n1"][0]

        os.killpg(fl["procs"]["g0"].pid, signal.SIGKILL)  # the node and gateway A, no cleanup
        killed = time.monotonic()
        fl["procs"]["g0"].wait()

        assert on_n1.info()["state"] == "running"  # through gateway B, no change by the caller
        failover = time.monotonic() - killed
        print(f"failover: first successful call {failover * 1000:.0f} ms after the kill")
        assert c.endpoint == fl["endpoints"][1]

        def g0_lost():
            info = on_g0.info()
            return info if info["state"] == "lost" else None

        def lost_info():
            try:
                return g0_lost()
            except pydsec.NodeLostError as e:  # not answering, not yet declared lost
                assert e.node == "g0"
                return None

        info = fl["local"].until("g0's sandbox seen as lost", lost_info)
        assert info["node"] == "g0" and "node g0 is lost" in info["error"]
        # Once gateway B holds g0 lost, new creates go to the node that is left (before, B may still try g0).
        for _ in range(5):
            assert c.create(image="debian:12", memory="64M").cached_info["node"] == "n1"
        with pytest.raises(pydsec.NodeLostError):
            on_g0.pause()
        assert {s.id for s in c.list(labels={"rollout": "failover"})} >= {s.id for s in placed["n1"]}

    async def through_aio():
        async with pydsec.aio.Client(timeout=30) as ac:
            assert (await ac.sandbox(on_n1.id).info())["state"] == "running"
            assert (await ac.sandbox(on_g0.id).info())["state"] == "lost"
            assert ac.endpoint == fl["endpoints"][1]

    asyncio.run(through_aio())
    with pydsec.Client(timeout=30) as c:
        for sb in placed["n1"]:
            assert c.sandbox(sb.id).destroy()
