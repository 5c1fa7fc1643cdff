"""The HTTP layer against an in-process fake server: requests on the wire, error paths, chunked NDJSON
streams, keep-alive reuse and the stale-connection retry, timeouts, many threads."""

import asyncio
import base64
import io
import itertools
import json
import socket
import tarfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import pydsec
import pydsec.aio

INFO = {"id": "n0-0123456789abcdef", "node": "n0", "image": "testbase:1", "backend": "container",
        "state": "running", "labels": {}}
RESULT = {"exit_code": 0, "signal": 0, "stdout": "hi\n", "stderr": "", "timed_out": False, "truncated": False,
          "oom_killed": False, "duration": 0.002}


def test_create_sends_only_given_fields_with_auth(fake):
    @fake.route("POST", "/v1/sandboxes")
    def create(h, seen):
        h.send_json(201, dict(INFO, labels=json.loads(seen.body).get("labels", {})))

    with fake.client() as c:
        sb = c.create(image="testbase:1", memory="512M", labels={"run": "1"})
        assert sb.id == INFO["id"]
        assert sb.cached_info["labels"] == {"run": "1"}
    seen = fake.seen[0]
    assert seen.headers["Authorization"] == "Bearer secret-token"
    assert seen.headers["Content-Type"] == "application/json"
    assert json.loads(seen.body) == {"image": "testbase:1", "backend": "container", "memory": "512M",
                                     "labels": {"run": "1"}}


def test_exec_request_and_result(fake):
    @fake.route("POST", f"/v1/sandboxes/{INFO['id']}/exec")
    def exec_(h, seen):
        h.send_json(200, RESULT)

    with fake.client() as c:
        r = c.sandbox(INFO["id"]).exec(["echo", "hi"], timeout=5, cwd="/work", env={"A": "B"}, stdin=b"\x00\xff")
    assert r.exit_code == 0 and r.stdout == "hi\n" and r.ok and r.duration == 0.002
    body = json.loads(fake.seen[0].body)
    assert body == {"cmd": ["echo", "hi"], "timeout": 5, "cwd": "/work", "env": {"A": "B"},
                    "stdin_b64": base64.b64encode(b"\x00\xff").decode()}


def test_query_encoding_for_files_and_labels(fake):
    sid = INFO["id"]

    @fake.route("GET", f"/v1/sandboxes/{sid}/files")
    def read(h, seen):
        h.send_raw(200, b"content")

    @fake.route("GET", "/v1/sandboxes")
    def lst(h, seen):
        h.send_json(200, {"sandboxes": [INFO]})

    @fake.route("PUT", f"/v1/sandboxes/{sid}/files")
    def write(h, seen):
        h.send_json(200, {"path": "/x", "size": len(seen.body)})

    with fake.client() as c:
        sb = c.sandbox(sid)
        assert sb.read_file("/work/a b&c+d.py") == b"content"
        assert sb.write_file("/w/f", "héllo", mode=0o755) == {"path": "/x", "size": 6}
        found = c.list(labels={"run": "a b", "k": "v=w"})
        assert [s.id for s in found] == [sid] and found[0].cached_info["image"] == "testbase:1"
    paths = [s.path for s in fake.seen]
    assert paths[0] == f"/v1/sandboxes/{sid}/files?path=/work/a%20b%26c%2Bd.py"
    assert paths[1] == f"/v1/sandboxes/{sid}/files?path=/w/f&mode=0755"
    assert paths[2] == "/v1/sandboxes?label=run=a%20b&label=k=v=w"
    assert fake.seen[1].body == "héllo".encode()


@pytest.mark.parametrize("status,code,cls", [(404, "not_found", pydsec.NotFoundError),
                                             (401, "unauthorized", pydsec.AuthError),
                                             (400, "invalid_request", pydsec.InvalidRequestError),
                                             (409, "conflict", pydsec.ConflictError),
                                             (501, "unsupported", pydsec.UnsupportedError)])
def test_error_responses(fake, status, code, cls):
    @fake.route("POST", "/v1/sandboxes")
    def create(h, seen):
        h.send_json(status, {"error": {"code": code, "message": "layer nosuch:1 not found"}})

    with fake.client() as c:
        with pytest.raises(cls) as ei:
            c.create(image="nosuch:1")
        assert ei.value.status == status and "nosuch:1" in ei.value.message
        # The connection is still usable after an error response.
        with pytest.raises(cls):
            c.create(image="nosuch:1")
    assert fake.connections == 1


