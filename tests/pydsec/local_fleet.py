"""Real dsec-launch processes on localhost for the fleet tests without Slurm (test_fleet_lost_node.py,
test_fleet_failover.py): a temporary base directory with its own HOME (so fleet files stay in it), processes
started in their own sessions with their output in per-process logs, polling for a condition with the logs in
the failure, and a stop that never leaves a process behind."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from typing import Any, Callable, Dict, Iterable, List, Optional

import pytest

DEADLINE = 90.0  # seconds; generous, the machine may be busy (a deadline for a condition, never a fixed wait)


def launch_binary() -> str:
    binary = os.environ.get("DSEC_LAUNCH_BIN")
    if not binary:
        pytest.skip("integration test: DSEC_LAUNCH_BIN is not set (ctest sets it to the built dsec-launch)")
    return binary


def read_json(path: str) -> Any:
    with contextlib.suppress(OSError, ValueError):
        with open(path) as f:
            return json.load(f)
    return None


def node_states(endpoint: str, token: str) -> Dict[str, str]:
    """The gateway's node table, name -> state; {} when it cannot be asked."""
    req = urllib.request.Request(endpoint + "/v1/fleet/nodes", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return {n["name"]: n["state"] for n in json.load(r)["nodes"]}
    except OSError:
        return {}


class LocalProcesses:
    def __init__(self, prefix: str) -> None:
        self.binary = launch_binary()
        self.base = tempfile.mkdtemp(prefix=prefix)
        self.home = os.path.join(self.base, "home")
        os.makedirs(self.home)
        self.env = dict(os.environ, HOME=self.home)
        self.procs: Dict[str, subprocess.Popen] = {}
        self.logs: Dict[str, str] = {}

    def fleet_file(self, name: str) -> str:
        return os.path.join(self.home, ".dsec", "fleets", f"{name}.json")

    def start(self, name: str, args: List[str]) -> subprocess.Popen:
        self.logs[name] = os.path.join(self.base, f"{name}.log")
        with open(self.logs[name], "wb") as log:
            self.procs[name] = subprocess.Popen([self.binary, *args], env=self.env, stdout=log,
                                                stderr=subprocess.STDOUT, start_new_session=True)
        return self.procs[name]

    def log_tail(self) -> str:
        out = []
        for name, path in self.logs.items():
            with contextlib.suppress(OSError), open(path, "rb") as f:
                out.append(f"--- {name}\n" + f.read()[-3000:].decode("utf-8", errors="replace"))
        return "\n".join(out)

    def until(self, what: str, check: Callable[[], Any], deadline: float = DEADLINE) -> Any:
        """Polls check() until it returns something true; fails the test with every log's tail at the deadline,
        or at once when a started process has exited."""
        end = time.monotonic() + deadline
        while True:
            value = check()
            if value:
                return value
            if time.monotonic() > end:
                pytest.fail(f"{what}: not within {deadline} s\n{self.log_tail()}")
            time.sleep(0.05)

    def stop(self, order: Optional[Iterable[str]] = None) -> None:
        """SIGTERM (in `order`, then the rest), SIGKILL of the process group after 60 s; removes the base dir."""
        names = list(order or []) + [n for n in self.procs if n not in (order or [])]
        for name in names:
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        shutil.rmtree(self.base, ignore_errors=True)
