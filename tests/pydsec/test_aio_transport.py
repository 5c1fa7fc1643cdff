"""pydsec.aio's own transport (pydsec/_aio_http.py) against the in-process fake server: requests on the wire,
keep-alive reuse, the same exceptions as the sync client, streams read while the loop runs other work,
timeouts, cancellation, the max_in_flight cap with its backpressure, and many tasks sharing one client."""

import asyncio
import json
import socket
import threading
import time

import pytest

import pydsec
import pydsec.aio
from test_infra_errors import ANSWERS, SID, serve

INFO = {"id": SID, "node": "n2", "image": "testbase:1", "backend": "container", "state": "running", "labels": {}}
RESULT = {"exit_code": 0, "signal": 0, "stdout": "hi\n", "stderr": "", "timed_out": False, "truncated": False,
          "oom_killed": False, "duration": 0.002}
WAIT = 10.0  # seconds a fake handler waits for the test at most (a deadline, never a fixed wait)


def aclient(fake, **kwargs):
    kwargs.setdefault("timeout", 10)
    return pydsec.aio.Client(endpoint=fake.endpoint, token="secret-token", **kwargs)


def run(coro):
    return asyncio.run(coro)


class Gauge:
    """Counts the handlers inside a section at once, and the most there ever were."""

    def __init__(self):
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.changed = threading.Condition(self.lock)

    def __enter__(self):
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.changed.notify_all()

    def __exit__(self, *exc):
        with self.lock:
            self.now -= 1
            self.changed.notify_all()

    def wait_for(self, n):
        with self.lock:
            assert self.changed.wait_for(lambda: self.now == n, WAIT), f"{self.now} inside, waited for {n}"


# ---- requests -------------------------------------------------------------------------------------------
def test_requests_on_the_wire_and_keep_alive(fake):
    @fake.route("POST", "/v1/sandboxes")
    def create(h, seen):
        h.send_json(201, dict(INFO, labels=json.loads(seen.body).get("labels", {})))

    @fake.route("POST", f"/v1/sandboxes/{SID}/exec")
    def exec_(h, seen):
        h.send_json(200, RESULT)

    @fake.route("PUT", f"/v1/sandboxes/{SID}/files")
    def write(h, seen):
        h.send_json(200, {"path": "/x", "size": len(seen.body)})

    @fake.route("GET", f"/v1/sandboxes/{SID}/files")
    def read(h, seen):
        h.send_raw(200, b"content")

    @fake.route("GET", "/v1/sandboxes")
    def lst(h, seen):
        h.send_json(200, {"sandboxes": [INFO]})

    @fake.route("DELETE", f"/v1/sandboxes/{SID}")
    def delete(h, seen):
        h.send_json(200, {"id": SID, "destroyed": True})

    async def main():
        async with aclient(fake) as c:
            async with c.create(image="testbase:1", memory="512M", labels={"run": "1"}) as sb:
                assert sb.id == SID and sb.labels == {"run": "1"}
                r = await sb.exec(["echo", "hi"], timeout=5, env={"A": "B"})
                assert isinstance(r, pydsec.ExecResult) and r.ok and r.stdout == "hi\n"
                assert await sb.write_file("/w/f", "héllo", mode=0o755) == {"path": "/x", "size": 6}
                assert await sb.read_file("/work/a b&c+d.py") == b"content"
                found = await c.list(labels={"run": "a b"})
                assert [s.id for s in found] == [SID] and isinstance(found[0], pydsec.aio.Sandbox)
            assert c.in_flight == 0

    run(main())
    seen = fake.seen
    assert [s.method for s in seen] == ["POST", "POST", "PUT", "GET", "GET", "DELETE"]
    assert all(s.headers["Authorization"] == "Bearer secret-token" for s in seen)
    assert all(s.headers["Host"] == fake.endpoint.split("//")[1] for s in seen)
    assert json.loads(seen[0].body) == {"image": "testbase:1", "backend": "container", "memory": "512M",
                                        "labels": {"run": "1"}}
    assert json.loads(seen[1].body) == {"cmd": ["echo", "hi"], "timeout": 5, "env": {"A": "B"}}
    assert seen[2].path == f"/v1/sandboxes/{SID}/files?path=/w/f&mode=0755" and seen[2].body == "héllo".encode()
    assert seen[3].path == f"/v1/sandboxes/{SID}/files?path=/work/a%20b%26c%2Bd.py"
    assert seen[4].path == "/v1/sandboxes?label=run=a%20b"
    assert fake.connections == 1  # one keep-alive connection carried them all


