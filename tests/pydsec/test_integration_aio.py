"""pydsec.aio against a real `dsec serve` (see conftest.dsec)."""

import asyncio
import time
import uuid

import pytest

import pydsec
import pydsec.aio


def run(coro):
    return asyncio.run(coro)


def test_aio_flow(dsec, tmp_path):
    async def main():
        async with pydsec.aio.Client(endpoint=dsec.endpoint, token=dsec.token) as c:
            assert (await c.health())["status"] == "ok"
            async with c.create(image=dsec.image, labels={"suite": "aio"}) as sb:
                r = await sb.exec("echo hi; exit 2")
                assert r.exit_code == 2 and r.stdout == "hi\n"
                await sb.write_file("/work/f.txt", "data")
                assert await sb.read_file("/work/f.txt") == b"data"
                assert [e["name"] for e in await sb.list_dir("/work")] == ["f.txt"]
                assert (await sb.stat("/work/f.txt"))["size"] == 4
                (tmp_path / "up").mkdir()
                (tmp_path / "up" / "x").write_text("x")
                await sb.upload(str(tmp_path / "up"), "/work/up")
                await sb.download("/work", str(tmp_path / "down"))
                assert (tmp_path / "down" / "up" / "x").read_text() == "x"
                await sb.remove("/work/f.txt")
                assert not await sb.exists("/work/f.txt")
                assert (await sb.pause())["state"] == "paused"
                assert (await sb.resume())["state"] == "running"
                assert (await sb.set_timeout(600))["timeout"] >= 600
                got = []
                t0 = time.monotonic()
                first = None
                async for stream, text in sb.exec_stream("echo a; sleep 1; echo b"):
                    got.append((stream, text))
                    if first is None:
                        first = time.monotonic() - t0
                assert got == [("stdout", "a\n"), ("stdout", "b\n")] and first < 0.9
                s = sb.exec_stream("echo c >&2")
                assert (await s.wait()).stderr == "c\n"
                assert (await c.get(sb.id)).id == sb.id
                sid = sb.id
            with pytest.raises(pydsec.NotFoundError):
                await c.get(sid)
            with pytest.raises(pydsec.NotFoundError):
                await c.create(image="nosuchlayer:1")

    run(main())


def test_aio_gather_16_creates(dsec):
    label = uuid.uuid4().hex[:8]

    async def one(c, i):
        sb = await c.create(image=dsec.image, labels={"run": label})
        try:
            return (await sb.exec(["echo", str(i)])).stdout
        finally:
            await sb.destroy()

    async def main():
        async with pydsec.aio.Client(endpoint=dsec.endpoint, token=dsec.token) as c:
            outs = await asyncio.gather(*(one(c, i) for i in range(16)))
            assert outs == [f"{i}\n" for i in range(16)]
            assert await c.list(labels={"run": label}) == []

    run(main())


def test_aio_cancelled_create_leaves_nothing(dsec):
    label = uuid.uuid4().hex[:8]

    async def main():
        async with pydsec.aio.Client(endpoint=dsec.endpoint, token=dsec.token) as c:
            task = asyncio.ensure_future(c.create(image=dsec.image, labels={"run": label}))
            await asyncio.sleep(0)  # the request is on its way
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                if not await c.list(labels={"run": label}):
                    return
                await asyncio.sleep(0.1)
            raise AssertionError("a cancelled create left a sandbox behind")

    run(main())


def test_sync_client_works_inside_running_loop(dsec):
    async def main():
        with dsec.client() as c:
            with c.create(image=dsec.image) as sb:
                return sb.exec("echo sync").stdout

    assert run(main()) == "sync\n"
