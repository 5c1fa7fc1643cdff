"""POST /run_code end to end, driven exactly as a SandboxFusion client drives it (a plain HTTP POST of the JSON, as
verl's sandbox_fusion reward code does): python, bash and cpp against a real `dsec serve`, including a compile
error, run timeouts, stdin, files in and fetch_files out, bad input, and the listener without authentication; then
once through the gateway of a one-node `dsec-launch --no-mpi` fleet.

The fncall image is the host's Python (dsec-test-python-rootfs, tests/backends/fncall); the cpp image is that plus
a g++ layer made from the host's Debian packages (gxx_rootfs.py). Skips with the reason when DSEC_BIN is unset, we
are not root, or the host lacks what the images are made of."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any, Dict, Optional, Tuple

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PY_IMAGE = "pyfn:1"
CPP_IMAGE = "pyfn:1+gxx:1"
DEADLINE = 90.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: Any, token: Optional[str] = None, timeout: float = 120) -> Tuple[int, Dict[str, Any]]:
    """What verl's call_sandbox_api does: json.dumps the payload, POST it with these headers, read the JSON."""
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def wait_healthy(endpoint: str, proc: subprocess.Popen, log: str) -> None:
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        if proc.poll() is not None:
            break
        try:
            with urllib.request.urlopen(endpoint + "/healthz", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    with open(log, "rb") as f:
        pytest.fail(f"{endpoint} did not become healthy; log:\n{f.read()[-4000:].decode(errors='replace')}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def images():
    binary = os.environ.get("DSEC_BIN")
    if not binary:
        pytest.skip("integration test: DSEC_BIN is not set (ctest sets it to the built dsec binary)")
    if os.geteuid() != 0:
        pytest.skip("integration test: dsec serve needs root (namespaces, mounts, cgroups)")
    tool = os.environ.get("DSEC_PYTHON_ROOTFS_BIN", "")
    if not os.access(tool, os.X_OK):
        pytest.skip(f"integration test: dsec-test-python-rootfs is not built ({tool!r})")
    base = tempfile.mkdtemp(prefix="dsec-run-code-")
    home = os.path.join(base, "home")
    os.makedirs(home)
    env = dict(os.environ, HOME=home)
    made = subprocess.run([tool, os.path.join(base, "py")], capture_output=True, text=True, timeout=300)
    if made.returncode == 3:
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip(f"integration test: {made.stderr.strip()}")
    assert made.returncode == 0, made.stderr
    gxx = subprocess.run([sys.executable, os.path.join(HERE, "gxx_rootfs.py"), os.path.join(base, "gxx")],
                         capture_output=True, text=True, timeout=600)
    if gxx.returncode == 3:
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip(f"integration test: {gxx.stderr.strip()}")
    assert gxx.returncode == 0, gxx.stderr
    root = os.path.join(base, "root")
    for name, src in ((PY_IMAGE, "py"), ("gxx:1", "gxx")):
        built = subprocess.run([binary, "layer", "build", name, "--from-dir", os.path.join(base, src), "--root", root],
                               env=env, capture_output=True, text=True, timeout=600)
        assert built.returncode == 0, f"dsec layer build {name}:\n{built.stdout}\n{built.stderr}"
        shutil.rmtree(os.path.join(base, src), ignore_errors=True)
    try:
        yield {"bin": binary, "base": base, "root": root, "env": env}
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def node(images):
    port, open_port = free_port(), free_port()
    log = os.path.join(images["base"], "serve.log")
    with open(log, "wb") as out:
        proc = subprocess.Popen([images["bin"], "serve", "--listen", f"127.0.0.1:{port}", "--root", images["root"],
                                 "--no-fleet-file", "--fncall-image", PY_IMAGE, "--fncall-workers", "2",
                                 "--fncall-queue-wait", "60", "--run-code-cpp-image", CPP_IMAGE,
                                 "--run-code-listen", f"127.0.0.1:{open_port}"],
                                env=images["env"], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(endpoint, proc, log)
        with open(os.path.join(images["root"], "token")) as f:
            token = f.read().strip()
        yield {"endpoint": endpoint, "open": f"http://127.0.0.1:{open_port}", "token": token, "log": log}
    finally:
        stop(proc)


def run(node, body, **kw) -> Dict[str, Any]:
    status, answer = post(node["endpoint"] + "/run_code", body, node["token"], **kw)
    assert status == 200, answer
    return answer


def assert_shape(answer: Dict[str, Any]) -> None:
    assert set(answer) == {"status", "message", "compile_result", "run_result", "executor_pod_name", "files"}, answer
    for part in ("compile_result", "run_result"):
        if answer[part] is not None:
            assert set(answer[part]) == {"status", "execution_time", "return_code", "stdout", "stderr"}, answer


def test_python_stdout_and_stdin(node):
    a = run(node, {"code": "import sys\nprint(sum(map(int, sys.stdin.read().split())))", "language": "python",
                   "stdin": "1 2 3\n", "compile_timeout": 10, "run_timeout": 10, "files": {}, "fetch_files": []})
    assert_shape(a)
    assert a["status"] == "Success" and a["message"] == "" and a["compile_result"] is None, a
    r = a["run_result"]
    assert r["status"] == "Finished" and r["return_code"] == 0 and r["stdout"] == "6\n" and r["stderr"] == "", a
    assert isinstance(r["execution_time"], float) and r["execution_time"] >= 0
    assert a["files"] == {}


def test_python_failure_and_timeout(node):
    a = run(node, {"code": "import sys\nprint('oops', file=sys.stderr)\nsys.exit(3)", "language": "python"})
    assert a["status"] == "Failed" and a["message"] == "", a
    assert a["run_result"]["return_code"] == 3 and a["run_result"]["stderr"] == "oops\n", a
    t = run(node, {"code": "import time\nprint('started', flush=True)\ntime.sleep(60)", "language": "python",
                   "run_timeout": 1})
    assert t["status"] == "Failed", t
    assert t["run_result"]["status"] == "TimeLimitExceeded" and t["run_result"]["return_code"] is None, t
    assert t["run_result"]["stdout"] == "started\n", t


def test_bash_files_in_and_fetch_files_out(node):
    a = run(node, {"code": "tr a-z A-Z < data/in.txt > out.txt; cat data/in.txt; wc -c < data/bin.dat > n.txt",
                   "language": "bash", "files": {"data/in.txt": b64(b"hello\n"), "data/bin.dat": b64(bytes(range(256)))},
                   "fetch_files": ["out.txt", "n.txt", "missing.txt", "data"]})
    assert_shape(a)
    assert a["status"] == "Success", a
    assert a["run_result"]["stdout"] == "hello\n", a
    # Only regular files come back; what is missing (or a directory) is left out, as SandboxFusion does.
    assert set(a["files"]) == {"out.txt", "n.txt"}, a
    assert base64.b64decode(a["files"]["out.txt"]) == b"HELLO\n"
    assert base64.b64decode(a["files"]["n.txt"]).strip() == b"256"


def test_python_fetch_keeps_stdin_exit_code_and_binary_files(node):
    code = ("import sys\nopen('out.bin', 'wb').write(bytes(range(256)) * 3)\n"
            "sys.stdout.write(sys.stdin.read().upper())\nsys.exit(4)")
    a = run(node, {"code": code, "language": "python", "stdin": "abc", "fetch_files": ["out.bin"]})
    assert a["status"] == "Failed" and a["run_result"]["return_code"] == 4, a
    assert a["run_result"]["stdout"] == "ABC", a
    assert base64.b64decode(a["files"]["out.bin"]) == bytes(range(256)) * 3
    # A time limit with fetch_files is still a time limit, and what was written before it comes back.
    t = run(node, {"code": "open('partial.txt', 'w').write('so far')\nimport time\ntime.sleep(60)",
                   "language": "python", "run_timeout": 1, "fetch_files": ["partial.txt"]})
    assert t["run_result"]["status"] == "TimeLimitExceeded" and t["run_result"]["return_code"] is None, t
    assert base64.b64decode(t["files"]["partial.txt"]) == b"so far"


def test_memory_limit_is_enforced(node):
    hog = "data = b'x' * (400 << 20)\nprint(len(data))"
    a = run(node, {"code": hog, "language": "python", "memory_limit_MB": 64})
    assert a["status"] == "Failed" and a["run_result"]["return_code"] != 0, a
    assert a["run_result"]["stdout"] == "", a
    # With fetch_files too (the run goes through the fetch driver): the program's doing, not a platform error.
    f = run(node, {"code": hog, "language": "python", "memory_limit_MB": 64, "fetch_files": ["x"]})
    assert f["status"] == "Failed" and f["run_result"]["return_code"] != 0, f
    ok = run(node, {"code": hog, "language": "python", "memory_limit_MB": 1024})
    assert ok["status"] == "Success" and ok["run_result"]["stdout"] == str(400 << 20) + "\n", ok
    cpp = run(node, {"code": "#include <cstring>\n#include <cstdlib>\nint main() { char* p = (char*)malloc(400 << 20); "
                             "memset(p, 1, 400 << 20); return p[12345] - 1; }",
                     "language": "cpp", "compile_timeout": 60, "memory_limit_MB": 1024})
    assert cpp["status"] == "Success", cpp
    cpp = run(node, {"code": "#include <cstring>\n#include <cstdlib>\nint main() { char* p = (char*)malloc(400 << 20); "
                             "memset(p, 1, 400 << 20); return p[12345] - 1; }",
                     "language": "cpp", "compile_timeout": 60, "memory_limit_MB": 200})
    assert cpp["status"] == "Failed" and cpp["compile_result"]["return_code"] == 0, cpp
    assert cpp["run_result"]["return_code"] != 0, cpp


CPP_SUM = "#include <iostream>\nint main() { long a, b; std::cin >> a >> b; std::cout << a + b << std::endl; }\n"


def test_cpp_compile_and_run_with_stdin(node):
    a = run(node, {"code": CPP_SUM, "language": "cpp", "stdin": "40 2\n", "compile_timeout": 60, "run_timeout": 10})
    assert_shape(a)
    assert a["status"] == "Success", a
    assert a["compile_result"]["status"] == "Finished" and a["compile_result"]["return_code"] == 0, a
    assert a["run_result"]["stdout"] == "42\n" and a["run_result"]["return_code"] == 0, a


def test_cpp_compile_error(node):
    a = run(node, {"code": "int main() { return undeclared; }", "language": "cpp", "compile_timeout": 60})
    assert_shape(a)
    assert a["status"] == "Failed" and a["message"] == "", a
    c = a["compile_result"]
    assert c["status"] == "Finished" and c["return_code"] != 0 and "undeclared" in c["stderr"], a
    assert a["run_result"] is None, a


def test_cpp_run_timeout_files_and_fetch(node):
    a = run(node, {"code": "#include <fstream>\nint main() { std::ifstream in(\"in/x.txt\"); std::string s; in >> s; "
                           "std::ofstream(\"out.txt\") << s << s; for (;;) {} }",
                   "language": "cpp", "compile_timeout": 60, "run_timeout": 1, "files": {"in/x.txt": b64(b"ab")},
                   "fetch_files": ["out.txt"]})
    assert a["status"] == "Failed", a
    assert a["run_result"]["status"] == "TimeLimitExceeded" and a["run_result"]["return_code"] is None, a
    assert base64.b64decode(a["files"]["out.txt"]) == b"abab", a


def test_cpp_sandboxes_are_destroyed(node):
    req = urllib.request.Request(node["endpoint"] + "/v1/sandboxes",
                                 headers={"Authorization": f"Bearer {node['token']}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert json.load(r)["sandboxes"] == []


@pytest.mark.parametrize("body,mention", [
    ({"code": "x", "language": "go"}, "unsupported language"),
    ({"code": "x", "language": "python", "files": {"a.txt": "@@@"}}, "not base64"),
    ({"code": "x", "language": "python", "files": {"/etc/x": "aGk="}}, "absolute"),
    ({"code": "x", "language": "python", "fetch_files": ["../../etc/shadow"]}, "fetch_files[0]"),
    ({"code": "x", "language": "python", "run_timeout": 0}, "run_timeout"),
    ({"code": "x", "language": "python", "memory_limit_MB": 1}, "memory_limit_MB"),
])
def test_bad_input_is_a_clear_error_in_sandboxfusions_shape(node, body, mention):
    status, a = post(node["endpoint"] + "/run_code", body, node["token"])
    assert status == 400, a
    assert a["status"] == "SandboxError" and mention in a["message"], a
    assert a["run_result"] is None and a["compile_result"] is None and a["files"] == {}, a
    assert a["error"]["code"] == "invalid_request", a
    status, a = post(node["endpoint"] + "/run_code", b"{not json", node["token"])
    assert status == 400 and a["status"] == "SandboxError", a


def test_oversized_body_is_413(node):
    """A body over 64 MiB is refused from its Content-Length, in SandboxFusion's shape, before it is read."""
    port = int(node["endpoint"].rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        head = (f"POST /run_code HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {node['token']}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {(64 << 20) + 1}\r\n\r\n")
        s.sendall(head.encode() + b'{"code": "')
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            reply += chunk
    status_line, _, rest = reply.partition(b"\r\n")
    assert b" 413 " in status_line, reply[:500]
    body = json.loads(rest.split(b"\r\n\r\n", 1)[1])
    assert body["status"] == "SandboxError" and body["error"]["code"] == "too_large", body


def test_authentication_and_the_open_listener(node):
    body = {"code": "print('open')", "language": "python"}
    status, a = post(node["endpoint"] + "/run_code", body)  # no token on the API's own listener
    assert status == 401, a
    status, a = post(node["open"] + "/run_code", body)  # the listener without authentication
    assert status == 200 and a["run_result"]["stdout"] == "open\n", a
    # Nothing else of the API is served there, with or without a token.
    status, a = post(node["open"] + "/v1/call", {"code": "print(1)"}, node["token"])
    assert status == 404, a
    req = urllib.request.Request(node["open"] + "/v1/sandboxes", headers={"Authorization": f"Bearer {node['token']}"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 404


def test_through_the_gateway(images, node):
    """Once through a fleet's gateway: `dsec-launch --no-mpi` (a real node and its gateway), with the token and on
    the gateway's listener without authentication."""
    launch = os.environ.get("DSEC_LAUNCH_BIN")
    if not launch:
        pytest.skip("DSEC_LAUNCH_BIN is not set (ctest sets it to the built dsec-launch)")
    name = f"runcode{os.getpid()}"
    open_port = free_port()
    log = os.path.join(images["base"], "launch.log")
    with open(log, "wb") as out:
        proc = subprocess.Popen([launch, "--no-mpi", "--fleet", name, "--root", images["root"], "--address",
                                 "127.0.0.1", "--node-name", "g0", "--fncall-image", PY_IMAGE, "--fncall-workers",
                                 "1", "--fncall-queue-wait", "60", "--run-code-cpp-image", CPP_IMAGE,
                                 "--gateway-run-code-listen", f"127.0.0.1:{open_port}"],
                                env=images["env"], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        fleet_file = os.path.join(images["env"]["HOME"], ".dsec", "fleets", f"{name}.json")
        end = time.monotonic() + DEADLINE
        doc = None
        while time.monotonic() < end and proc.poll() is None:
            try:
                with open(fleet_file) as f:
                    doc = json.load(f)
                status, a = post(doc["endpoint"] + "/run_code", {"code": "print(7*6)", "language": "python"},
                                 doc["token"])
                if status == 200:
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        with open(log, "rb") as f:
            tail = f.read()[-4000:].decode(errors="replace")
        assert doc is not None and status == 200, f"{status} {a}\n{tail}"
        assert a["status"] == "Success" and a["run_result"]["stdout"] == "42\n", a
        c = post(f"http://127.0.0.1:{open_port}/run_code",
                 {"code": CPP_SUM, "language": "cpp", "stdin": "1 2", "compile_timeout": 60})
        assert c[0] == 200 and c[1]["run_result"]["stdout"] == "3\n", c
        status, a = post(doc["endpoint"] + "/run_code", {"code": "x", "language": "rust"}, doc["token"])
        assert status == 400 and a["status"] == "SandboxError" and "unsupported language" in a["message"], a
    finally:
        stop(proc)
