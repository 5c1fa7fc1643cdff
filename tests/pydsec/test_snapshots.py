"""Snapshots, restores and forks in pydsec (sync and asyncio) against the in-process fake server: what goes on
the wire, what comes back, which errors map to which classes, and what is refused before a round trip."""

import asyncio
import itertools
import json
import threading
import time

import pytest

import pydsec
import pydsec.aio

SID = "n0-0123456789abcdef"
INFO = {"id": SID, "node": "n0", "image": "testbase:1", "backend": "container", "state": "running", "labels": {}}
SNAP = {"name": "snap-1", "kind": "filesystem", "backend": "container", "image": "testbase:1", "source": SID,
        "node": "n0", "created": "2025-01-02T03:04:05Z", "created_unix": 1735787045.0, "bytes": 4096}


def _body(seen):
    return json.loads(seen.body) if seen.body else None


def _fork_route(fake, ids=None):
    counter = itertools.count()

    @fake.route("POST", f"/v1/sandboxes/{SID}/fork")
    def fork(h, seen):
        n = _body(seen)["count"]
        made = ids if ids is not None else [f"n0-{next(counter):016x}" for _ in range(n)]
        h.send_json(201, {"snapshot": dict(SNAP, name="fork-1"),
                          "sandboxes": [dict(INFO, id=i, snapshot="fork-1") for i in made]})


def _delete_routes(fake, ids, deleted):
    for sid in ids:
        @fake.route("DELETE", f"/v1/sandboxes/{sid}")
        def delete(h, seen, sid=sid):
            deleted.append(sid)
            h.send_json(200, {"id": sid, "destroyed": True})


def test_snapshot_request_and_object(fake):
    @fake.route("POST", f"/v1/sandboxes/{SID}/snapshot")
    def snap(h, seen):
        body = _body(seen) or {}
        h.send_json(201, dict(SNAP, name=body.get("name", "snap-0a1b2c3d4e5f")))

    with fake.client() as c:
        sb = c.sandbox(SID)
        s = sb.snapshot(name="before-tests")
        unnamed = sb.snapshot()
        sb.snapshot(name="with-procs", processes=True)
    assert isinstance(s, pydsec.Snapshot)
    assert (s.name, s.kind, s.backend, s.image, s.source, s.node, s.created, s.bytes) == (
        "before-tests", "filesystem", "container", "testbase:1", SID, "n0", "2025-01-02T03:04:05Z", 4096)
    assert s.info["created_unix"] == SNAP["created_unix"]
    assert unnamed.name == "snap-0a1b2c3d4e5f"
    assert [_body(x) for x in fake.seen] == [{"name": "before-tests"}, {}, {"name": "with-procs", "processes": True}]


@pytest.mark.parametrize("status,code,cls", [(400, "invalid_request", pydsec.InvalidRequestError),
                                             (409, "conflict", pydsec.ConflictError),
                                             (404, "not_found", pydsec.NotFoundError),
                                             (501, "unsupported", pydsec.UnsupportedError),
                                             (503, "unavailable", pydsec.UnavailableError)])
def test_snapshot_errors_map_to_sdk_classes(fake, status, code, cls):
    message = "container snapshots carry files only, not processes"

    @fake.route("POST", f"/v1/sandboxes/{SID}/snapshot")
    def snap(h, seen):
        h.send_json(status, {"error": {"code": code, "message": message}})

    with fake.client() as c, pytest.raises(cls) as ei:
        c.sandbox(SID).snapshot(name="x", processes=True)
    assert ei.value.status == status and ei.value.message == message


@pytest.mark.parametrize("name", ["", "Upper", "-lead", "a/b", "a b", "x" * 65, 7])
def test_bad_snapshot_names_are_refused_before_a_request(fake, name):
    with fake.client() as c:
        with pytest.raises(pydsec.InvalidRequestError, match="snapshot name"):
            c.sandbox(SID).snapshot(name=name)
        with pytest.raises(pydsec.InvalidRequestError, match="snapshot name"):
            c.create(snapshot=name)
        with pytest.raises(pydsec.InvalidRequestError, match="snapshot name"):
            c.snapshot(name)
    assert fake.seen == []