@pytest.mark.parametrize("chunked", [False, True])
def test_large_bodies_both_framings(fake, tmp_path, chunked):
    payload = bytes(range(256)) * 4096  # 1 MiB

    @fake.route("GET", f"/v1/sandboxes/{SID}/files")
    def read(h, seen):
        if chunked:
            h.start_chunked(ctype="application/octet-stream")
            for i in range(0, len(payload), 100000):
                h.chunk(payload[i:i + 100000])
            h.end_chunked()
        else:
            h.send_raw(200, payload)

    @fake.route("PUT", f"/v1/sandboxes/{SID}/files")
    def write(h, seen):
        h.send_json(200, {"size": len(seen.body), "same": seen.body == payload})

    src = tmp_path / "src"
    src.write_bytes(payload)

    async def main():
        async with aclient(fake) as c:
            sb = c.sandbox(SID)
            assert await sb.read_file("/big") == payload
            assert await sb.read_file_to("/big", str(tmp_path / "out")) == len(payload)
            assert await sb.write_file_from("/big", str(src)) == {"size": len(payload), "same": True}
            assert await sb.write_file("/big", payload) == {"size": len(payload), "same": True}

    run(main())
    assert (tmp_path / "out").read_bytes() == payload
    assert fake.connections == 1


def test_stale_keep_alive_connection_is_not_used(fake):
    @fake.route("GET", "/healthz")
    def health(h, seen):
        h.send_json(200, {"status": "ok", "n": len(fake.seen)})
        h.close_connection = True  # closes after answering although the response said keep-alive

    async def main():
        async with aclient(fake) as c:
            for n in (1, 2, 3):
                assert (await c.health())["n"] == n
                # Seen closed before sending (nothing goes out on it), or else retried on a new connection.
                await asyncio.sleep(0.1)

    run(main())
    assert len(fake.seen) == 3 and fake.connections == 3


def test_connection_dropped_on_reuse_is_retried_once(fake):
    # The server takes the request on the reused connection but closes it without answering (a keep-alive race
    # the idle check cannot see): the request goes again, once, on a fresh connection.
    @fake.route("GET", "/v1/layers")
    def layers(h, seen):
        if seen.conn_id == 1 and sum(s.conn_id == 1 for s in fake.seen) == 2:
            h.close_connection = True
            return
        h.send_json(200, {"layers": [{"name": "n", "conn": seen.conn_id}]})

    async def main():
        async with aclient(fake) as c:
            return [(await c.layers())[0]["conn"] for _ in range(3)]

    assert run(main()) == [1, 2, 2]
    assert fake.connections == 2


# ---- errors ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_every_answer_maps_to_the_same_exception_as_sync(fake, name):
    answer, cls, infra = ANSWERS[name]
    serve(fake, "POST", f"/v1/sandboxes/{SID}/exec", answer)

    with fake.client() as c, pytest.raises(pydsec.DsecError) as sync_error:
        c.sandbox(SID).exec("true")

    async def main():
        async with aclient(fake) as c:
            with pytest.raises(pydsec.DsecError) as ei:
                await c.sandbox(SID).exec("true")
            return ei.value

    e = run(main())
    assert type(e) is cls and type(e) is type(sync_error.value)
    assert isinstance(e, pydsec.InfraError) == infra
    for attr in ("code", "status", "message", "retry_after", "node", "node_state", "sandbox_id"):
        assert getattr(e, attr, None) == getattr(sync_error.value, attr, None), attr


def test_lost_node_info_and_invalid_json(fake):
    serve(fake, "GET", f"/v1/sandboxes/{SID}", ANSWERS["node_lost"][0])

    @fake.route("GET", "/v1/layers")
    def layers(h, seen):
        h.send_raw(200, b"{not json", "application/json")

    async def main():
        async with aclient(fake) as c:
            sb = c.sandbox(SID)
            info = await sb.info()
            assert info["state"] == "lost" and info["node"] == "n2" and sb.state == "lost"
            with pytest.raises(pydsec.ServerError, match="invalid JSON"):
                await c.layers()

    run(main())


