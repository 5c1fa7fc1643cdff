"""Fixtures for the pydsec tests.

- ``fake``: a tiny in-process HTTP/1.1 server (http.server) whose routes a test defines, for error paths, stream
  parsing and connection handling without a real node.
- ``dsec``: a real ``dsec serve`` (binary from $DSEC_BIN) on a free port with a temporary --root and a busybox
  test layer ``testbase:1``; tests using it are skipped with a reason when DSEC_BIN is unset or we are not root.
"""

from __future__ import annotations

import contextlib
import http.server
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
_SRC = os.path.normpath(os.path.join(HERE, "..", "..", "pydsec"))
if importlib.util.find_spec("pydsec") is None:  # not installed and no PYTHONPATH (ctest sets it): use the tree
    sys.path.insert(0, _SRC)

import pydsec  # noqa: E402


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", "vm: boots microvm/vm guests (own ctest entry, one at a time)")


# ---------------------------------------------------------------------------------------------------------
# Fake server
# ---------------------------------------------------------------------------------------------------------
@dataclass
class Seen:
    method: str
    path: str
    headers: Dict[str, str]
    body: bytes
    conn_id: int


Handler = Callable[["FakeHandler", Seen], None]


class FakeHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: "FakeHTTPServer"

    def log_message(self, *args: Any) -> None:  # keep pytest output clean
        pass

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.connections += 1
            self.conn_id = self.server.connections

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        seen = Seen(self.command, self.path, dict(self.headers.items()), body, self.conn_id)
        with self.server.lock:
            self.server.seen.append(seen)
        route = self.server.routes.get((self.command, self.path.split("?")[0]))
        if route is None:
            self.send_json(404, {"error": {"code": "not_found", "message": f"no route {self.path}"}})
            return
        route(self, seen)

    do_GET = do_POST = do_PUT = do_DELETE = _handle

    # helpers for route functions
    def send_json(self, status: int, doc: Any, headers: Optional[Dict[str, str]] = None) -> None:
        data = json.dumps(doc).encode()
        self.send_raw(status, data, "application/json", headers)

    def send_raw(self, status: int, data: bytes, ctype: str = "application/octet-stream",
                 headers: Optional[Dict[str, str]] = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def start_chunked(self, status: int = 200, ctype: str = "application/x-ndjson") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def end_chunked(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class FakeHTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), FakeHandler)
        self.routes: Dict[Tuple[str, str], Handler] = {}
        self.seen: List[Seen] = []
        self.lock = threading.Lock()
        self.connections = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def route(self, method: str, path: str) -> Callable[[Handler], Handler]:
        def register(fn: Handler) -> Handler:
            self.routes[(method, path)] = fn
            return fn
        return register

    def client(self, **kwargs: Any) -> pydsec.Client:
        kwargs.setdefault("timeout", 10)
        return pydsec.Client(endpoint=self.endpoint, token="secret-token", **kwargs)


@pytest.fixture
def fake():
    server = FakeHTTPServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------------------------------------------------
# Real `dsec serve`
# ---------------------------------------------------------------------------------------------------------
BUSYBOX_APPLETS = ["sh", "ls", "cat", "echo", "sleep", "tar", "ps", "mkdir", "rm", "env", "id", "true", "false",
                   "head", "wc", "cp", "mv", "touch", "stat", "printf", "pwd", "hostname", "kill", "test", "grep",
                   "sed", "tail", "sort", "uname", "yes", "dd", "seq", "ln", "chmod", "readlink", "sha256sum",
                   "md5sum", "tr", "cut", "wait", "timeout", "find", "du", "df", "mount", "whoami", "nc"]


@dataclass
class DsecServer:
    bin: str
    root: str
    home: str
    endpoint: str
    token: str
    fleet: str
    image: str
    proc: subprocess.Popen
    log_path: str
    extra: Dict[str, Any] = field(default_factory=dict)

    def client(self, **kwargs: Any) -> pydsec.Client:
        return pydsec.Client(endpoint=self.endpoint, token=self.token, **kwargs)

    def log_tail(self, n: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-n:].decode("utf-8", errors="replace")
        except OSError:
            return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_busybox_rootfs(path: str) -> None:
    busybox = shutil.which("busybox") or "/bin/busybox"
    for d in ("bin", "etc", "tmp", "root", "work", "proc", "dev", "sys"):
        os.makedirs(os.path.join(path, d), exist_ok=True)
    shutil.copy2(busybox, os.path.join(path, "bin", "busybox"))
    for applet in BUSYBOX_APPLETS:
        os.symlink("busybox", os.path.join(path, "bin", applet))
    with open(os.path.join(path, "etc", "passwd"), "w") as f:
        f.write("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")
    with open(os.path.join(path, "etc", "group"), "w") as f:
        f.write("root:x:0:\nnogroup:x:65534:\n")
    os.chmod(os.path.join(path, "tmp"), 0o1777)