def test_restore_sends_only_what_a_restore_takes(fake):
    @fake.route("POST", "/v1/sandboxes")
    def create(h, seen):
        h.send_json(201, dict(INFO, id="n1-00000000000000aa", node="n1", snapshot=_body(seen)["snapshot"]))

    with fake.client() as c:
        snap = pydsec.Snapshot(c, SNAP)
        sb = c.create(snapshot=snap, timeout=600, idle_timeout=60, labels={"run": "7"}, session="run-7")
        by_name = c.create(snapshot="snap-1")
        via_object = snap.restore(timeout=5)
    assert sb.id == "n1-00000000000000aa" and sb.cached_info["snapshot"] == "snap-1"
    assert by_name.id == via_object.id == sb.id
    assert [_body(s) for s in fake.seen] == [
        {"snapshot": "snap-1", "timeout": 600, "idle_timeout": 60, "labels": {"run": "7"}, "session": "run-7"},
        {"snapshot": "snap-1"}, {"snapshot": "snap-1", "timeout": 5}]


@pytest.mark.parametrize("arg", [{"image": "testbase:1"}, {"backend": "container"}, {"memory": "1G"},
                                 {"cpus": 2}, {"env": {"A": "B"}}, {"network": "egress"}, {"qos": "latency"},
                                 {"protect": ["/x"]}, {"disk": "1G"}, {"pids": 10}])
def test_restore_refuses_what_the_snapshot_fixes(fake, arg):
    with fake.client() as c, pytest.raises(pydsec.InvalidRequestError, match=next(iter(arg))):
        c.create(snapshot="snap-1", **arg)
    assert fake.seen == []


def test_create_without_image_or_snapshot_is_refused(fake):
    with fake.client() as c, pytest.raises(pydsec.InvalidRequestError, match="snapshot="):
        c.create(memory="1G")
    assert fake.seen == []


def test_restore_of_missing_snapshot_is_not_found(fake):
    @fake.route("POST", "/v1/sandboxes")
    def create(h, seen):
        h.send_json(404, {"error": {"code": "not_found", "message": "no snapshot gone-1"}})

    with fake.client() as c, pytest.raises(pydsec.NotFoundError, match="gone-1"):
        c.create(snapshot="gone-1")


def test_fork_returns_sandboxes_that_destroy_themselves(fake):
    _fork_route(fake)
    ids = [f"n0-{i:016x}" for i in range(3)]
    deleted = []
    _delete_routes(fake, ids, deleted)

    with fake.client() as c:
        copies = c.sandbox(SID).fork(3)
        assert [sb.id for sb in copies] == ids
        assert all(isinstance(sb, pydsec.Sandbox) and sb.cached_info["snapshot"] == "fork-1" for sb in copies)
        for sb in copies:
            with sb:
                pass
    assert deleted == ids
    assert _body(fake.seen[0]) == {"count": 3}


@pytest.mark.parametrize("n", [0, -1, 257, 1.5, True, "3"])
def test_fork_count_is_checked_before_a_request(fake, n):
    with fake.client() as c, pytest.raises(pydsec.InvalidRequestError, match="count"):
        c.sandbox(SID).fork(n)
    assert fake.seen == []


def test_fork_answer_short_of_copies_is_a_server_error(fake):
    _fork_route(fake, ids=["n0-00000000000000aa"])
    with fake.client() as c, pytest.raises(pydsec.ServerError, match="fork of 2 returned 1"):
        c.sandbox(SID).fork(2, processes=True)
    assert _body(fake.seen[0]) == {"count": 2, "processes": True}