def test_connection_refused_and_reset(fake):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there

    @fake.route("POST", f"/v1/sandboxes/{SID}/exec")
    def reset(h, seen):
        h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        h.connection.close()
        h.close_connection = True

    async def main():
        async with pydsec.aio.Client(endpoint=f"http://127.0.0.1:{port}", token="t", timeout=2) as c:
            with pytest.raises(pydsec.DsecConnectionError) as ei:
                await c.health()
            assert isinstance(ei.value, ConnectionError) and "cannot reach" in str(ei.value)
            assert c.in_flight == 0
        async with aclient(fake) as c:
            with pytest.raises(pydsec.DsecConnectionError):
                await c.sandbox(SID).exec("true")  # a POST that lost its connection is not sent again
            assert c.in_flight == 0

    run(main())
    assert len(fake.seen) == 1


def test_failover_to_the_next_gateway(fake):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"

    @fake.route("GET", "/healthz")
    def health(h, seen):
        h.send_json(200, {"status": "ok"})

    async def main():
        async with pydsec.aio.Client(endpoint=[dead, fake.endpoint], token="t", timeout=5) as c:
            assert (await c.health())["status"] == "ok"
            assert c.endpoint == fake.endpoint  # it sticks to the one that worked
            assert (await c.health())["status"] == "ok"

    run(main())
    assert len(fake.seen) == 2


# ---- streams --------------------------------------------------------------------------------------------
def test_exec_stream_does_not_block_the_loop(fake):
    gate = threading.Event()

    @fake.route("POST", f"/v1/sandboxes/{SID}/exec/stream")
    def stream(h, seen):
        h.start_chunked()
        h.chunk(b'{"stdout": "one\\n"}\n')
        h.chunk(b'{"stderr": "warn\\n"}\n{"stdout": "t')  # two lines in one chunk, one split over two
        h.chunk(b'wo\\n"}\n')
        gate.wait(WAIT)  # the rest only once the test says so
        h.chunk(b'{"stdout": "three\\n"}\n')
        h.chunk(json.dumps(dict(RESULT, stdout="", done=True)).encode() + b"\n")
        h.end_chunked()

    @fake.route("GET", "/healthz")
    def health(h, seen):
        h.send_json(200, {"status": "ok"})

    async def main():
        async with aclient(fake) as c:
            s = c.sandbox(SID).exec_stream("x")
            got = [await s.__anext__() for _ in range(3)]
            # The stream is waiting for its server: the loop still runs other requests meanwhile.
            pending = asyncio.ensure_future(s.__anext__())
            assert (await c.health())["status"] == "ok"
            assert not pending.done()
            gate.set()
            got.append(await pending)
            got += [item async for item in s]
            assert s.result.stdout == "one\ntwo\nthree\n" and s.result.stderr == "warn\n"
            assert c.in_flight == 0
            return got

    assert run(main()) == [("stdout", "one\n"), ("stderr", "warn\n"), ("stdout", "two\n"), ("stdout", "three\n")]
    assert fake.connections == 2  # the stream's and the health check's, both kept alive


def test_exec_stream_errors(fake):
    @fake.route("POST", f"/v1/sandboxes/{SID}/exec/stream")
    def stream(h, seen):
        h.start_chunked()
        h.chunk(b'{"stdout": "partial\\n"}\n')
        if seen.body and json.loads(seen.body)["cmd"] == ["cut"]:
            h.wfile.write(b"40\r\n{\"stdout\": \"st")  # a chunk announced, then the connection is gone
            h.wfile.flush()
            h.close_connection = True
            return
        if json.loads(seen.body)["cmd"] == ["fail"]:
            h.chunk(b'{"error": {"code": "internal", "message": "cgroup vanished"}, "done": true}\n')
        h.end_chunked()  # "noresult": the stream ends without its result line

    async def main():
        async with aclient(fake) as c:
            sb = c.sandbox(SID)
            with pytest.raises(pydsec.ServerError, match="cgroup vanished"):
                await sb.exec_stream(["fail"]).wait()
            with pytest.raises(pydsec.ServerError, match="without a final result"):
                await sb.exec_stream(["noresult"]).wait()
            s = sb.exec_stream(["cut"])
            assert await s.__anext__() == ("stdout", "partial\n")
            with pytest.raises(pydsec.DsecConnectionError):
                await s.__anext__()
            assert c.in_flight == 0

    run(main())