def _mounts_under(path: str) -> List[str]:
    out = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                mnt = line.split()[4]
                if mnt == path or mnt.startswith(path + "/"):
                    out.append(mnt)
    except OSError:
        pass
    return out


def _wait_healthy(endpoint: str, proc: subprocess.Popen, deadline: float) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dsec serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(endpoint + "/healthz", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError("dsec serve did not become healthy within the deadline")


def stop_process(proc: subprocess.Popen, timeout: float = 30) -> None:
    """SIGTERM, then SIGKILL if it has not exited within timeout."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_store_node(binary: str, env: Dict[str, str], base: str, store: str) -> Dict[str, Any]:
    """A `dsec serve --store STORE` node (a directory or a chunk server's URL) on a free port, root base/node and a
    64M chunk cache, healthy: {"proc", "endpoint", "token", "root", "client"}. The caller stops proc."""
    root = os.path.join(base, "node")
    port = _free_port()
    log_path = os.path.join(base, "serve.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([binary, "serve", "--listen", f"127.0.0.1:{port}", "--root", root, "--no-fleet-file",
                                 "--store", store, "--chunk-cache", "64M"], env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(endpoint, proc, time.monotonic() + 30)
    except RuntimeError as e:
        stop_process(proc)
        with open(log_path, "rb") as f:
            pytest.fail(f"{e}; log:\n{f.read()[-4000:].decode(errors='replace')}")
    with open(os.path.join(root, "token")) as f:
        token = f.read().strip()
    client = pydsec.Client(endpoint=endpoint, token=token, timeout=120)
    return {"proc": proc, "endpoint": endpoint, "token": token, "root": root, "client": client}


def integration_binary() -> str:
    """The built dsec binary for tests that run `dsec serve`; skips, saying why, without it or without root."""
    binary = os.environ.get("DSEC_BIN")
    if not binary:
        pytest.skip("integration test: DSEC_BIN is not set (ctest sets it to the built dsec binary)")
    if os.geteuid() != 0:
        pytest.skip("integration test: dsec serve needs root (namespaces, mounts, cgroups)")
    if not os.access(binary, os.X_OK):
        pytest.fail(f"DSEC_BIN={binary} is not an executable file")
    return binary


@pytest.fixture(scope="session")
def dsec():
    binary = integration_binary()

    base = tempfile.mkdtemp(prefix="pydsec-it-")
    root = os.path.join(base, "root")
    home = os.path.join(base, "home")
    rootfs = os.path.join(base, "rootfs")
    os.makedirs(home)
    make_busybox_rootfs(rootfs)
    env = dict(os.environ, HOME=home)  # the fleet file goes to our temp HOME, not the real one
    build = subprocess.run([binary, "layer", "build", "testbase:1", "--from-dir", rootfs, "--root", root],
                           env=env, capture_output=True, text=True, timeout=300)
    if build.returncode != 0:
        pytest.fail(f"dsec layer build failed ({build.returncode}):\n{build.stdout}\n{build.stderr}")

    port = _free_port()
    fleet = f"pytest{os.getpid()}"
    log_path = os.path.join(base, "serve.log")
    log = open(log_path, "wb")
    proc = subprocess.Popen([binary, "serve", "--listen", f"127.0.0.1:{port}", "--root", root,
                             "--fleet-name", fleet], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    endpoint = f"http://127.0.0.1:{port}"
    server = None
    try:
        try:
            _wait_healthy(endpoint, proc, time.monotonic() + 30)
        except RuntimeError as e:
            log.flush()
            with open(log_path, "rb") as f:
                pytest.fail(f"{e}; log:\n{f.read()[-4000:].decode(errors='replace')}")
        token = None
        fleet_file = os.path.join(home, ".dsec", "fleets", f"{fleet}.json")
        # The node writes its fleet file just after it starts answering.
        deadline = time.monotonic() + 30
        while not os.path.exists(fleet_file) and time.monotonic() < deadline:
            time.sleep(0.05)
        for candidate in (fleet_file,):
            with contextlib.suppress(OSError, ValueError):
                with open(candidate) as f:
                    token = json.load(f).get("token")
        if not token:
            with open(os.path.join(root, "token")) as f:
                token = f.read().strip()
        server = DsecServer(bin=binary, root=root, home=home, endpoint=endpoint, token=token, fleet=fleet,
                            image="testbase:1", proc=proc, log_path=log_path)
        server.extra["fleet_file"] = fleet_file
        yield server
    finally:
        # The node leaves sandboxes running on SIGTERM (a restart re-adopts them): destroy ours first.
        if server is not None:
            with contextlib.suppress(Exception):
                c = server.client(timeout=30)
                for sb in c.list():
                    with contextlib.suppress(Exception):
                        sb.destroy()
                c.close()
        stop_process(proc)
        log.close()
        left = _mounts_under(base)
        if left:
            sys.stderr.write(f"pydsec tests: mounts left under {base}, not removing it: {left}\n")
        else:
            shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def client(dsec):
    c = dsec.client(timeout=60)
    try:
        yield c
    finally:
        c.close()
