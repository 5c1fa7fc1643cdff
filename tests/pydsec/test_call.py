"""client.call / pydsec.aio call against the in-process fake server: the request on the wire, client-side
validation (the same rules as the server's), result and error mapping, concurrency."""

import asyncio
import base64
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

import pydsec
import pydsec.aio

RESULT = {"exit_code": 0, "signal": 0, "stdout": "499500\n", "stderr": "", "timed_out": False, "truncated": False,
          "oom_killed": False, "duration": 0.004}


def test_call_sends_body_and_returns_exec_result(fake):
    @fake.route("POST", "/v1/call")
    def call(h, seen):
        h.send_json(200, RESULT)

    with fake.client() as c:
        r = c.call("print(sum(range(1000)))")
    assert isinstance(r, pydsec.ExecResult)
    assert r.ok and r.stdout == "499500\n" and r.duration == 0.004
    seen = fake.seen[0]
    assert seen.headers["Authorization"] == "Bearer secret-token"
    assert json.loads(seen.body) == {"code": "print(sum(range(1000)))", "language": "python", "timeout": 10,
                                     "memory": "256M"}


def test_call_all_fields(fake):
    @fake.route("POST", "/v1/call")
    def call(h, seen):
        h.send_json(200, dict(RESULT, exit_code=3, stdout="", stderr="boom\n", truncated=True))

    with fake.client() as c:
        r = c.call("cat data/in.bin; exit 3", language="bash", stdin=b"\x00\xff", timeout=2.5, memory=64 << 20,
                   files={"data/in.bin": b"\x01\x02", "a.py": "print('é')"}, image="debian:12+python:3.11",
                   output_cap=4096, fresh_interpreter=True)
    assert r.exit_code == 3 and not r.ok and r.stderr == "boom\n" and r.truncated
    body = json.loads(fake.seen[0].body)
    assert body == {"code": "cat data/in.bin; exit 3", "language": "bash",
                    "stdin_b64": base64.b64encode(b"\x00\xff").decode(), "timeout": 2.5, "memory": 64 << 20,
                    "files": {"data/in.bin": base64.b64encode(b"\x01\x02").decode(),
                              "a.py": base64.b64encode("print('é')".encode()).decode()},
                    "image": "debian:12+python:3.11", "output_cap": 4096, "fresh_interpreter": True}


def test_call_text_stdin_goes_as_text(fake):
    @fake.route("POST", "/v1/call")
    def call(h, seen):
        h.send_json(200, RESULT)

    with fake.client() as c:
        c.call("import sys; print(sys.stdin.read())", stdin="hello")
    assert json.loads(fake.seen[0].body)["stdin"] == "hello"


@pytest.mark.parametrize("kwargs,match", [
    (dict(code=""), "code must not be empty"),
    (dict(code=b"print(1)"), "code must be a str"),
    (dict(code="x\0"), "NUL"),
    (dict(code="1", language="ruby"), "language must be 'python' or 'bash'"),
    (dict(code="1", timeout=0), "timeout must be > 0"),
    (dict(code="1", timeout=601), "at most 600"),
    (dict(code="1", timeout="10"), "timeout must be a number"),
    (dict(code="1", memory="lots"), "memory must be"),
    (dict(code="1", stdin=3), "stdin must be str or bytes"),
    (dict(code="1", files=["a"]), "files must be a dict"),
    (dict(code="1", files={"/etc/passwd": b""}), "relative"),
    (dict(code="1", files={"../x": b""}), "'..'"),
    (dict(code="1", files={"a//b": b""}), "empty"),
    (dict(code="1", files={"a/": b""}), "empty"),
    (dict(code="1", files={"a": 1}), "must be bytes or str"),
    (dict(code="1", files={"a": b"", "a/b": b""}), "both a file and a directory"),
    (dict(code="1", image=""), "image must be"),
    (dict(code="1", output_cap=-1), "output_cap must be >= 0"),
    (dict(code="1", output_cap=17 << 20), "16 MiB"),
    (dict(code="1", fresh_interpreter="yes"), "fresh_interpreter must be True or False"),
])
def test_call_validation_before_any_request(fake, kwargs, match):
    with fake.client() as c, pytest.raises(pydsec.InvalidRequestError, match=match):
        c.call(**kwargs)
    assert fake.seen == []


def test_call_capacity_error_has_retry_after(fake):
    @fake.route("POST", "/v1/call")
    def call(h, seen):
        h.send_json(429, {"error": {"code": "capacity", "message": "no fncall worker free", "retry_after": 1}},
                    {"Retry-After": "1"})

    with fake.client() as c, pytest.raises(pydsec.CapacityError) as ei:
        c.call("print(1)")
    assert ei.value.retry_after == 1 and ei.value.status == 429


def test_call_missing_image_is_not_found(fake):
    @fake.route("POST", "/v1/call")
    def call(h, seen):
        h.send_json(404, {"error": {"code": "not_found", "message": "fncall image 'x:1' is not available"}})

    with fake.client() as c, pytest.raises(pydsec.NotFoundError, match="x:1"):
        c.call("print(1)", image="x:1")


def test_call_many_threads_share_connections(fake):
    @fake.route("POST", "/v1/call")
    def call(h, seen):
        n = json.loads(seen.body)["code"]
        h.send_json(200, dict(RESULT, stdout=n))

    with fake.client(max_idle_connections=8) as c, ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda i: c.call(str(i)).stdout, range(200)))
    assert outs == [str(i) for i in range(200)]
    assert fake.connections <= 16  # keep-alive: far fewer connections than calls


def test_aio_call(fake):
    @fake.route("POST", "/v1/call")
    def call(h, seen):
        h.send_json(200, dict(RESULT, stdout=json.loads(seen.body)["code"]))

    async def main():
        async with pydsec.aio.Client(endpoint=fake.endpoint, token="secret-token", timeout=10) as c:
            with pytest.raises(pydsec.InvalidRequestError):
                await c.call("1", language="perl")
            results = await asyncio.gather(*(c.call(f"print({i})") for i in range(50)))
        return [r.stdout for r in results]

    assert asyncio.run(main()) == [f"print({i})" for i in range(50)]
    assert threading.active_count() < 200