# ---- timeouts and cancellation --------------------------------------------------------------------------
def test_timeouts(fake):
    release = threading.Event()

    @fake.route("GET", "/v1/layers")
    def hang(h, seen):
        release.wait(WAIT)
        h.send_json(200, {"layers": []})

    @fake.route("POST", f"/v1/sandboxes/{SID}/exec")
    def exec_(h, seen):
        time.sleep(0.8)  # longer than the client's timeout, within the exec's timeout plus grace
        h.send_json(200, dict(RESULT, timed_out=True, exit_code=137, signal=9))

    @fake.route("POST", f"/v1/sandboxes/{SID}/exec/stream")
    def stream(h, seen):
        h.start_chunked()
        h.chunk(b'{"stdout": "a\\n"}\n')
        release.wait(WAIT)

    async def main():
        async with aclient(fake, timeout=0.3) as c:
            with pytest.raises(pydsec.DsecTimeoutError) as ei:
                await c.layers()
            assert isinstance(ei.value, TimeoutError) and "within 0.3 s" in str(ei.value)
            r = await c.sandbox(SID).exec("sleep 5", timeout=0.5)  # waits for the command's own timeout
            assert r.timed_out and not r.ok
            # A stream's reads time out too (an exec stream waits its command's timeout plus a grace of 30 s).
            response = await c._transport.request("POST", f"/v1/sandboxes/{SID}/exec/stream", body=b"{}")
            assert await response.readline() == b'{"stdout": "a\\n"}\n'
            with pytest.raises(pydsec.DsecTimeoutError, match="timed out reading"):
                await response.readline()
            assert c.in_flight == 0

    try:
        run(main())
    finally:
        release.set()


def test_cancelled_request_gives_back_its_slot_and_connection(fake):
    release = threading.Event()

    @fake.route("GET", "/v1/layers")
    def hang(h, seen):
        release.wait(WAIT)
        h.send_json(200, {"layers": []})

    @fake.route("GET", "/healthz")
    def health(h, seen):
        h.send_json(200, {"status": "ok"})

    async def main():
        async with aclient(fake, max_in_flight=1) as c:
            task = asyncio.ensure_future(c.layers())
            while not fake.seen:
                await asyncio.sleep(0.01)
            assert c.in_flight == 1
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert c.in_flight == 0
            assert (await c.health())["status"] == "ok"  # on a new connection: the cancelled one was closed

    try:
        run(main())
    finally:
        release.set()
    assert fake.connections == 2


def test_client_across_event_loops(fake):
    @fake.route("GET", "/healthz")
    def health(h, seen):
        h.send_json(200, {"status": "ok"})

    c = aclient(fake, max_in_flight=2)
    try:
        for _ in range(2):
            assert run(c.health())["status"] == "ok"
    finally:
        c.close()


# ---- max_in_flight --------------------------------------------------------------------------------------
def test_max_in_flight_caps_concurrent_requests(fake):
    gauge = Gauge()
    release = threading.Event()

    @fake.route("POST", f"/v1/sandboxes/{SID}/exec")
    def slow(h, seen):
        with gauge:
            release.wait(WAIT)
        h.send_json(200, dict(RESULT, stdout=json.loads(seen.body)["cmd"][1]))

    async def main():
        async with aclient(fake, max_in_flight=4) as c:
            assert c.max_in_flight == 4
            tasks = [asyncio.ensure_future(c.sandbox(SID).exec(["echo", str(i)])) for i in range(12)]
            await asyncio.get_running_loop().run_in_executor(None, gauge.wait_for, 4)
            # Eight more are ready to go: none may reach the server while four are in flight.
            await asyncio.sleep(0.3)
            assert gauge.now == 4 and c.in_flight == 4 and c._in_flight.waiting == 8
            release.set()
            results = await asyncio.gather(*tasks)
            assert [r.stdout for r in results] == [str(i) for i in range(12)]  # none dropped, each its own
            assert c.in_flight == 0

    try:
        run(main())
    finally:
        release.set()
    assert gauge.most == 4
    assert fake.connections == 4  # the cap also bounds the sockets


