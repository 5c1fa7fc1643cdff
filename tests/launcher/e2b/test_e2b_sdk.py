"""E2B's own JS SDK (npm `e2b`, installed here at test time) against dsec's E2B-compatible listener on a real
`dsec serve` (docs/e2b.md): one agent's whole life (flow.mjs), and the listener's authentication with raw HTTP.

Skips with the reason when DSEC_BIN is unset, we are not root, Node.js is missing, or npm cannot install the SDK."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional, Tuple

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SDK_VERSION = "2.51.0"
IMAGE = "e2bbase:1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(url: str, method: str = "GET", body: Optional[bytes] = None,
            headers: Optional[Dict[str, str]] = None) -> Tuple[int, Any]:
    req = urllib.request.Request(url, data=body, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            data = r.read()
            return r.status, (json.loads(data) if data else None)
    except urllib.error.HTTPError as e:
        data = e.read()
        return e.code, (json.loads(data) if data else None)


@pytest.fixture(scope="module")
def sdk() -> str:
    """A directory with the e2b package installed (kept between runs in E2B_SDK_DIR)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Node.js and npm are needed to run E2B's JS SDK (apt-get install nodejs npm)")
    where = os.environ.get("E2B_SDK_DIR") or os.path.join(tempfile.gettempdir(), "dsec-e2b-sdk")
    os.makedirs(where, exist_ok=True)
    manifest = os.path.join(where, "node_modules", "e2b", "package.json")
    if not os.path.exists(manifest) or json.load(open(manifest)).get("version") != SDK_VERSION:
        r = subprocess.run(["npm", "install", "--prefix", where, "--no-audit", "--no-fund", f"e2b@{SDK_VERSION}"],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            pytest.skip(f"npm could not install e2b@{SDK_VERSION} (is the npm registry reachable?): {r.stderr[-500:]}")
    shutil.copy(os.path.join(HERE, "flow.mjs"), os.path.join(where, "flow.mjs"))
    return where


def busybox_bash_rootfs(path: str) -> None:
    """busybox, with /bin/bash a script running its sh: E2B's SDK runs every command as `/bin/bash -l -c CMD`."""
    busybox = shutil.which("busybox") or "/bin/busybox"
    for d in ("bin", "etc", "tmp", "root", "proc", "dev", "sys"):
        os.makedirs(os.path.join(path, d), exist_ok=True)
    shutil.copy2(busybox, os.path.join(path, "bin", "busybox"))
    applets = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True).stdout.split()
    for applet in applets:
        if applet not in ("busybox", "bash"):
            os.symlink("busybox", os.path.join(path, "bin", applet))
    with open(os.path.join(path, "bin", "bash"), "w") as f:
        f.write('#!/bin/sh\nexec /bin/sh "$@"\n')
    os.chmod(os.path.join(path, "bin", "bash"), 0o755)
    with open(os.path.join(path, "etc", "passwd"), "w") as f:
        f.write("root:x:0:0:root:/root:/bin/sh\n")
    with open(os.path.join(path, "etc", "group"), "w") as f:
        f.write("root:x:0:\n")
    os.chmod(os.path.join(path, "tmp"), 0o1777)


