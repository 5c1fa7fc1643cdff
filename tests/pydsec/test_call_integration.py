"""client.call / pydsec.aio against a real `dsec serve` whose fncall image is a layer built from the host's
Python (dsec-test-python-rootfs, from tests/backends/fncall). Skips with the reason when DSEC_BIN is unset,
we are not root, or the rootfs tool is not built."""

import asyncio
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import pydsec
import pydsec.aio

from conftest import DsecServer, _free_port, _mounts_under, _wait_healthy

IMAGE = "pyfn:1"


def _rootfs_tool(binary: str) -> str:
    tool = os.environ.get("DSEC_PYTHON_ROOTFS_BIN")
    if tool:
        return tool
    build = os.path.dirname(os.path.dirname(os.path.abspath(binary)))  # <build>/cli/dsec -> <build>
    return os.path.join(build, "tests", "backends", "fncall", "dsec-test-python-rootfs")


def _start(binary, base, name, extra_args):
    root = os.path.join(base, name)
    home = os.path.join(base, "home")
    os.makedirs(home, exist_ok=True)
    env = dict(os.environ, HOME=home)
    build = subprocess.run([binary, "layer", "build", IMAGE, "--from-dir", os.path.join(base, "rootfs"),
                            "--root", root], env=env, capture_output=True, text=True, timeout=300)
    if build.returncode != 0:
        pytest.fail(f"dsec layer build failed:\n{build.stdout}\n{build.stderr}")
    port = _free_port()
    log_path = os.path.join(base, f"{name}.log")
    log = open(log_path, "wb")
    proc = subprocess.Popen([binary, "serve", "--listen", f"127.0.0.1:{port}", "--root", root, "--no-fleet-file",
                             "--fncall-image", IMAGE] + extra_args, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    log.close()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(endpoint, proc, time.monotonic() + 30)
    except RuntimeError as e:
        proc.kill()
        proc.wait()
        with open(log_path, "rb") as f:
            pytest.fail(f"{e}; log:\n{f.read()[-4000:].decode(errors='replace')}")
    with open(os.path.join(root, "token")) as f:
        token = f.read().strip()
    return DsecServer(bin=binary, root=root, home=home, endpoint=endpoint, token=token, fleet="", image=IMAGE,
                      proc=proc, log_path=log_path)


def _stop(server):
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()


@pytest.fixture(scope="module")
def fn_base():
    binary = os.environ.get("DSEC_BIN")
    if not binary:
        pytest.skip("integration test: DSEC_BIN is not set (ctest sets it to the built dsec binary)")
    if os.geteuid() != 0:
        pytest.skip("integration test: dsec serve needs root (namespaces, mounts, cgroups)")
    tool = _rootfs_tool(binary)
    if not os.access(tool, os.X_OK):
        pytest.skip(f"integration test: {tool} is not built (target dsec-test-python-rootfs)")
    base = tempfile.mkdtemp(prefix="pydsec-fncall-")
    made = subprocess.run([tool, os.path.join(base, "rootfs")], capture_output=True, text=True, timeout=300)
    if made.returncode == 3:
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip(f"integration test: {made.stderr.strip()}")
    if made.returncode != 0:
        pytest.fail(f"dsec-test-python-rootfs failed: {made.stderr}")
    try:
        yield binary, base
    finally:
        left = _mounts_under(base)
        if not left:
            shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def fn_server(fn_base):
    # A long queue wait: on a loaded machine many concurrent calls must queue, not be refused (the capacity
    # test has its own node with a short one).
    server = _start(*fn_base, "root", ["--fncall-workers", "4", "--fncall-queue-wait", "60"])
    try:
        yield server
    finally:
        _stop(server)


@pytest.fixture
def fn(fn_server):
    with fn_server.client(timeout=60) as c:
        yield c


def test_call_returns_exec_result(fn):
    r = fn.call("print(sum(range(1000)))")
    assert isinstance(r, pydsec.ExecResult)
    assert r.ok and r.exit_code == 0 and r.stdout == "499500\n" and r.stderr == "" and not r.timed_out
    r = fn.call("import sys; print(sys.stdin.read()[::-1]); sys.exit(4)", stdin="abc")
    assert r.exit_code == 4 and r.stdout == "cba\n" and not r.ok
    r = fn.call('read x; echo "bash $x"', language="bash", stdin=b"in\n")
    assert r.stdout == "bash in\n"


def test_files_in_the_working_directory(fn):
    blob = os.urandom(5000)
    r = fn.call("import hashlib; print(open('data/a.txt').read(), hashlib.sha256(open('b.bin','rb').read()).hexdigest())",
                files={"data/a.txt": "hello", "b.bin": blob})
    import hashlib
    assert r.stdout == f"hello {hashlib.sha256(blob).hexdigest()}\n", r


def test_isolation_between_calls(fn):
    planted = fn.call("import os, builtins\nopen('left', 'w').write('1')\nopen('/tmp/left', 'w').write('1')\n"
                      "os.environ['LEFT'] = '1'\nbuiltins.LEFT = 1\nprint('ok')")
    assert planted.stdout == "ok\n"
    for _ in range(6):
        r = fn.call("import os, builtins\nprint(os.path.exists('left'), os.path.exists('/tmp/left'), "
                    "'LEFT' in os.environ, hasattr(builtins, 'LEFT'))")
        assert r.stdout == "False False False False\n", r


def test_timeout(fn):
    t0 = time.monotonic()
    r = fn.call("import time\nprint('started', flush=True)\ntime.sleep(60)", timeout=1)
    assert time.monotonic() - t0 < 30
    assert r.timed_out and r.exit_code == 137 and not r.ok and r.stdout == "started\n"
    assert fn.call("print('after')").stdout == "after\n"


def test_missing_image_is_not_found(fn):
    with pytest.raises(pydsec.NotFoundError, match="nope:1"):
        fn.call("print(1)", image="nope:1")


def test_server_validation_matches_client(fn):
    # Bypass the client-side checks: the server refuses the same things with 400.
    with pytest.raises(pydsec.InvalidRequestError, match="language"):
        fn._transport.call("POST", "/v1/call", payload={"code": "1", "language": "ruby"})
    with pytest.raises(pydsec.InvalidRequestError, match=r"\.\."):
        fn._transport.call("POST", "/v1/call", payload={"code": "1", "files": {"../x": ""}})


def test_node_lists_fncall_and_no_worker_sandboxes(fn):
    fn.call("print(1)")
    node = fn.node()
    assert "fncall" in node["backends"] and node["fncall"]["workers"] >= 1
    assert fn.list() == []
    assert "dsec_fncall_calls_total" in fn.metrics()


def test_many_concurrent_calls_sync(fn):
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda i: fn.call(f"print({i} * 2)"), range(200)))
    assert [r.stdout for r in results] == [f"{i * 2}\n" for i in range(200)]


