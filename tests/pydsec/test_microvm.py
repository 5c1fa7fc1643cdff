"""microvm and vm sandboxes through pydsec against a real ``dsec serve`` (QEMU under TCG here): the same API as
containers. Run by their own ctest entry (marker ``vm``), one VM test at a time; skipped with the node's reason
where the node has no microvm backend (no QEMU, no TCG module, no guest kernel)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile

import pytest

import pydsec
import pydsec.aio

pytestmark = pytest.mark.vm


def _client_with(dsec, kind: str) -> pydsec.Client:
    c = dsec.client(timeout=300)
    node = c.node()
    if kind not in node["backends"]:
        pytest.skip(f"{kind} unavailable on this node: {node['unavailable_backends'].get(kind)}")
    return c


def _until_changed(sb, cmd: str, than: str, timeout: float = 30) -> str:
    """cmd's output once it differs from `than`, polled (a TCG guest on a loaded host is slow), or the last one."""
    import time

    deadline = time.monotonic() + timeout
    out = sb.exec(cmd).stdout
    while out == than and time.monotonic() < deadline:
        time.sleep(0.1)
        out = sb.exec(cmd).stdout
    return out


def test_a_microvm_answers_the_container_api(dsec):
    c = _client_with(dsec, "microvm")
    node = c.node()
    assert "microvm" in node["backend_notes"] or os.path.exists("/dev/kvm")
    with c.create(image=dsec.image, backend="microvm", memory="256M", disk="32M", pids=64, timeout=600) as sb:
        info = sb.info()
        assert info["backend"] == "microvm"
        assert info["memory"] == 256 << 20
        r = sb.exec("echo hi; echo err >&2; exit 4", timeout=60)
        assert (r.exit_code, r.stdout, r.stderr) == (4, "hi\n", "err\n")
        assert sb.exec("hostname").stdout.strip() == sb.id
        sb.write_file("/work/a.txt", "from pydsec")
        assert sb.read_file("/work/a.txt") == b"from pydsec"
        assert sb.stat("/work/a.txt")["size"] == 11
        assert [e["name"] for e in sb.list_dir("/work")] == ["a.txt"]
        with sb.exec_stream("for i in 1 2 3; do echo line$i; done") as s:
            out = "".join(data for kind, data in s if kind == "stdout")
        assert out == "line1\nline2\nline3\n"
        assert sb.exec("cat", stdin="piped in").stdout == "piped in"
        slow = sb.exec("sleep 30", timeout=1)
        assert slow.timed_out
        with tempfile.TemporaryDirectory() as local:
            with open(os.path.join(local, "up.txt"), "w") as f:
                f.write("uploaded")
            sb.upload(local, "/work/tree")
        assert sb.exec("cat /work/tree/up.txt").stdout == "uploaded"
        with tempfile.TemporaryDirectory() as back:
            sb.download("/work/tree", back)
            with open(os.path.join(back, "up.txt")) as f:
                assert f.read() == "uploaded"
        assert sb.pause()["state"] == "paused"
        assert sb.resume()["state"] == "running"
        assert sb.exec("cat /work/a.txt").stdout == "from pydsec"
    assert all(s.id != sb.id for s in c.list())


def test_a_paused_microvm_resumes_on_exec_and_counts_its_memory(dsec):
    c = _client_with(dsec, "microvm")
    before = c.node()["capacity"]["memory_committed_bytes"]
    with c.create(image=dsec.image, backend="microvm", timeout=600) as sb:
        # No memory given: the node's --vm-memory is the guest's RAM, committed in full.
        assert c.node()["capacity"]["memory_committed_bytes"] - before == 512 << 20
        sb.pause()
        assert sb.exec("echo awake").stdout == "awake\n"
        assert sb.info()["state"] == "running"


def test_unsupported_asks_of_a_microvm_fail_clearly(dsec):
    c = _client_with(dsec, "microvm")
    with pytest.raises(pydsec.DsecError) as e:
        c.create(image=dsec.image, backend="microvm", network="egress")
    assert "network" in str(e.value)
    with pytest.raises(pydsec.DsecError):
        c.create(image=dsec.image, backend="microvm", memory="16M")
    with pytest.raises(pydsec.DsecError) as e:
        c.create(image=dsec.image, backend="fncall")
    assert "/v1/call" in str(e.value)


def test_asyncio_drives_a_microvm(dsec):
    _client_with(dsec, "microvm")

    async def run() -> str:
        async with pydsec.aio.Client(endpoint=dsec.endpoint, token=dsec.token, timeout=300) as c:
            async with c.create(image=dsec.image, backend="microvm", memory="256M", timeout=600) as sb:
                r = await sb.exec("echo async")
                return r.stdout

    assert asyncio.run(run()) == "async\n"


