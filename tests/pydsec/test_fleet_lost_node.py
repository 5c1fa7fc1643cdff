"""A node lost under a real gateway: `dsec-launch --no-mpi` (a node g0 and the gateway process) and a second node
n1 that joins the fleet (`dsec-launch --join`), both simulated nodes (real HTTP API, admission and records, no
sandbox processes). n1 is killed with SIGKILL; pydsec through the gateway must then see its sandboxes as lost
(sb.info() state "lost", every other request a NodeLostError, an InfraError), while g0's sandboxes are untouched.
No Slurm. Skipped when DSEC_LAUNCH_BIN is unset (ctest sets it to the built dsec-launch)."""

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from typing import Dict, List

import pytest

import pydsec
import pydsec.aio

DEADLINE = 90.0  # seconds; generous, the machine may be busy (the wait is for a condition, not a fixed time)


@dataclass
class Fleet:
    endpoint: str
    token: str
    procs: Dict[str, subprocess.Popen]
    logs: Dict[str, str]

    def client(self) -> pydsec.Client:
        return pydsec.Client(endpoint=self.endpoint, token=self.token, timeout=30)

    def log_tail(self) -> str:
        out = []
        for name, path in self.logs.items():
            with contextlib.suppress(OSError), open(path, "rb") as f:
                out.append(f"--- {name}\n" + f.read()[-3000:].decode("utf-8", errors="replace"))
        return "\n".join(out)


def _until(what: str, fleet_or_none, check, deadline: float = DEADLINE):
    end = time.monotonic() + deadline
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            tail = fleet_or_none.log_tail() if fleet_or_none else ""
            pytest.fail(f"{what}: not within {deadline} s\n{tail}")
        time.sleep(0.05)


def _node_states(fleet: Fleet) -> Dict[str, str]:
    req = urllib.request.Request(fleet.endpoint + "/v1/fleet/nodes",
                                 headers={"Authorization": f"Bearer {fleet.token}"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return {n["name"]: n["state"] for n in json.load(r)["nodes"]}
    except OSError:
        return {}


@pytest.fixture
def fleet():
    binary = os.environ.get("DSEC_LAUNCH_BIN")
    if not binary:
        pytest.skip("integration test: DSEC_LAUNCH_BIN is not set (ctest sets it to the built dsec-launch)")
    base = tempfile.mkdtemp(prefix="pydsec-lost-")
    home = os.path.join(base, "home")
    os.makedirs(home)
    env = dict(os.environ, HOME=home)
    name = f"lost{os.getpid()}"
    common = ["--simulate", "--root", os.path.join(base, "root"), "--address", "127.0.0.1", "--fncall-workers", "0"]
    procs: Dict[str, subprocess.Popen] = {}
    logs: Dict[str, str] = {}

    def start(node: str, args: List[str]) -> None:
        logs[node] = os.path.join(base, f"{node}.log")
        with open(logs[node], "wb") as log:
            procs[node] = subprocess.Popen([binary, *args, *common, "--node-name", node], env=env, stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True)

    try:
        start("g0", ["--no-mpi", "--fleet", name])
        fleet_file = os.path.join(home, ".dsec", "fleets", f"{name}.json")

        def read_fleet_file():
            if procs["g0"].poll() is not None:
                pytest.fail(f"dsec-launch exited with {procs['g0'].returncode}:\n{open(logs['g0']).read()[-3000:]}")
            with contextlib.suppress(OSError, ValueError):
                with open(fleet_file) as f:
                    return json.load(f)
            return None

        doc = _until("the fleet file", None, read_fleet_file)
        fl = Fleet(endpoint=doc["endpoint"], token=doc["token"], procs=procs, logs=logs)
        start("n1", ["--join", name])
        _until("n1 healthy in the gateway's node table", fl, lambda: _node_states(fl).get("n1") == "healthy")
        yield fl
    finally:
        for node in ("n1", "g0"):
            proc = procs.get(node)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)  # g0 stops its gateway process too
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        shutil.rmtree(base, ignore_errors=True)


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
