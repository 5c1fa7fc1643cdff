"""pydsec (sync) against a real `dsec serve` with the busybox layer testbase:1 (see conftest.dsec)."""

import hashlib
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

import pydsec


@pytest.fixture
def sb(client, dsec):
    box = client.create(image=dsec.image, labels={"suite": "pydsec", "test": uuid.uuid4().hex[:8]})
    try:
        yield box
    finally:
        box.destroy()


def test_fleet_file_written_and_discovered(dsec, monkeypatch):
    monkeypatch.setenv("HOME", dsec.home)
    monkeypatch.delenv("DSEC_ENDPOINT", raising=False)
    monkeypatch.delenv("DSEC_TOKEN", raising=False)
    mode = os.stat(dsec.extra["fleet_file"]).st_mode & 0o777
    assert mode == 0o600
    with pydsec.Client(fleet=dsec.fleet) as c:
        assert c.endpoint.rstrip("/") == dsec.endpoint
        assert c.health()["status"] == "ok"
        assert isinstance(c.layers(), list)


def test_layers_lists_testbase(client):
    names = {f"{m['name']}:{m['version']}" for m in client.layers()}
    assert "testbase:1" in names


def test_create_exec_info_destroy(client, dsec):
    sb = client.create(image=dsec.image, memory="256M", pids=256, env={"GREETING": "hello"},
                       labels={"suite": "pydsec"})
    try:
        assert sb.id and sb.cached_info["state"] == "running"
        r = sb.exec("echo $GREETING; echo err >&2; exit 3")
        assert r.exit_code == 3 and r.stdout == "hello\n" and r.stderr == "err\n" and not r.timed_out
        assert r.duration >= 0
        r = sb.exec(["sh", "-c", "echo $0 $1", "a", "b c"], cwd="/tmp", env={"X": "1"})
        assert r.stdout == "a b c\n"
        assert sb.exec("pwd", cwd="/tmp").stdout == "/tmp\n"
        assert sb.exec("cat", stdin="from stdin").stdout == "from stdin"
        assert sb.exec("wc -c", stdin=bytes(range(256))).stdout.strip() == "256"
        info = sb.info()
        assert info["id"] == sb.id and info["image"] == dsec.image and info["memory"] == 256 * 1024 * 1024
        assert client.get(sb.id).cached_info["id"] == sb.id
    finally:
        assert sb.destroy() is True
    assert sb.destroy() is False  # idempotent
    with pytest.raises(pydsec.NotFoundError):
        client.get(sb.id)


def test_state_survives_between_execs(sb):
    sb.exec("echo 42 > /tmp/state; sleep 300 >/dev/null 2>&1 &")
    assert sb.exec("cat /tmp/state").stdout == "42\n"
    assert "sleep 300" in sb.exec("ps").stdout


def test_set_timeout_counts_from_now_and_zero_means_none(sb):
    info = sb.set_timeout(600)
    assert 600 <= info["timeout"] < 600 + 120  # its age (seconds) plus 600
    assert sb.set_timeout(0)["timeout"] == 0
    with pytest.raises(pydsec.InvalidRequestError):
        sb.set_timeout(-1)


def test_exec_timeout(sb):
    t0 = time.monotonic()
    r = sb.exec("echo started; sleep 30", timeout=1)
    assert time.monotonic() - t0 < 15
    assert r.timed_out and r.exit_code == 137 and not r.ok
    assert r.stdout == "started\n"


def test_exec_stream_yields_incrementally(sb):
    stream = sb.exec_stream("echo one; sleep 1; echo two >&2; sleep 1; echo three")
    got = []
    times = []
    t0 = time.monotonic()
    for item in stream:
        got.append(item)
        times.append(time.monotonic() - t0)
    assert got == [("stdout", "one\n"), ("stderr", "two\n"), ("stdout", "three\n")]
    assert times[0] < 0.9 and times[2] > 1.5  # the first chunk arrived long before the command ended
    assert stream.result.exit_code == 0 and stream.result.stdout == "one\nthree\n"


def test_files(sb):
    info = sb.write_file("/work/dir/a.txt", "hello\n")
    assert info["size"] == 6
    assert sb.read_file("/work/dir/a.txt") == b"hello\n"
    sb.write_file("/work/dir/run.sh", b"#!/bin/sh\necho ran\n", mode=0o755)
    assert sb.exec("/work/dir/run.sh").stdout == "ran\n"
    st = sb.stat("/work/dir/run.sh")
    assert st["size"] == 19 and st["type"] == "file" and st["mode"] & 0o777 == 0o755
    names = {e["name"]: e for e in sb.list_dir("/work/dir")}
    assert set(names) == {"a.txt", "run.sh"}
    assert names["a.txt"]["size"] == 6 and names["a.txt"]["type"] == "file"
    assert {e["name"]: e["type"] for e in sb.list_dir("/work")} == {"dir": "dir"}
    sb.remove("/work/dir/a.txt")
    assert not sb.exists("/work/dir/a.txt")
    with pytest.raises(pydsec.NotFoundError):
        sb.read_file("/work/dir/a.txt")
    sb.remove("/work", recursive=True)
    assert sb.exec("test -e /work").exit_code != 0
    binary = bytes(range(256)) * 10
    sb.write_file("/tmp/bin", binary)
    assert sb.read_file("/tmp/bin") == binary