def test_capacity_error_retry_after(fake):
    @fake.route("POST", "/v1/sandboxes")
    def create(h, seen):
        h.send_json(429, {"error": {"code": "capacity", "message": "node full"}}, {"Retry-After": "2"})

    with fake.client() as c, pytest.raises(pydsec.CapacityError) as ei:
        c.create(image="x")
    assert ei.value.retry_after == 2


def test_non_json_server_error(fake):
    @fake.route("GET", "/v1/layers")
    def layers(h, seen):
        h.send_raw(503, b"too many connections", "text/plain")

    with fake.client() as c, pytest.raises(pydsec.ServerError, match="too many connections"):
        c.layers()


def test_destroy_is_idempotent(fake):
    calls = []

    @fake.route("DELETE", f"/v1/sandboxes/{INFO['id']}")
    def delete(h, seen):
        calls.append(1)
        if len(calls) == 1:
            h.send_json(200, {"id": INFO["id"], "destroyed": True})
        else:
            h.send_json(404, {"error": {"code": "not_found", "message": "no such sandbox"}})

    with fake.client() as c:
        sb = c.sandbox(INFO["id"])
        assert sb.destroy() is True
        assert sb.destroy() is False


def test_context_manager_destroys(fake):
    @fake.route("POST", "/v1/sandboxes")
    def create(h, seen):
        h.send_json(201, INFO)

    @fake.route("DELETE", f"/v1/sandboxes/{INFO['id']}")
    def delete(h, seen):
        h.send_json(200, {"id": INFO["id"], "destroyed": True})

    with fake.client() as c:
        with pytest.raises(RuntimeError):
            with c.create(image="x") as sb:
                assert sb.id == INFO["id"]
                raise RuntimeError("body failed")
    assert [s.method for s in fake.seen] == ["POST", "DELETE"]


def test_keep_alive_reuses_one_connection(fake):
    @fake.route("GET", "/healthz")
    def health(h, seen):
        h.send_json(200, {"status": "ok"})

    with fake.client() as c:
        for _ in range(20):
            assert c.health()["status"] == "ok"
    assert fake.connections == 1


def test_connection_closed_while_idle_is_not_reused(fake):
    @fake.route("GET", "/healthz")
    def health(h, seen):
        h.send_json(200, {"status": "ok", "n": len(fake.seen)})
        # Close after answering although the response said keep-alive: the pooled connection goes stale.
        h.close_connection = True

    with fake.client() as c:
        assert c.health()["n"] == 1
        time.sleep(0.1)
        assert c.health()["n"] == 2  # the pooled socket is seen closed before sending: a new one is used
        time.sleep(0.1)
        assert c.health()["n"] == 3
    assert fake.connections == 3
    assert len(fake.seen) == 3  # nothing was sent on the closed connections


def test_connection_dropped_on_reuse_is_retried_once(fake):
    # The server takes the request on the reused connection but closes it without answering (a keep-alive
    # race the readability check cannot see): the client retries once on a fresh connection.
    @fake.route("GET", "/v1/layers")
    def layers(h, seen):
        if seen.conn_id == 1 and sum(s.conn_id == 1 for s in fake.seen) == 2:
            h.close_connection = True
            return
        h.send_json(200, {"layers": [{"name": "n", "conn": seen.conn_id}]})

    with fake.client() as c:
        assert c.layers()[0]["conn"] == 1
        assert c.layers()[0]["conn"] == 2
        assert c.layers()[0]["conn"] == 2
    assert fake.connections == 2


def test_fresh_connection_dropped_is_not_retried(fake):
    @fake.route("POST", "/v1/sandboxes")
    def create(h, seen):
        h.close_connection = True  # no response at all

    with fake.client() as c, pytest.raises(pydsec.DsecConnectionError, match="connection .* lost"):
        c.create(image="x")
    assert len(fake.seen) == 1  # a create is never sent twice on a fresh connection


def test_stale_retry_rewinds_file_bodies(fake, tmp_path):
    sid = INFO["id"]
    got = []

    @fake.route("PUT", f"/v1/sandboxes/{sid}/files")
    def write(h, seen):
        got.append(seen.body)
        if seen.conn_id == 1 and len(got) == 2:
            h.close_connection = True  # drop the reused connection after reading the whole body
            return
        h.send_json(200, {"path": "/f", "size": len(seen.body)})

    src = tmp_path / "src.bin"
    src.write_bytes(b"0123456789" * 100000)
    with fake.client() as c:
        sb = c.sandbox(sid)
        sb.write_file_from("/f", str(src))
        assert sb.write_file_from("/f", str(src))["size"] == 1000000  # retried, from the start of the file
    assert got == [src.read_bytes()] * 3
    assert fake.connections == 2


