"""A node lost under a real gateway: `dsec-launch --no-mpi` (a node g0 and the gateway process) and a second node
n1 that joins the fleet (`dsec-launch --join`), both simulated nodes (real HTTP API, admission and records, no
sandbox processes). n1 is killed with SIGKILL; pydsec through the gateway must then see its sandboxes as lost
(sb.info() state "lost", every other request a NodeLostError, an InfraError), while g0's sandboxes are untouched.
No Slurm. Skipped when DSEC_LAUNCH_BIN is unset (ctest sets it to the built dsec-launch)."""

import asyncio
import os
from dataclasses import dataclass
from typing import Dict, List

import pytest
from local_fleet import LocalProcesses, node_states, read_json

import pydsec
import pydsec.aio


@dataclass
class Fleet:
    endpoint: str
    token: str
    local: LocalProcesses

    @property
    def procs(self):
        return self.local.procs

    def client(self) -> pydsec.Client:
        return pydsec.Client(endpoint=self.endpoint, token=self.token, timeout=30)


def _until(what: str, fleet: Fleet, check):
    return fleet.local.until(what, check)


def _node_states(fleet: Fleet) -> Dict[str, str]:
    return node_states(fleet.endpoint, fleet.token)


@pytest.fixture
def fleet():
    local = LocalProcesses("pydsec-lost-")
    name = f"lost{os.getpid()}"
    common = ["--simulate", "--root", os.path.join(local.base, "root"), "--address", "127.0.0.1",
              "--fncall-workers", "0"]
    try:
        local.start("g0", ["--no-mpi", "--fleet", name, *common, "--node-name", "g0"])
        fleet_file = local.fleet_file(name)

        def read_fleet_file():
            if local.procs["g0"].poll() is not None:
                pytest.fail(f"dsec-launch exited with {local.procs['g0'].returncode}:\n{local.log_tail()}")
            return read_json(fleet_file)

        doc = local.until("the fleet file", read_fleet_file)
        fl = Fleet(endpoint=doc["endpoint"], token=doc["token"], local=local)
        local.start("n1", ["--join", name, *common, "--node-name", "n1"])
        _until("n1 healthy in the gateway's node table", fl, lambda: _node_states(fl).get("n1") == "healthy")
        yield fl
    finally:
        local.stop(["n1", "g0"])  # g0 stops its gateway process too


def _lost_info(fleet: Fleet, sb: pydsec.Sandbox):
    """sb.info() once the gateway has declared the node lost; until then the node is merely unreachable."""
    def check():
        try:
            info = sb.info()
        except pydsec.NodeLostError as e:
            assert e.node_state == "unreachable" and e.node == "n1", repr(e)
            return None
        return info if info["state"] == "lost" else None
    return _until(f"{sb.id} seen as lost", fleet, check)


def test_a_killed_node_makes_its_sandboxes_lost(fleet):
    with fleet.client() as c:
        placed: Dict[str, List[pydsec.Sandbox]] = {"g0": [], "n1": []}
        # Placement takes the less loaded of two nodes: a handful of creates lands on both.
        for _ in range(20):
            sb = c.create(image="debian:12", memory="64M", labels={"rollout": "lost-test"})
            placed[sb.cached_info["node"]].append(sb)
            if placed["g0"] and placed["n1"]:
                break
        assert placed["g0"] and placed["n1"], {k: len(v) for k, v in placed.items()}
        on_n1, on_g0 = placed["n1"][0], placed["g0"][0]
        assert on_n1.info()["state"] == "running"

        fleet.procs["n1"].kill()  # SIGKILL: no deregistration, no cleanup; the node is just gone
        fleet.procs["n1"].wait()

        info = _lost_info(fleet, on_n1)
        assert info["id"] == on_n1.id and info["node"] == "n1"
        assert "node n1 is lost" in info["error"]
        assert info["labels"] == {"rollout": "lost-test"}  # the last info seen is kept
        assert _node_states(fleet).get("n1") == "lost"

        # Every other request for it is a NodeLostError, an InfraError: a trainer masks the rollout.
        with pytest.raises(pydsec.InfraError) as ei:
            on_n1.pause()
        e = ei.value
        assert isinstance(e, pydsec.NodeLostError)
        assert (e.node, e.node_state, e.sandbox_id, e.status) == ("n1", "lost", on_n1.id, 503)
        assert e.retry_after is not None and e.retry_after > 0
        with pytest.raises(pydsec.NodeLostError):
            on_n1.exec("true", timeout=5)
        with pytest.raises(pydsec.NodeLostError):
            on_n1.destroy()

        # The other node's sandbox is untouched; the caller's own mistakes stay caller errors.
        assert on_g0.info()["state"] == "running"
        with pytest.raises(pydsec.NotFoundError) as ei:
            c.sandbox("g0-00000000deadbeef").info()
        assert not isinstance(ei.value, pydsec.InfraError)

        async def through_aio():
            async with pydsec.aio.Client(endpoint=fleet.endpoint, token=fleet.token, timeout=30) as ac:
                sb = ac.sandbox(on_n1.id)
                info = await sb.info()
                assert info["state"] == "lost" and sb.state == "lost"
                with pytest.raises(pydsec.NodeLostError):
                    await sb.exec("true", timeout=5)
                assert (await ac.sandbox(on_g0.id).info())["state"] == "running"

        asyncio.run(through_aio())
        for sb in placed["g0"]:
            assert sb.destroy()