def test_microvm_snapshots_carry_processes_and_forks_diverge(dsec):
    c = _client_with(dsec, "microvm")
    with c.create(image=dsec.image, backend="microvm", memory="256M", timeout=600) as sb:
        sb.write_file("/work/setup", "expensive setup")
        sb.exec("setsid sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/n; sleep 0.1; done' "
                "</dev/null >/dev/null 2>&1 &")
        assert _until_changed(sb, "cat /tmp/n 2>/dev/null", "") != ""  # counting before the snapshot
        snap = sb.snapshot(processes=True)
        try:
            assert snap.kind == "machine" and snap.backend == "microvm"
            assert snap.name in [s.name for s in c.snapshots()]
            forks = sb.fork(2)
            try:
                assert len(forks) == 2
                for i, f in enumerate(forks):
                    assert f.read_file("/work/setup") == b"expensive setup"
                    n1 = int(f.exec("cat /tmp/n").stdout)
                    assert _until_changed(f, "cat /tmp/n", f"{n1}\n") != f"{n1}\n"  # the process runs on in the copy
                    f.write_file(f"/work/fork-{i}", "mine")
                assert not forks[0].exists("/work/fork-1") and not forks[1].exists("/work/fork-0")
                assert not sb.exists("/work/fork-0")
            finally:
                for f in forks:
                    f.destroy()
            with c.create(snapshot=snap, timeout=600) as restored:
                assert restored.info()["backend"] == "microvm"
                assert restored.read_file("/work/setup") == b"expensive setup"
        finally:
            for s in c.snapshots():
                if s.source == sb.id:
                    s.delete()
    assert snap.name not in [s.name for s in c.snapshots()]


def test_a_lapsed_session_pauses_and_reclaims_its_microvm_and_attach_resumes_it(dsec):
    import time

    c = _client_with(dsec, "microvm")
    name = f"vm-session-{os.getpid()}"
    s = c.session(name, lease=2)
    try:
        sb = c.create(image=dsec.image, backend="microvm", memory="256M", session=name, timeout=600)
        sb.exec("setsid sh -c 'sleep 1000' </dev/null >/dev/null 2>&1 &")
        sb.write_file("/work/kept", "kept\n")
        s.close()  # the trainer is preempted: renewal stops and the lease lapses
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            info = sb.info()
            if (info["state"], info.get("paused_by")) == ("paused", "lease"):
                break
            time.sleep(0.2)
        assert (info["state"], info.get("paused_by")) == ("paused", "lease"), info
        s = c.session(name, lease=30)
        again = {x.id: x for x in s.attach()}
        r = again[sb.id].exec("cat /work/kept; pidof sleep >/dev/null && echo running")
        assert r.stdout == "kept\nrunning\n"
        assert again[sb.id].info()["state"] == "running"
    finally:
        s.destroy()