def test_list_get_and_delete(fake):
    deleted = []

    @fake.route("GET", "/v1/snapshots")
    def lst(h, seen):
        h.send_json(200, {"snapshots": [SNAP, dict(SNAP, name="snap-2", bytes=1)]})

    @fake.route("GET", "/v1/snapshots/snap-2")
    def get(h, seen):
        h.send_json(200, dict(SNAP, name="snap-2", bytes=1))

    @fake.route("DELETE", "/v1/snapshots/snap-2")
    def delete(h, seen):
        if deleted:
            h.send_json(404, {"error": {"code": "not_found", "message": "no snapshot snap-2"}})
        else:
            deleted.append(1)
            h.send_json(200, {"name": "snap-2", "deleted": True})

    with fake.client() as c:
        assert [(s.name, s.bytes) for s in c.snapshots()] == [("snap-1", 4096), ("snap-2", 1)]
        snap = c.snapshot("snap-2")
        assert snap == c.snapshots()[1] and snap.bytes == 1
        assert snap.delete() is True
        assert c.delete_snapshot("snap-2") is False  # idempotent, like destroy()
        with pytest.raises(pydsec.NotFoundError):
            c.snapshot("snap-3")


def test_malformed_snapshot_answers_are_server_errors(fake):
    @fake.route("GET", "/v1/snapshots")
    def lst(h, seen):
        h.send_json(200, {"snapshots": [{"kind": "filesystem"}]})

    with fake.client() as c, pytest.raises(pydsec.ServerError, match="snapshot object"):
        c.snapshots()


def test_aio_snapshot_restore_fork_list_delete(fake):
    _fork_route(fake)
    ids = [f"n0-{i:016x}" for i in range(2)]
    deleted = []
    _delete_routes(fake, ids + ["n1-00000000000000aa"], deleted)

    @fake.route("POST", f"/v1/sandboxes/{SID}/snapshot")
    def snap(h, seen):
        h.send_json(201, dict(SNAP, name=_body(seen)["name"]))

    @fake.route("POST", "/v1/sandboxes")
    def create(h, seen):
        h.send_json(201, dict(INFO, id="n1-00000000000000aa", node="n1"))

    @fake.route("GET", "/v1/snapshots")
    def lst(h, seen):
        h.send_json(200, {"snapshots": [SNAP]})

    @fake.route("GET", "/v1/snapshots/snap-1")
    def get(h, seen):
        h.send_json(200, SNAP)

    @fake.route("DELETE", "/v1/snapshots/snap-1")
    def delete(h, seen):
        h.send_json(200, {"name": "snap-1", "deleted": True})

    async def main():
        async with pydsec.aio.Client(endpoint=fake.endpoint, token="secret-token") as c:
            sb = c.sandbox(SID)
            s = await sb.snapshot(name="snap-1")
            assert isinstance(s, pydsec.aio.Snapshot) and s.bytes == 4096
            with pytest.raises(pydsec.InvalidRequestError):
                c.create(snapshot=s, memory="1G")
            async with c.create(snapshot=s, timeout=30) as restored:
                assert restored.id == "n1-00000000000000aa"
            copies = await sb.fork(2)
            for copy in copies:
                async with copy:
                    assert isinstance(copy, pydsec.aio.Sandbox)
            assert [x.name for x in await c.snapshots()] == ["snap-1"]
            assert (await c.snapshot("snap-1")).node == "n0"
            assert await s.delete() is True

    asyncio.run(main())
    assert deleted == ["n1-00000000000000aa"] + ids
    assert _body(fake.seen[1]) == {"snapshot": "snap-1", "timeout": 30}


def test_aio_cancelled_fork_destroys_its_copies(fake):
    answered = threading.Event()
    ids = [f"n0-{i:016x}" for i in range(3)]
    deleted = []
    _delete_routes(fake, ids, deleted)

    @fake.route("POST", f"/v1/sandboxes/{SID}/fork")
    def fork(h, seen):
        time.sleep(0.3)  # the caller gives up before the answer
        h.send_json(201, {"snapshot": SNAP, "sandboxes": [dict(INFO, id=i) for i in ids]})
        answered.set()

    async def main():
        async with pydsec.aio.Client(endpoint=fake.endpoint, token="secret-token") as c:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(c.sandbox(SID).fork(3), 0.05)
        # leaving the client waited for the orphans' destroys

    asyncio.run(main())
    assert answered.is_set()
    assert sorted(deleted) == ids