def test_open_exec_stream_holds_its_slot(fake):
    release = threading.Event()

    @fake.route("POST", f"/v1/sandboxes/{SID}/exec/stream")
    def stream(h, seen):
        h.start_chunked()
        h.chunk(b'{"stdout": "started\\n"}\n')
        release.wait(WAIT)
        h.chunk(json.dumps(dict(RESULT, stdout="", done=True)).encode() + b"\n")
        h.end_chunked()

    @fake.route("GET", "/healthz")
    def health(h, seen):
        h.send_json(200, {"status": "ok"})

    async def main():
        async with aclient(fake, max_in_flight=2) as c:
            sb = c.sandbox(SID)
            first, second = sb.exec_stream("a"), sb.exec_stream("b")
            assert await first.__anext__() == ("stdout", "started\n")
            assert await second.__anext__() == ("stdout", "started\n")
            health = asyncio.ensure_future(c.health())
            await asyncio.sleep(0.3)
            assert not health.done() and c.in_flight == 2  # waits for a slot: both streams hold theirs
            await first.aclose()  # abandoning a stream gives its slot back
            assert (await health)["status"] == "ok"
            release.set()
            assert (await second.wait()).exit_code == 0  # a stream read to its end gives it back too
            assert c.in_flight == 0

    try:
        run(main())
    finally:
        release.set()
    assert [s.path for s in fake.seen].count("/healthz") == 1


@pytest.mark.parametrize("bad", [0, -1, 1.5, "8", True, None])
def test_max_in_flight_must_be_a_positive_integer(bad):
    with pytest.raises(pydsec.InvalidRequestError, match="max_in_flight must be a positive integer"):
        pydsec.aio.Client(endpoint="http://127.0.0.1:1", token="t", max_in_flight=bad)


# ---- many tasks -----------------------------------------------------------------------------------------
def test_many_tasks_share_one_client(fake):
    n = 40
    barrier = threading.Barrier(n, timeout=WAIT)  # breaks (500 to the client) unless all n are in at once

    @fake.route("POST", f"/v1/sandboxes/{SID}/exec")
    def exec_(h, seen):
        barrier.wait()
        h.send_json(200, dict(RESULT, stdout=json.loads(seen.body)["cmd"][1]))

    @fake.route("POST", f"/v1/sandboxes/{SID}/exec/stream")
    def stream(h, seen):
        i = json.loads(seen.body)["cmd"][1]
        h.start_chunked()
        for k in range(3):
            h.chunk(json.dumps({"stdout": f"{i}.{k}\n"}).encode() + b"\n")
        h.chunk(json.dumps(dict(RESULT, stdout="", done=True)).encode() + b"\n")
        h.end_chunked()

    async def one(c, i):
        r = await c.sandbox(SID).exec(["echo", str(i)])
        chunks = [text async for _, text in c.sandbox(SID).exec_stream(["echo", str(i)])]
        return r.stdout, chunks

    async def main():
        async with aclient(fake) as c:
            out = await asyncio.gather(*(one(c, i) for i in range(n)))
            assert c.in_flight == 0
            return out

    out = run(main())
    assert out == [(str(i), [f"{i}.{k}\n" for k in range(3)]) for i in range(n)]
    assert fake.connections <= n  # connections went back to the pool and were reused


def test_a_burst_opens_few_connections_before_their_requests_go_out():
    """A node holds one client's connections that have not shown their token yet to a small budget (64; then
    429): a burst of requests on new connections must send each head before opening more than a few others."""
    from pydsec._aio_http import OPENING_AT_ONCE

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    listener.setblocking(False)
    endpoint = f"http://127.0.0.1:{listener.getsockname()[1]}"
    held, silent, most = [], set(), [0]
    stop = threading.Event()

    def watch():  # accepts and never answers; counts the connections with nothing sent on them yet
        import select
        while not stop.is_set():
            while True:
                try:
                    conn, _ = listener.accept()
                except BlockingIOError:
                    break
                held.append(conn)
                silent.add(conn)
            if silent:
                poll = select.poll()
                by_fd = {conn.fileno(): conn for conn in silent}
                for fd in by_fd:
                    poll.register(fd, select.POLLIN)
                silent.difference_update(by_fd[fd] for fd, _ in poll.poll(0))
            most[0] = max(most[0], len(silent))  # connected, accepted, and still nothing to read
            stop.wait(0.001)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    n = 300

    async def main():
        async with pydsec.aio.Client(endpoint=endpoint, token="t", timeout=WAIT) as c:
            tasks = [asyncio.ensure_future(c.health()) for _ in range(n)]
            deadline = time.monotonic() + WAIT
            while (len(held) < n or silent) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert len(held) == n and not silent  # every request is out, each on its own connection
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            assert c.in_flight == 0

    try:
        run(main())
    finally:
        stop.set()
        watcher.join()
        for conn in held:
            conn.close()
        listener.close()
    assert 0 < most[0] <= OPENING_AT_ONCE == 32