def test_a_restarted_node_readopts_its_microvms(dsec, tmp_path):
    """The agent goes (SIGTERM leaves sandboxes running) and a new one on the same root takes its microVMs back:
    a running one with its processes and files, a paused one still paused."""
    import signal
    import subprocess
    import time

    from conftest import _free_port, _wait_healthy

    _client_with(dsec, "microvm")
    root = str(tmp_path / "root")
    build = subprocess.run([dsec.bin, "layer", "build", "vmbase:1", "--from-dir",
                            os.path.join(os.path.dirname(dsec.root), "rootfs"), "--root", root],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = dict(os.environ, HOME=str(tmp_path))

    def serve() -> subprocess.Popen:
        log = open(tmp_path / "serve.log", "ab")
        proc = subprocess.Popen([dsec.bin, "serve", "--listen", f"127.0.0.1:{port}", "--root", root,
                                 "--fleet-name", f"vmrestart{os.getpid()}"], env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        _wait_healthy(endpoint, proc, time.monotonic() + 60)
        return proc

    proc = serve()
    try:
        with open(os.path.join(root, "token")) as f:
            token = f.read().strip()
        c = pydsec.Client(endpoint=endpoint, token=token, timeout=300)
        running = c.create(image="vmbase:1", backend="microvm", memory="256M", timeout=600)
        running.exec("setsid sh -c 'sleep 1000' </dev/null >/dev/null 2>&1 &")
        running.write_file("/work/kept", "kept\n")
        paused = c.create(image="vmbase:1", backend="microvm", memory="256M", timeout=600)
        paused.pause()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        proc = serve()
        c = pydsec.Client(endpoint=endpoint, token=token, timeout=300)
        ids = {s.id: s for s in c.list()}
        assert set(ids) == {running.id, paused.id}
        assert ids[paused.id].info()["state"] == "paused"
        r = ids[running.id].exec("cat /work/kept; pidof sleep >/dev/null && echo running")
        assert r.stdout == "kept\nrunning\n"
        assert ids[paused.id].exec("echo resumed").stdout == "resumed\n"
        for s in ids.values():
            s.destroy()
        assert c.list() == []
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def _booted_kernel_release(dsec, sandbox_id: str):
    """The image kernel the node booted for a VM sandbox ("" : dsec's guest kernel), from its persisted state."""
    import json

    def find(doc):
        if isinstance(doc, dict):
            if "kernel_release" in doc:
                return doc["kernel_release"]
            for v in doc.values():
                found = find(v)
                if found is not None:
                    return found
        return None

    with open(os.path.join(dsec.root, "state", "sandboxes", sandbox_id + ".json")) as f:
        return find(json.load(f))


def _debian_image_with_kernel_and_systemd(dsec) -> str:
    """debian:12 (debootstrap) with Debian's cloud kernel and systemd installed on it: a full machine's image."""
    if not shutil.which("debootstrap"):
        pytest.skip("debootstrap is not installed (apt-get install debootstrap)")
    install = ("apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -q -y --no-install-recommends "
               "systemd-sysv linux-image-cloud-amd64 && apt-get clean")
    for ref, how in (("debian:12", ["--debootstrap", "bookworm"]), ("vmboot:1", ["--on", "debian:12", "--run", install])):
        if os.path.isdir(os.path.join(dsec.root, "layers", *ref.split(":"))):
            continue
        build = subprocess.run([dsec.bin, "layer", "build", ref, *how, "--root", dsec.root],
                               env=dict(os.environ, HOME=dsec.home), capture_output=True, text=True, timeout=900)
        assert build.returncode == 0, f"dsec layer build {ref} failed:\n{build.stderr[-3000:]}"
    return "debian:12+vmboot:1"


def test_a_vm_boots_the_images_own_kernel_and_hands_pid_1_to_its_systemd(dsec):
    c = _client_with(dsec, "vm")
    image = _debian_image_with_kernel_and_systemd(dsec)
    with c.create(image=image, backend="vm", memory="768M", pids=200, timeout=900) as sb:
        release = sb.exec("ls /lib/modules").stdout.strip()
        assert release.endswith("-cloud-amd64")
        # The image's kernel, not dsec's guest kernel (the node's record of what it booted: dsec's kernel may be the
        # same release); its systemd is PID 1, and answers at once.
        assert _booted_kernel_release(dsec, sb.id) == release
        assert sb.exec("uname -r").stdout.strip() == release
        assert sb.exec("cat /proc/1/comm").stdout.strip() == "systemd"
        assert sb.exec("systemctl is-system-running --wait", timeout=300).stdout.strip() in ("running", "degraded")
        # A service of the image's own, run by its systemd.
        sb.write_file("/etc/systemd/system/hello.service",
                      "[Service]\nType=oneshot\nExecStart=/bin/sh -c 'echo from-unit > /root/unit-ran'\n")
        started = sb.exec("systemctl daemon-reload && systemctl start hello.service", timeout=120)
        assert started.exit_code == 0, started.stderr
        assert sb.read_file("/root/unit-ran") == b"from-unit\n"
        # dsec's commands still run through its agent, in the sandbox's cgroup under its pids limit.
        assert sb.exec("cat /proc/self/cgroup").stdout.strip() == "0::/sandbox"
        assert sb.exec("cat /sys/fs/cgroup/sandbox/pids.max").stdout.strip() == "200"
        assert sb.exec("hostname").stdout.strip() == sb.id
        sb.write_file("/root/note", "kept")
        # A fork is the same machine: its kernel, its systemd, the state set before.
        (fork,) = sb.fork(1)
        with fork:
            assert fork.exec("uname -r").stdout.strip() == release
            assert fork.exec("cat /proc/1/comm").stdout.strip() == "systemd"
            assert fork.exec("cat /root/note").stdout == "kept"
            assert fork.exec("systemctl is-active hello.service; cat /root/unit-ran").stdout.split() == \
                ["inactive", "from-unit"]
            assert fork.exec("hostname").stdout.strip() == fork.id
    # A microVM of the same image boots dsec's kernel, with the agent as PID 1.
    if "microvm" in c.node()["backends"]:
        with c.create(image=image, backend="microvm", memory="256M", timeout=600) as micro:
            assert _booted_kernel_release(dsec, micro.id) == ""
            assert micro.exec("cat /proc/1/comm").stdout.strip() == "init"
