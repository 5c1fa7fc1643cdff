"""Snapshots, forks and restores through pydsec against a real `dsec serve` with container sandboxes (see
conftest.dsec): what a copy sees is its source's files at the snapshot, and from then on its own."""

import asyncio
import uuid

import pytest

import pydsec
import pydsec.aio


@pytest.fixture
def snapshots_supported(client):
    try:
        client.snapshots()
    except pydsec.NotFoundError as e:
        pytest.skip(f"the node has no snapshot routes yet (GET /v1/snapshots: {e.message})")


def _name(tag):
    return f"it-{tag}-{uuid.uuid4().hex[:8]}"


def test_snapshot_fork_diverge_restore_list_delete(client, dsec, snapshots_supported):
    made = []
    with client.create(image=dsec.image, memory="256M", timeout=600, labels={"suite": "snapshots"}) as src:
        src.write_file("/work/state.txt", "before\n")
        assert src.exec("mkdir -p /work/d && echo nested > /work/d/n.txt && rm -f /etc/group", timeout=10).ok
        name = _name("src")
        snap = src.snapshot(name=name)
        made.append(name)
        assert (snap.name, snap.kind, snap.backend, snap.image, snap.source) == (
            name, "filesystem", "container", dsec.image, src.id)
        assert snap.bytes > 0 and snap.created and snap.node
        with pytest.raises(pydsec.ConflictError):
            src.snapshot(name=name)
        with pytest.raises(pydsec.InvalidRequestError, match="files"):
            src.snapshot(processes=True)

        # The source moves on; nothing it does after the snapshot reaches a copy.
        src.write_file("/work/state.txt", "after\n")

        copies = src.fork(3)
        assert len({c.id for c in copies}) == 3 and src.id not in {c.id for c in copies}
        try:
            for i, c in enumerate(copies):
                assert c.read_file("/work/state.txt") == b"after\n"  # a fork starts from the source now
                c.write_file(f"/work/fork-{i}.txt", f"fork {i}\n")
                assert c.exec(f"echo own-{i} > /work/state.txt", timeout=10).ok
            for i, c in enumerate(copies):
                assert c.read_file("/work/state.txt") == f"own-{i}\n".encode()
                others = [j for j in range(3) if j != i]
                listing = {e["name"] for e in c.list_dir("/work")}
                assert f"fork-{i}.txt" in listing and not listing & {f"fork-{j}.txt" for j in others}
                assert c.read_file("/work/d/n.txt") == b"nested\n"
                assert not c.exists("/etc/group")  # a deletion is part of the state (a whiteout)
            assert src.read_file("/work/state.txt") == b"after\n"
            assert not any(src.exists(f"/work/fork-{i}.txt") for i in range(3))
        finally:
            for c in copies:
                with c:
                    pass
            for c in copies:
                with pytest.raises(pydsec.NotFoundError):
                    c.info()
        # The fork's own snapshot (of the source as it was at the fork) stays until deleted.
        fork_snap = client.snapshot(copies[0].cached_info["snapshot"])
        assert fork_snap.source == src.id and fork_snap.name != name
        assert fork_snap.delete() is True

        with client.create(snapshot=snap, timeout=300, labels={"restored": "1"}) as restored:
            info = restored.cached_info
            assert restored.id != src.id and info["labels"] == {"restored": "1"} and info["snapshot"] == name
            assert info["image"].startswith(dsec.image + "+")  # the snapshot's files are a layer over the image
            assert restored.read_file("/work/state.txt") == b"before\n"
            assert restored.read_file("/work/d/n.txt") == b"nested\n"
            assert not restored.exists("/etc/group")
            assert restored.exec("cat /work/state.txt", timeout=10).stdout == "before\n"

    listed = {s.name: s for s in client.snapshots()}
    assert name in listed and listed[name].source == snap.source and listed[name].bytes == snap.bytes
    assert client.snapshot(name).image == dsec.image
    assert snap.delete() is True
    assert name not in {s.name for s in client.snapshots()}
    with pytest.raises(pydsec.NotFoundError):
        client.snapshot(name)
    with pytest.raises(pydsec.NotFoundError):
        client.create(snapshot=name)
    assert client.delete_snapshot(name) is False


def test_aio_snapshot_and_restore(dsec, client, snapshots_supported):
    name = _name("aio")

    async def main():
        async with pydsec.aio.Client(endpoint=dsec.endpoint, token=dsec.token) as c:
            async with c.create(image=dsec.image, timeout=300) as src:
                await src.write_file("/work/a.txt", "aio\n")
                snap = await src.snapshot(name=name)
                async with c.create(snapshot=snap, timeout=300) as restored:
                    assert await restored.read_file("/work/a.txt") == b"aio\n"
                copies = await src.fork(2)
                for copy in copies:
                    async with copy:
                        assert await copy.read_file("/work/a.txt") == b"aio\n"
                assert await c.delete_snapshot(copies[0].cached_info["snapshot"]) is True
            assert name in {s.name for s in await c.snapshots()}
            assert await snap.delete() is True

    asyncio.run(main())
    assert client.delete_snapshot(name) is False