def test_connection_refused_is_connection_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    c = pydsec.Client(endpoint=f"http://127.0.0.1:{port}", token="t", timeout=2)
    with pytest.raises(pydsec.DsecConnectionError, match="cannot reach") as ei:
        c.health()
    assert isinstance(ei.value, ConnectionError)


def test_slow_server_is_timeout_error(fake):
    @fake.route("GET", "/v1/layers")
    def slow(h, seen):
        time.sleep(1.5)
        h.send_json(200, {"layers": []})

    with fake.client(timeout=0.3) as c, pytest.raises(pydsec.DsecTimeoutError) as ei:
        c.layers()
    assert isinstance(ei.value, TimeoutError)


def test_exec_wait_covers_command_timeout(fake):
    # A 1 s exec on a client with a 0.3 s request timeout must still wait for the command.
    @fake.route("POST", f"/v1/sandboxes/{INFO['id']}/exec")
    def exec_(h, seen):
        time.sleep(0.8)
        h.send_json(200, dict(RESULT, timed_out=True, exit_code=137, signal=9))

    with fake.client(timeout=0.3) as c:
        r = c.sandbox(INFO["id"]).exec("sleep 5", timeout=0.5)
    assert r.timed_out and r.exit_code == 137 and not r.ok


def test_exec_stream_is_incremental(fake):
    gate = threading.Event()

    @fake.route("POST", f"/v1/sandboxes/{INFO['id']}/exec/stream")
    def stream(h, seen):
        h.start_chunked()
        h.chunk(b'{"stdout": "one\\n"}\n')
        # Two lines in one chunk, and one line split over two chunks.
        h.chunk(b'{"stderr": "warn\\n"}\n{"stdout": "t')
        h.chunk(b'wo\\n"}\n')
        gate.wait(5)  # the client must have seen the first lines before the rest is sent
        h.chunk(b'{"stdout": "three\\n"}\n')
        h.chunk(json.dumps(dict(RESULT, stdout="", stderr="", done=True)).encode() + b"\n")
        h.end_chunked()

    @fake.route("GET", "/healthz")
    def health(h, seen):
        h.send_json(200, {"status": "ok"})

    with fake.client() as c:
        s = c.sandbox(INFO["id"]).exec_stream("x")
        got = []
        for item in s:
            got.append(item)
            if len(got) == 3:
                gate.set()
        assert got == [("stdout", "one\n"), ("stderr", "warn\n"), ("stdout", "two\n"), ("stdout", "three\n")]
        assert s.result.exit_code == 0
        assert s.result.stdout == "one\ntwo\nthree\n" and s.result.stderr == "warn\n"
        c.health()  # the stream's connection went back to the pool
    assert fake.connections == 1


def test_exec_stream_without_result_line(fake):
    @fake.route("POST", f"/v1/sandboxes/{INFO['id']}/exec/stream")
    def stream(h, seen):
        h.start_chunked()
        h.chunk(b'{"stdout": "partial"}\n')
        h.end_chunked()

    with fake.client() as c:
        s = c.sandbox(INFO["id"]).exec_stream("x")
        with pytest.raises(pydsec.ServerError, match="without a final result"):
            list(s)


def test_exec_stream_closed_early_drops_connection(fake):
    release = threading.Event()

    @fake.route("POST", f"/v1/sandboxes/{INFO['id']}/exec/stream")
    def stream(h, seen):
        h.start_chunked()
        h.chunk(b'{"stdout": "a"}\n')
        release.wait(5)
        try:
            h.end_chunked()
        except OSError:
            pass

    @fake.route("GET", "/healthz")
    def health(h, seen):
        h.send_json(200, {"status": "ok"})

    with fake.client() as c:
        with c.sandbox(INFO["id"]).exec_stream("x") as s:
            assert next(s) == ("stdout", "a")
        release.set()
        assert c.health()["status"] == "ok"
    assert fake.connections == 2


def test_32_threads_share_one_client(fake):
    lock = threading.Lock()
    active = [0, 0]
    ids_counter = itertools.count()

    @fake.route("POST", "/v1/sandboxes")
    def create(h, seen):
        with lock:
            n = next(ids_counter)
            active[0] += 1
            active[1] = max(active[1], active[0])
        time.sleep(0.05)
        with lock:
            active[0] -= 1
        h.send_json(201, dict(INFO, id=f"n0-{n:016x}"))

    with fake.client() as c:
        with ThreadPoolExecutor(32) as pool:
            ids = list(pool.map(lambda i: c.create(image="x", labels={"i": str(i)}).id, range(64)))
    assert len(set(ids)) == 64
    assert active[1] > 8  # requests really ran concurrently
    assert fake.connections <= 64


