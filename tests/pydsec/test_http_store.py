"""A node whose shared layer store is a chunk server (`dsec layer serve`) reached over HTTP instead of a mounted
directory (docs/layer-store.md): the node mounts a layer it lacks on demand through the server, fetching only what its
sandbox reads; its lease and its recording of the first start reach the store through the server; a server that is
away for a moment is waited for; `dsec layer pull` copies a layer whole from it."""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import pytest


from conftest import (_free_port, _mounts_under, integration_binary, make_busybox_rootfs, start_store_node,
                      stop_process)


def _start_server(binary, env, store, port, log_path):
    seen = os.path.getsize(log_path) if os.path.exists(log_path) else 0  # a restart's line comes after this
    log = open(log_path, "ab")
    proc = subprocess.Popen([binary, "layer", "serve", "--store", store, "--listen", f"127.0.0.1:{port}",
                             "--accept-recordings", "--accept-leases"], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    log.close()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with open(log_path) as f:
            f.seek(seen)
            if f"at http://127.0.0.1:{port}" in f.read():
                return proc
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    with open(log_path) as f:
        pytest.fail(f"dsec layer serve did not start:\n{f.read()[-2000:]}")


@pytest.fixture(scope="module")
def served():
    binary = integration_binary()
    if not os.path.exists("/dev/fuse"):
        pytest.skip("FUSE is not available (no /dev/fuse): on-demand layers need it")
    base = tempfile.mkdtemp(prefix="pydsec-httpstore-")
    home = os.path.join(base, "home")
    os.makedirs(home)
    env = dict(os.environ, HOME=home)
    env.pop("DSEC_STORE", None)
    store = os.path.join(base, "store")
    os.makedirs(store)
    rootfs = os.path.join(base, "rootfs")
    make_busybox_rootfs(rootfs)
    os.makedirs(os.path.join(rootfs, "data"))
    big = os.urandom(6 << 20)
    with open(os.path.join(rootfs, "data", "big.bin"), "wb") as f:
        f.write(big)
    build = subprocess.run([binary, "layer", "build", "remote:1", "--from-dir", rootfs, "--root",
                            os.path.join(base, "builder"), "--store", store], env=env, capture_output=True, text=True,
                           timeout=300)
    assert build.returncode == 0, build.stderr
    with open(os.path.join(store, "layers", "remote", "1", "manifest.json")) as f:
        manifest = json.load(f)

    server_port = _free_port()
    server_log = os.path.join(base, "layer-serve.log")
    server = {"proc": _start_server(binary, env, store, server_port, server_log)}
    url = f"http://127.0.0.1:{server_port}"
    started = start_store_node(binary, env, base, url)
    client, root, node = started["client"], started["root"], started["proc"]
    try:
        def restart_server():
            server["proc"] = _start_server(binary, env, store, server_port, server_log)

        yield {"client": client, "store": store, "root": root, "url": url, "big": big, "manifest": manifest,
               "server": server, "restart_server": restart_server, "binary": binary, "env": env, "base": base,
               "node": node}
        if node.poll() is None:  # the last test stops the node itself
            for sb in client.list():
                sb.destroy()
        client.close()
    finally:
        stop_process(node)
        stop_process(server["proc"])
        left = _mounts_under(base)
        if left:
            raise AssertionError(f"mounts left under {base}: {left}")
        shutil.rmtree(base, ignore_errors=True)


def test_a_layer_is_mounted_on_demand_through_the_chunk_server(served):
    c = served["client"]
    assert not os.path.exists(os.path.join(served["root"], "layers", "remote"))
    with c.create(image="remote:1") as sb:
        assert sb.exec("cat /etc/passwd | head -1").stdout.startswith("root:")
        state = c.node()["layer_store"]
        assert state["store"] == served["url"] and state["error"] is None, state
        assert 0 < state["chunk_cache"]["bytes_fetched"] < served["manifest"]["size"] - len(served["big"]) / 2, state

        # The node's lease reached the store through the server: a removal of the layer there is refused.
        leases = [json.load(open(os.path.join(served["store"], "leases", f)))
                  for f in os.listdir(os.path.join(served["store"], "leases"))]
        assert any("remote:1" in lease["layers"] for lease in leases), leases
        rm = subprocess.run([served["binary"], "layer", "rm", "remote:1", "--store", served["store"]],
                            env=served["env"], capture_output=True, text=True, timeout=60)
        assert rm.returncode != 0 and "in use" in rm.stderr, rm.stderr

        # The server goes away; a read of what the node has not fetched yet waits for it to come back.
        served["server"]["proc"].send_signal(signal.SIGKILL)
        served["server"]["proc"].wait()
        result = {}
        reader = threading.Thread(target=lambda: result.update(r=sb.exec("md5sum /data/big.bin")))
        reader.start()
        time.sleep(0.5)
        # Still reading: what it reads was not cached, so the read is waiting for the store (the case under test).
        assert reader.is_alive(), "the read finished while the store was away: it exercised nothing"
        served["restart_server"]()
        reader.join(timeout=60)
        assert not reader.is_alive()
        r = result["r"]
        assert r.exit_code == 0, r.stderr
        assert r.stdout.split()[0] == hashlib.md5(served["big"]).hexdigest()
        assert c.node()["layer_store"]["chunk_cache"]["corrupt"] == 0


def test_a_layer_pulled_whole_from_the_chunk_server_is_the_same_layer(served):
    other = os.path.join(served["base"], "pulled")
    r = subprocess.run([served["binary"], "layer", "pull", "remote:1", "--store", served["url"], "--root", other],
                       env=served["env"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "remote:1: copied" in r.stdout, r.stdout
    with open(os.path.join(other, "layers", "remote", "1", "layer.erofs"), "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == served["manifest"]["sha256"]
    again = subprocess.run([served["binary"], "layer", "pull", "remote:1", "--store", served["url"], "--root", other],
                           env=served["env"], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "already here" in again.stdout, again.stdout


def test_the_first_starts_recording_reaches_the_store_through_the_server(served):
    # The recording is written once the start's reads settle (10 s) or when the node stops; stopping it is quicker.
    stop_process(served["node"])
    recording = os.path.join(served["store"], "layers", "remote", "1", "prefetch.json")
    assert os.path.exists(recording), "the node's recording did not reach the store"
    with open(recording) as f:
        doc = json.load(f)
    assert doc["layer_sha256"] == served["manifest"]["sha256"] and doc["chunks"], doc