def test_many_concurrent_calls_asyncio(fn_server):
    async def main():
        async with pydsec.aio.Client(endpoint=fn_server.endpoint, token=fn_server.token, timeout=60,
                                     max_workers=16) as c:
            return await asyncio.gather(*(c.call(f"print({i} + 1)") for i in range(200)))

    results = asyncio.run(main())
    assert [r.stdout for r in results] == [f"{i + 1}\n" for i in range(200)]


def test_capacity_error_with_retry_after(fn_base):
    server = _start(*fn_base, "tiny", ["--fncall-workers", "1", "--fncall-queue-wait", "0.2"])
    try:
        with server.client(timeout=60) as c:
            # The one worker starts with the node; until it is up a call may see 429 (the queue wait is 0.2 s).
            deadline = time.monotonic() + 120
            while True:
                try:
                    assert c.call("print(0)").stdout == "0\n"  # now the one worker is warm
                    break
                except pydsec.CapacityError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            done = threading.Event()
            holder = {}

            def long_call():
                holder["r"] = c.call("import time; time.sleep(8)", timeout=30)
                done.set()

            t = threading.Thread(target=long_call)
            t.start()
            deadline = time.monotonic() + 20
            while c.node()["fncall"]["busy"] < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert c.node()["fncall"]["busy"] >= 1
            with pytest.raises(pydsec.CapacityError) as ei:
                c.call("print(1)")
            assert ei.value.retry_after == 1 and ei.value.status == 429
            t.join(60)
            assert done.is_set() and holder["r"].ok
            assert c.call("print(2)").stdout == "2\n"
    finally:
        _stop(server)
