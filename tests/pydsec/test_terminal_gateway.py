"""Interactive execs through a real fleet gateway (dsec-launch without MPI, one real container node): streamed
stdin goes through the gateway's forwarding, and the terminal's WebSocket through its tunnel."""

import os
import subprocess

import pytest

import pydsec
from conftest import make_busybox_rootfs
from local_fleet import LocalProcesses, read_json


@pytest.fixture
def fleet(monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("integration test: a container node needs root")
    dsec_bin = os.environ.get("DSEC_BIN")
    if not dsec_bin:
        pytest.skip("integration test: DSEC_BIN is not set")
    local = LocalProcesses("pydsec-terminal-gw-")
    name = f"termgw{os.getpid()}"
    root = os.path.join(local.base, "root")
    try:
        rootfs = os.path.join(local.base, "rootfs")
        make_busybox_rootfs(rootfs)
        build = subprocess.run([dsec_bin, "layer", "build", "testbase:1", "--from-dir", rootfs, "--root", root],
                               capture_output=True, text=True)
        assert build.returncode == 0, build.stderr
        local.start("g0", ["--no-mpi", "--fleet", name, "--root", root, "--address", "127.0.0.1",
                           "--fncall-workers", "0", "--node-name", "g0"])
        doc = local.until("the fleet file", lambda: read_json(local.fleet_file(name)))
        yield pydsec.Client(endpoint=doc["endpoint"], token=doc["token"], direct=False)
    finally:
        local.stop(["g0"])


def test_stdin_and_terminal_through_the_gateway(fleet):
    with fleet.create(image="testbase:1") as sb:
        with sb.exec_stream("cat", stdin=True, timeout=60) as stream:
            stream.stdin.write("via gateway\n")
            assert next(stream) == ("stdout", "via gateway\n")
            stream.stdin.close()
            assert stream.wait().exit_code == 0
        with sb.terminal(["sh"], rows=33, cols=77, timeout=60) as term:
            term.send("stty size; tty; exit 3\n")
            assert term.wait()["exit_code"] == 3
            out = term.output.decode()
            assert "33 77" in out and "/dev/pts/" in out
        with pytest.raises(pydsec.NotFoundError):
            fleet.get(sb.id[:-1] + ("0" if sb.id[-1] != "0" else "1")).terminal()
