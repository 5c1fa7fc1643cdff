"""A node whose layers come from the cluster's shared layer store, on demand (docs/layer-store.md): `dsec layer build
--store` publishes a layer as chunks, a `dsec serve --store` node that does not have the layer mounts it without
copying it, fetches only what its sandboxes read, and turns a corrupt chunk into an I/O error inside the sandbox and
an event in /v1/node and /metrics."""

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import urllib.request

import pytest

import pydsec

from conftest import _mounts_under, integration_binary, make_busybox_rootfs, start_store_node, stop_process


def _build(binary, env, root, store, ref, rootfs):
    build = subprocess.run([binary, "layer", "build", ref, "--from-dir", rootfs, "--root", root, "--store", store],
                           env=env, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, f"dsec layer build {ref} failed:\n{build.stdout}\n{build.stderr}"
    assert "pushed " + ref in build.stdout, build.stdout
    return build.stdout


@pytest.fixture(scope="module")
def shared():
    binary = integration_binary()
    if not os.path.exists("/dev/fuse"):
        pytest.skip("FUSE is not available (no /dev/fuse): on-demand layers need it")
    base = tempfile.mkdtemp(prefix="pydsec-store-")
    home = os.path.join(base, "home")
    os.makedirs(home)
    env = dict(os.environ, HOME=home)
    env.pop("DSEC_STORE", None)
    store = os.path.join(base, "store")
    os.makedirs(store)
    builder = os.path.join(base, "builder")
    big = os.urandom(6 << 20)
    layers = {}
    for ref in ("ondemand:1", "damaged:1"):
        rootfs = os.path.join(base, "rootfs-" + ref.replace(":", "-"))
        make_busybox_rootfs(rootfs)
        os.makedirs(os.path.join(rootfs, "data"))
        with open(os.path.join(rootfs, "data", "big.bin"), "wb") as f:
            f.write(big if ref == "ondemand:1" else os.urandom(6 << 20))  # no chunk of it shared with the other
        _build(binary, env, builder, store, ref, rootfs)
        with open(os.path.join(builder, "layers", *ref.split(":"), "manifest.json")) as f:
            layers[ref] = json.load(f)
    listed = subprocess.run([binary, "layer", "ls", "--store", store, "--json"], env=env, capture_output=True,
                            text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    doc = json.loads(listed.stdout)
    assert [l["name"] + ":" + l["version"] for l in doc["layers"]] == ["damaged:1", "ondemand:1"]
    assert doc["dedup_ratio"] > 1.05  # busybox is in both layers: its chunks are stored once

    node = start_store_node(binary, env, base, store)
    client, root, endpoint, token = node["client"], node["root"], node["endpoint"], node["token"]
    try:
        yield {"client": client, "store": store, "root": root, "layers": layers, "big": big, "endpoint": endpoint,
               "token": token}
        for sb in client.list():
            sb.destroy()
        client.close()
    finally:
        stop_process(node["proc"])
        left = _mounts_under(base)
        if left:
            raise AssertionError(f"mounts left under {base}: {left}")
        shutil.rmtree(base, ignore_errors=True)


def _layer_store(client):
    return client.node()["layer_store"]


def _metrics(shared):
    req = urllib.request.Request(shared["endpoint"] + "/metrics",
                                 headers={"Authorization": "Bearer " + shared["token"]})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read().decode()


def test_a_layer_only_in_the_shared_store_starts_a_sandbox_reading_a_fraction_of_it(shared):
    c = shared["client"]
    assert not os.path.exists(os.path.join(shared["root"], "layers", "ondemand"))  # not copied to the node
    size = shared["layers"]["ondemand:1"]["size"]
    with c.create(image="ondemand:1") as sb:
        assert sb.exec("cat /etc/passwd | head -1").stdout.startswith("root:")
        started = _layer_store(c)
        assert started["error"] is None
        assert started["chunk_cache"]["misses"] > 0
        # What the start read (busybox, metadata) was fetched; the 6 MiB file nobody read was not.
        assert started["chunk_cache"]["bytes_fetched"] < size - len(shared["big"]) / 2, started
        digest = sb.exec("md5sum /data/big.bin").stdout.split()[0]
        assert digest == hashlib.md5(shared["big"]).hexdigest()
        after = _layer_store(c)
        assert after["chunk_cache"]["bytes_fetched"] >= len(shared["big"])
        assert after["chunk_cache"]["corrupt"] == 0
        assert after["prefetch"]["prefetches"] == 0  # no recording yet: this first start is the one recorded
    metrics = _metrics(shared)
    assert "dsec_chunk_cache_misses_total" in metrics
    assert "dsec_chunk_fetched_bytes_total" in metrics


def test_a_corrupt_chunk_is_an_io_error_in_the_sandbox_and_an_event_of_the_node(shared):
    c = shared["client"]
    store = shared["store"]
    with c.create(image="damaged:1") as sb:
        # Everything the node has not fetched yet gets damaged in the store (what the start read stays good).
        cached = set()
        for _dirpath, _dirs, files in os.walk(os.path.join(shared["root"], "chunk-cache")):
            cached.update(files)
        damaged = 0
        for sha in shared_chunks(store, "damaged:1"):
            if sha in cached:
                continue
            path = os.path.join(store, "chunks", sha[:2], sha)
            with open(path, "r+b") as f:
                f.seek(10)
                byte = f.read(1)
                f.seek(10)
                f.write(bytes([byte[0] ^ 0x55]))
            damaged += 1
        assert damaged > 0
        r = sb.exec("cat /data/big.bin > /dev/null")
        assert r.exit_code != 0
        assert "I/O error" in r.stderr or "Input/output error" in r.stderr, r.stderr
        state = _layer_store(c)
        assert state["chunk_cache"]["corrupt"] >= 1
        assert any("corrupt" in e["what"] for e in state["events"]), state["events"]
    assert "dsec_chunk_corrupt_total" in _metrics(shared)


def shared_chunks(store, ref):
    name, version = ref.split(":")
    with open(os.path.join(store, "layers", name, version, "manifest.json")) as f:
        return json.load(f)["chunks"]


def test_an_image_in_neither_store_is_a_clear_not_found_naming_both(shared):
    c = shared["client"]
    with pytest.raises(pydsec.NotFoundError) as e:
        c.create(image="nowhere:1")
    assert "nowhere:1" in str(e.value) and "shared store" in str(e.value), str(e.value)