def test_upload_download(sb, tmp_path):
    src = tmp_path / "src"
    (src / "pkg" / "sub").mkdir(parents=True)
    (src / "main.py").write_text("print('main')\n")
    (src / "pkg" / "sub" / "data.bin").write_bytes(os.urandom(100000))
    os.symlink("sub/data.bin", src / "pkg" / "link")
    sb.upload(str(src), "/work/up")
    assert sb.exec("cat /work/up/main.py").stdout == "print('main')\n"
    assert sb.exec("readlink /work/up/pkg/link").stdout == "sub/data.bin\n"
    sb.exec("mkdir -p /work/up/made && echo inside > /work/up/made/f")
    dst = tmp_path / "dst"
    sb.download("/work/up", str(dst))
    assert (dst / "main.py").read_text() == "print('main')\n"
    assert (dst / "pkg" / "sub" / "data.bin").read_bytes() == (src / "pkg" / "sub" / "data.bin").read_bytes()
    assert os.readlink(dst / "pkg" / "link") == "sub/data.bin"
    assert (dst / "made" / "f").read_text() == "inside\n"


def test_download_refuses_escaping_links(sb, tmp_path):
    sb.exec("mkdir -p /work/evil && ln -s /etc/passwd /work/evil/abs && ln -s ../../.. /work/evil/up")
    with pytest.raises(pydsec.UnsafeArchiveError):
        sb.download("/work/evil", str(tmp_path / "dst"))


def test_pause_resume(sb):
    sb.exec("sleep 300 >/dev/null 2>&1 &")
    assert sb.pause()["state"] == "paused"
    assert sb.info()["state"] == "paused"
    assert sb.resume()["state"] == "running"
    assert sb.exec("echo back").stdout == "back\n"


def test_exec_on_paused_resumes(sb):
    sb.pause()
    assert sb.exec("echo auto").stdout == "auto\n"
    assert sb.info()["state"] == "running"


def test_list_by_labels(client, dsec):
    run = uuid.uuid4().hex[:8]
    made = [client.create(image=dsec.image, labels={"run": run, "idx": str(i)}) for i in range(3)]
    try:
        found = client.list(labels={"run": run})
        assert {s.id for s in found} == {s.id for s in made}
        assert all(s.cached_info["labels"]["run"] == run for s in found)
        one = client.list(labels={"run": run, "idx": "1"})
        assert [s.id for s in one] == [made[1].id]
        assert client.list(labels={"run": "nobody-" + run}) == []
        assert made[0].id in {s.id for s in client.list()}
    finally:
        for s in made:
            s.destroy()
    assert client.list(labels={"run": run}) == []


def test_context_manager_destroys(client, dsec):
    with client.create(image=dsec.image) as sb:
        assert sb.exec("true").ok
        sid = sb.id
    with pytest.raises(pydsec.NotFoundError):
        client.get(sid)
    with pytest.raises(ZeroDivisionError):
        with client.create(image=dsec.image) as sb2:
            sid2 = sb2.id
            1 / 0
    with pytest.raises(pydsec.NotFoundError):
        client.get(sid2)


def test_errors(client, dsec):
    with pytest.raises(pydsec.NotFoundError) as ei:
        client.create(image="nosuchlayer:9")
    assert "nosuchlayer:9" in ei.value.message
    with pytest.raises(pydsec.InvalidRequestError):
        client.create(image=dsec.image, memory="1P0")  # refused client-side
    # Refused by the server: impossible limits.
    with pytest.raises(pydsec.InvalidRequestError) as ei:
        client.create(image=dsec.image, memory=1)
    assert ei.value.status == 400 and "memory" in ei.value.message
    with pytest.raises(pydsec.InvalidRequestError) as ei:
        client.create(image=dsec.image, memory="100T")
    assert ei.value.status == 400 and "memory" in ei.value.message
    with pydsec.Client(endpoint=dsec.endpoint, token="wrong-token") as bad:
        with pytest.raises(pydsec.AuthError) as ei:
            bad.list()
        assert ei.value.status == 401
        assert bad.health()["status"] == "ok"  # /healthz needs no token
    with pytest.raises(pydsec.NotFoundError):
        client.sandbox("n0-0000000000000000").exec("true")


def test_32_concurrent_creates_from_threads(client, dsec):
    run = uuid.uuid4().hex[:8]
    barrier = threading.Barrier(32)

    def one(i):
        barrier.wait()
        sb = client.create(image=dsec.image, labels={"run": run})
        try:
            r = sb.exec(["echo", str(i)])
            assert r.stdout == f"{i}\n"
            return sb.id
        finally:
            sb.destroy()

    with ThreadPoolExecutor(32) as pool:
        ids = list(pool.map(one, range(32)))
    assert len(set(ids)) == 32
    assert client.list(labels={"run": run}) == []


def test_20mb_round_trip_streamed(sb, tmp_path):
    src = tmp_path / "big.bin"
    with open(src, "wb") as f:
        for _ in range(20):
            f.write(os.urandom(1024 * 1024))
    sb.write_file_from("/tmp/big.bin", str(src))
    assert sb.stat("/tmp/big.bin")["size"] == 20 * 1024 * 1024
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    assert sb.exec("sha256sum /tmp/big.bin").stdout.split()[0] == digest
    back = tmp_path / "back.bin"
    assert sb.read_file_to("/tmp/big.bin", str(back)) == 20 * 1024 * 1024
    assert hashlib.sha256(back.read_bytes()).hexdigest() == digest