@pytest.fixture(scope="module")
def node():
    binary = os.environ.get("DSEC_BIN")
    if not binary:
        pytest.skip("DSEC_BIN is not set (no dsec binary)")
    if os.geteuid() != 0:
        pytest.skip("dsec serve needs root (namespaces, mounts, cgroups)")
    base = tempfile.mkdtemp(prefix="dsec-e2b-")
    root = os.path.join(base, "root")
    rootfs = os.path.join(base, "rootfs")
    busybox_bash_rootfs(rootfs)
    build = subprocess.run([binary, "layer", "build", IMAGE, "--from-dir", rootfs, "--root", root],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    port, e2b_port = free_port(), free_port()
    log_path = os.path.join(base, "serve.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([binary, "serve", "--root", root, "--listen", f"127.0.0.1:{port}", "--no-fleet-file",
                                 "--fncall-workers", "0", "--e2b-listen", f"127.0.0.1:{e2b_port}",
                                 "--e2b-default-image", IMAGE, "--e2b-template", f"agent={IMAGE}"],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    api = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail("dsec serve exited:\n" + open(log_path).read()[-3000:])
            try:
                if request(api + "/healthz")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        with open(os.path.join(root, "token")) as f:
            token = f.read().strip()
        yield {"url": f"http://127.0.0.1:{e2b_port}", "token": token, "api": api, "log": log_path}
    finally:
        stop(proc)
        subprocess.run(["umount", "-R", "-l", os.path.join(root, "mnt")], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def fleet():
    """A one-node fleet (`dsec-launch --no-mpi`: a real node and its gateway) with the gateway's E2B listener."""
    binary, launch = os.environ.get("DSEC_BIN"), os.environ.get("DSEC_LAUNCH_BIN")
    if not binary or not launch:
        pytest.skip("DSEC_BIN or DSEC_LAUNCH_BIN is not set (ctest sets them)")
    if os.geteuid() != 0:
        pytest.skip("dsec-launch needs root (namespaces, mounts, cgroups)")
    base = tempfile.mkdtemp(prefix="dsec-e2b-fleet-")
    root = os.path.join(base, "root")
    busybox_bash_rootfs(os.path.join(base, "rootfs"))
    build = subprocess.run([binary, "layer", "build", IMAGE, "--from-dir", os.path.join(base, "rootfs"), "--root",
                            root], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    home = os.path.join(base, "home")
    os.makedirs(home)
    name = f"e2b{os.getpid()}"
    e2b_port = free_port()
    log_path = os.path.join(base, "launch.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([launch, "--no-mpi", "--fleet", name, "--root", root, "--address", "127.0.0.1",
                                 "--node-name", "g0", "--fncall-workers", "0", "--gateway-e2b-listen",
                                 f"127.0.0.1:{e2b_port}", "--gateway-e2b-default-image", IMAGE],
                                env=dict(os.environ, HOME=home), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    url = f"http://127.0.0.1:{e2b_port}"
    try:
        fleet_file = os.path.join(home, ".dsec", "fleets", f"{name}.json")
        deadline = time.monotonic() + 90
        token = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with open(fleet_file) as f:
                    token = json.load(f)["token"]
                # Ready once the gateway places a create on its node (it has registered).
                status, body = request(url + "/v2/sandboxes", "POST", b'{"templateID": "base"}',
                                       {"X-API-KEY": token, "Content-Type": "application/json"})
                if status == 201:
                    request(url + "/sandboxes/" + body["sandboxID"], "DELETE", headers={"X-API-KEY": token})
                    break
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.2)
        else:
            pytest.fail("the fleet's E2B listener did not create a sandbox:\n" + open(log_path).read()[-3000:])
        yield {"url": url, "token": token, "log": log_path}
    finally:
        stop(proc)
        subprocess.run(["umount", "-R", "-l", os.path.join(root, "mnt")], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def run_flow(sdk: str, node: Dict[str, str], template: str = "base") -> List[Dict[str, Any]]:
    env = dict(os.environ, E2B_API_URL=node["url"], E2B_SANDBOX_URL=node["url"], E2B_API_KEY=node["token"],
               E2B_TEMPLATE=template)
    r = subprocess.run(["node", "flow.mjs"], cwd=sdk, env=env, capture_output=True, text=True, timeout=300)
    steps = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert r.returncode == 0, f"flow failed: {r.stdout[-3000:]}\n{r.stderr[-3000:]}\nnode log:\n" + \
        open(node["log"]).read()[-3000:]
    return steps


def test_an_agent_loop_through_e2bs_sdk(sdk, node):
    steps = {s["step"]: s["value"] for s in run_flow(sdk, node)}
    assert steps["create"].startswith("n0-")
    assert steps["run"] == {"exitCode": 0, "stdout": "hello\n", "stderr": "oops\n"}
    assert steps["failing"] == {"error": "CommandExitError", "exitCode": 3, "stdout": "before\n"}
    # The background command's output streamed in as it came: its lines, 0.3 s apart, arrive in pieces (three, or
    # two when a starved node read two lines at once), never as one block at the end.
    background = steps["background"]
    assert background["exitCode"] == 0 and background["stdout"] == "line1\nline2\nline3\n", background
    assert 2 <= background["pieces"] <= 3, background
    # commands.kill(pid) signals the command (SIGKILL): its wait ends with the signal's exit status.
    assert steps["kill-command"] is True
    assert steps["killed-wait"]["exitCode"] == 137, steps["killed-wait"]
    assert steps["kill-unknown"] is False
    assert steps["stdin"] == "piped in\n"  # sendStdin twice, then closeStdin: cat saw both and EOF
    assert steps["no-stdin"] == "eof\n"  # a command given no stdin reads EOF at once
    assert steps["env-cwd"] == "hey from /tmp\n"
    assert steps["read"] == "hi there"
    assert steps["list"] == ["hello.txt:file"]
    assert steps["exists"] is True
    assert steps["makeDir"] == [True, False]  # made, then already there
    assert steps["renamed"] == "hi there"
    assert steps["removed"] is False
    info = steps["info"]
    assert info["templateId"] == "base" and info["metadata"] == {"run": "r1", "tag": "a&b=c%41"}
    assert info["state"] == "running"
    assert 55 <= info["lifetime"] <= 120  # setTimeout(60 s) counts from now: the sandbox's end moved
    assert steps["connect"] == "still here\n"
    assert steps["listed"] is True
    assert steps["listed-by-odd-metadata"] == [True, False]  # each filter decoded once, '&' and '%' kept
    assert steps["odd-name"] == {"read": "odd", "listed": True}
    assert steps["kill"] is True and steps["kill-again"] is False


def test_the_same_agent_loop_through_a_fleets_gateway(sdk, fleet):
    steps = {s["step"]: s["value"] for s in run_flow(sdk, fleet)}
    assert steps["create"].startswith("g0-")  # placed on the fleet's node by its gateway
    assert steps["run"] == {"exitCode": 0, "stdout": "hello\n", "stderr": "oops\n"}
    assert steps["background"]["stdout"] == "line1\nline2\nline3\n"
    assert steps["read"] == "hi there" and steps["connect"] == "still here\n"
    assert steps["listed"] is True and steps["kill"] is True and steps["kill-again"] is False


def test_a_template_of_the_table_creates_its_image_and_an_unknown_one_is_refused(node):
    headers = {"X-API-KEY": node["token"], "Content-Type": "application/json"}
    status, body = request(node["url"] + "/v2/sandboxes", "POST", json.dumps({"templateID": "agent"}).encode(),
                           headers)
    assert status == 201, body
    _, info = request(node["api"] + "/v1/sandboxes/" + body["sandboxID"],
                      headers={"Authorization": "Bearer " + node["token"]})
    assert info["image"] == IMAGE and info["labels"]["e2b_template"] == "agent"
    assert request(node["url"] + "/sandboxes/" + body["sandboxID"], "DELETE", headers=headers)[0] == 204
    status, body = request(node["url"] + "/v2/sandboxes", "POST", json.dumps({"templateID": "nope"}).encode(),
                           headers)
    assert status == 201  # the default image serves templates the table does not name
    request(node["url"] + "/sandboxes/" + body["sandboxID"], "DELETE", headers=headers)


def test_what_dsec_does_not_do_is_a_clear_error(node):
    headers = {"X-API-KEY": node["token"]}
    status, body = request(node["url"] + "/sandboxes/n0-0000000000000000/metrics", headers=headers)
    assert status == 501 and "not supported" in body["message"], body
    status, body = request(node["url"] + "/sandboxes/n0-0000000000000000", "DELETE", headers=headers)
    assert status == 404 and body["code"] == 404, body