def _tar_bytes(entries):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, kind, payload in entries:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
            elif kind == "dir":
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            elif kind == "sym":
                info.type = tarfile.SYMTYPE
                info.linkname = payload
                tar.addfile(info)
    return buf.getvalue()


def test_upload_and_download_through_fake(fake, tmp_path):
    sid = INFO["id"]
    uploaded = {}

    @fake.route("PUT", f"/v1/sandboxes/{sid}/tar")
    def put_tar(h, seen):
        with tarfile.open(fileobj=io.BytesIO(seen.body)) as tar:
            for m in tar:
                uploaded[m.name] = tar.extractfile(m).read() if m.isreg() else m.type
        h.send_json(200, {"path": "/work"})

    @fake.route("GET", f"/v1/sandboxes/{sid}/tar")
    def get_tar(h, seen):
        data = _tar_bytes([("d", "dir", None), ("d/x.txt", "file", b"x" * 70000), ("top", "file", b"t"),
                           ("link", "sym", "d/x.txt")])
        h.start_chunked(ctype="application/x-tar")
        for i in range(0, len(data), 10000):
            h.chunk(data[i:i + 10000])
        h.end_chunked()

    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.py").write_text("print(1)\n")
    (src / "sub" / "b.bin").write_bytes(bytes(range(256)))
    dst = tmp_path / "dst"
    with fake.client() as c:
        sb = c.sandbox(sid)
        assert sb.upload(str(src), "/work") == {"path": "/work"}
        assert sb.download("/work", str(dst)) == 4
    assert uploaded["a.py"] == b"print(1)\n" and uploaded["sub/b.bin"] == bytes(range(256))
    assert uploaded["sub"] == tarfile.DIRTYPE
    assert (dst / "d" / "x.txt").read_bytes() == b"x" * 70000
    assert (dst / "link").read_bytes() == b"x" * 70000
    assert fake.connections == 1


def test_aio_against_fake(fake):
    sid = INFO["id"]

    counter = itertools.count()
    lock = threading.Lock()

    @fake.route("POST", "/v1/sandboxes")
    def create(h, seen):
        with lock:
            n = next(counter)
        time.sleep(0.05)
        h.send_json(201, dict(INFO, id=f"n0-{n:016x}"))

    @fake.route("POST", f"/v1/sandboxes/{sid}/exec/stream")
    def stream(h, seen):
        h.start_chunked()
        for i in range(3):
            h.chunk(json.dumps({"stdout": f"{i}\n"}).encode() + b"\n")
        h.chunk(json.dumps(dict(RESULT, stdout="", done=True)).encode() + b"\n")
        h.end_chunked()

    @fake.route("DELETE", f"/v1/sandboxes/{sid}")
    def delete(h, seen):
        h.send_json(200, {"id": sid, "destroyed": True})

    async def main():
        async with pydsec.aio.Client(endpoint=fake.endpoint, token="secret-token") as c:
            t0 = time.monotonic()
            sbs = await asyncio.gather(*(c.create(image="x") for _ in range(16)))
            elapsed = time.monotonic() - t0
            assert len({sb.id for sb in sbs}) == 16
            assert elapsed < 16 * 0.05  # the creates overlapped
            sb = c.sandbox(sid)
            chunks = [item async for item in sb.exec_stream("x")]
            async with c.create(image="x") as created:
                assert created.id.startswith("n0-")
            s = sb.exec_stream("x")
            result = await s.wait()
            return chunks, result

    chunks, result = asyncio.run(main())
    assert chunks == [("stdout", "0\n"), ("stdout", "1\n"), ("stdout", "2\n")]
    assert result.stdout == "0\n1\n2\n"


@pytest.mark.parametrize("chunked", [False, True])
def test_read_file_to_streams_and_reuses_connection(fake, tmp_path, chunked):
    sid = INFO["id"]
    payload = bytes(range(256)) * 4096  # 1 MiB, several reads

    @fake.route("GET", f"/v1/sandboxes/{sid}/files")
    def read(h, seen):
        if chunked:
            h.start_chunked(ctype="application/octet-stream")
            for i in range(0, len(payload), 100000):
                h.chunk(payload[i:i + 100000])
            h.end_chunked()
        else:
            h.send_raw(200, payload)

    with fake.client() as c:
        sb = c.sandbox(sid)
        for i in range(3):
            assert sb.read_file_to("/big", str(tmp_path / f"out{i}")) == len(payload)
            assert (tmp_path / f"out{i}").read_bytes() == payload
        assert sb.read_file("/big") == payload
    assert fake.connections == 1
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".pydsec-")] == []
