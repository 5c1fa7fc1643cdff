"""Sessions through pydsec (sync and aio) against a real `dsec serve` (see conftest.dsec), plus client-side checks.

Short leases (1-2 s; the node's reaper ticks every second) so that lapses happen within the test.
"""

import asyncio
import time
import uuid

import pytest

import pydsec
import pydsec.aio


def _name(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def _wait(predicate, seconds, what):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {seconds} s waiting for {what}")


def _state(sb):
    info = sb.info()
    return info["state"], info.get("paused_by")


def test_session_arguments_are_checked_before_a_request(fake):
    c = fake.client()
    with pytest.raises(pydsec.InvalidRequestError, match="session name"):
        c.session("-bad")
    with pytest.raises(pydsec.InvalidRequestError, match="session name"):
        c.session("x" * 65)
    with pytest.raises(pydsec.InvalidRequestError, match="lease"):
        c.session("ok", lease=0)
    with pytest.raises(pydsec.InvalidRequestError, match="retention"):
        c.session("ok", retention=604801)
    with pytest.raises(pydsec.InvalidRequestError, match="session name"):
        c.create("img:1", session="a b")
    with pytest.raises(pydsec.InvalidRequestError):
        pydsec.aio.Client(endpoint=fake.endpoint, token="t").session("ok", lease=-1)
    assert fake.seen == []


def test_session_renews_in_the_background(fake):
    puts = []

    @fake.route("PUT", "/v1/sessions/bg")
    def put(h, seen):
        puts.append((time.monotonic(), seen.body))
        h.send_json(200, {"name": "bg", "lease": 1, "retention": 5, "state": "active", "expires_unix": 0,
                          "lapsed_unix": None, "sandboxes": []})

    c = fake.client()
    s = c.session("bg", lease=1, retention=5)
    assert s.renewing and len(puts) == 1
    assert b'"retention": 5' in puts[0][1]
    # Renewal runs at lease/3 intervals: two renewals within 1 s on a quiet machine; a loaded one gets longer.
    _wait(lambda: len(puts) >= 3, 10, "two renewals")
    s.close()
    assert not s.renewing
    n = len(puts)
    time.sleep(0.8)
    assert len(puts) == n, "close() stops renewing"


def test_session_sync_flow(dsec, client):
    name = _name("sync")
    s = client.session(name, lease=2, retention=60)
    try:
        assert s.renewing
        assert s.info()["state"] == "active"
        a = s.create(image=dsec.image)
        b = s.create(image=dsec.image, labels={"role": "b"})
        outside = client.create(image=dsec.image)
        assert a.info()["session"] == name and outside.info()["session"] is None
        assert a.exec("echo kept > /tmp/state; sleep 1000 > /dev/null 2>&1 &").exit_code == 0
        assert b.exec("echo b > /tmp/state").exit_code == 0

        # Background renewal keeps the session alive well past its lease.
        time.sleep(5)
        assert s.info()["state"] == "active", s.last_error
        assert _state(a) == ("running", None)
        assert sorted(x.id for x in s.sandboxes()) == sorted([a.id, b.id])

        # The trainer "dies": renewal stops, the lease lapses, the session's sandboxes are paused.
        s.close()
        assert not s.renewing
        _wait(lambda: _state(a) == ("paused", "lease") and _state(b) == ("paused", "lease"), 8, "lease pause")
        assert _state(outside) == ("running", None)
        assert s.info()["state"] == "lapsed"
        with pytest.raises(pydsec.ConflictError, match="attach"):
            client.create(image=dsec.image, session=name)

        # The requeued trainer attaches and finds both; the first request resumes each, intact.
        s = client.session(name, lease=2)
        sandboxes = s.attach()
        assert sorted(x.id for x in sandboxes) == sorted([a.id, b.id])
        assert all(x.state == "paused" and x.cached_info["paused_by"] == "lease" for x in sandboxes)
        again = {x.id: x for x in sandboxes}
        r = again[a.id].exec("cat /tmp/state; ps -o args | grep -c '^sleep 1000'")
        assert r.stdout == "kept\n1\n"
        assert _state(a) == ("running", None)
        assert again[b.id].read_file("/tmp/state") == b"b\n"
        assert _state(b) == ("running", None)
        time.sleep(3)
        assert s.info()["state"] == "active", "attach keeps renewing"
    finally:
        destroyed = s.destroy()
    assert destroyed == 2
    assert not s.renewing
    with pytest.raises(pydsec.NotFoundError):
        a.info()
    with pytest.raises(pydsec.NotFoundError):
        s.info()
    assert outside.info()["state"] == "running"
    outside.destroy()


def test_session_errors_and_retention(dsec, client):
    with pytest.raises(pydsec.NotFoundError):
        client.create(image=dsec.image, session=_name("unknown"))
    with pytest.raises(pydsec.InvalidRequestError, match="lease"):
        client._transport.call("PUT", "/v1/sessions/x", payload={"lease": 0})
    with pytest.raises(pydsec.InvalidRequestError, match="session name"):
        client._transport.call("GET", "/v1/sessions/-x")
    with pytest.raises(pydsec.NotFoundError):
        client._transport.call("POST", f"/v1/sessions/{_name('none')}/attach", payload={})

    name = _name("short")
    with client.session(name, lease=1, retention=1) as s:
        sb = s.create(image=dsec.image)
    assert not s.renewing  # leaving `with` stops renewing but keeps the sandboxes
    assert sb.info()["session"] == name

    def gone():
        try:
            sb.info()
        except pydsec.NotFoundError:
            return True
        return False

    _wait(gone, 10, "retention to destroy the sandbox")
    with pytest.raises(pydsec.NotFoundError):
        s.info()
    assert name not in [x["name"] for x in client.sessions()]


def test_session_aio_flow(dsec):
    async def main():
        async with pydsec.aio.Client(endpoint=dsec.endpoint, token=dsec.token) as c:
            name = _name("aio")
            s = await c.session(name, lease=2, retention=60)
            assert s.renewing
            a = await s.create(image=dsec.image)
            assert (await a.exec("echo kept > /tmp/state; sleep 1000 > /dev/null 2>&1 &")).exit_code == 0
            await asyncio.sleep(5)
            assert (await s.info())["state"] == "active", s.last_error
            assert [x.id for x in await s.sandboxes()] == [a.id]

            await s.aclose()
            assert not s.renewing
            end = time.monotonic() + 8
            while time.monotonic() < end:
                info = await a.info()
                if info["state"] == "paused":
                    break
                await asyncio.sleep(0.1)
            assert info["state"] == "paused" and info["paused_by"] == "lease", info

            s2 = c.session(name, lease=2)
            sandboxes = await s2.attach()
            assert [x.id for x in sandboxes] == [a.id] and sandboxes[0].state == "paused"
            r = await sandboxes[0].exec("cat /tmp/state; ps -o args | grep -c '^sleep 1000'")
            assert r.stdout == "kept\n1\n"
            assert (await a.info())["paused_by"] is None
            await asyncio.sleep(3)
            assert (await s2.info())["state"] == "active"
            assert await s2.destroy() == 1
            assert not s2.renewing
            with pytest.raises(pydsec.NotFoundError):
                await a.info()

            # async with: a session (created on enter) whose renewal stops on exit.
            async with c.session(_name("aio-ctx"), lease=1, retention=0) as s3:
                sb = await s3.create(image=dsec.image)
                await asyncio.sleep(2)
                assert (await s3.info())["state"] == "active"
            assert not s3.renewing
            for _ in range(80):
                try:
                    await sb.info()
                except pydsec.NotFoundError:
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("retention 0 did not destroy the sandbox after the lapse")

    asyncio.run(main())
