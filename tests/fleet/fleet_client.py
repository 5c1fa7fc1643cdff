"""The pydsec side of tests/fleet/fleet_test.sh, run inside a Slurm job (srun) of its own.

fleet_client.py PHASE STATE_FILE [ARG]: create | session | check | lost NODE | after-join NODE | admission |
failover NODE | snapshot | store MD5 | cleanup.
Exits non-zero with a message on the first failed expectation."""

import json
import os
import sys
import time

import pydsec

IMAGE = "testbase:1"
LABELS = {"fleettest": os.environ.get("DSEC_FLEET", "x")}


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def load(path):
    with open(path) as f:
        return json.load(f)


def save(path, doc):
    with open(path, "w") as f:
        json.dump(doc, f)


def check_sandbox(client, sid, node):
    sb = client.sandbox(sid)
    info = sb.info()
    if info["node"] != node:
        fail(f"{sid}: info()['node'] is {info['node']}, expected {node}")
    r = sb.exec(f"cat /data/mark; cat /etc/dsec-test-image")
    if r.exit_code != 0 or r.stdout != f"{sid}\ndsec test image\n":
        fail(f"{sid}: exec returned {r.exit_code} {r.stdout!r} {r.stderr!r}")
    if sb.read_file("/data/mark") != f"{sid}\n".encode():
        fail(f"{sid}: read_file gave the wrong bytes")


def wait_for_file(path, seconds=120):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            fail(f"{path} did not appear within {seconds} s")
        time.sleep(0.01)
    with open(path) as f:
        return f.read().strip()


def snapshot_elsewhere(client):
    """A snapshot taken on n1 is restored on n2 from the fleet's shared snapshot store. Where a create lands is
    steered by draining the other node at the gateway this client uses (its fleet file's first that answers)."""
    try:
        client.snapshots()
    except pydsec.NotFoundError as e:
        print(f"no snapshot routes: {e}", file=sys.stderr)
        sys.exit(77)

    def drain(node, on):
        client._transport.call("POST", f"/v1/fleet/nodes/{node}/{'drain' if on else 'undrain'}")

    name = f"fleet-{os.environ.get('DSEC_FLEET', 'x')}".lower()
    drain("n2", True)
    src = client.create(IMAGE, cpus=0.1, memory="64M", labels=LABELS)
    if src.info()["node"] != "n1":
        fail(f"with n2 drained the source landed on {src.cached_info['node']}")
    src.write_file("/data/mark", "taken on n1\n")
    r = src.exec("mkdir -p /data/d && echo nested > /data/d/f && rm /etc/dsec-test-image")
    if r.exit_code != 0:
        fail(f"{src.id}: exec gave {r.exit_code} {r.stderr!r}")
    snap = src.snapshot(name=name)
    if snap.node != "n1" or snap.source != src.id or snap.kind != "filesystem" or snap.bytes <= 0:
        fail(f"snapshot object: {snap.info}")
    src.write_file("/data/mark", "changed after the snapshot\n")

    drain("n2", False)
    drain("n1", True)
    try:
        restored = client.create(snapshot=name, timeout=300, labels=LABELS)
    finally:
        drain("n1", False)
    node = restored.info()["node"]
    if node != "n2":
        fail(f"with n1 drained the restore landed on {node}")
    got = restored.read_file("/data/mark")
    if got != b"taken on n1\n":
        fail(f"{restored.id} on n2: /data/mark is {got!r}, not the snapshot's")
    r = restored.exec("cat /data/d/f; test -e /etc/dsec-test-image && echo image-file-back")
    if r.stdout != "nested\n":
        fail(f"{restored.id} on n2: the snapshot's tree is not there: {r.stdout!r} {r.stderr!r}")
    print(f"snapshot {name} of {src.id} (n1, {snap.bytes} bytes) restored on n2 as {restored.id}")

    copies = restored.fork(2)
    for copy in copies:
        if copy.info()["node"] != "n2" or copy.read_file("/data/mark") != b"taken on n1\n":
            fail(f"fork copy {copy.id}: {copy.cached_info}")
        copy.destroy()
    listed = {s.name: s for s in client.snapshots()}
    if name not in listed or client.snapshot(name).node != "n1":
        fail(f"the gateway lists {sorted(listed)}")
    # The fork's own snapshot was taken of a sandbox restored from ours, so it goes first (the node refuses
    # to delete a snapshot another one stacks on).
    for s in sorted(listed.values(), key=lambda s: s.name == name):
        s.delete()
    if client.snapshots():
        fail(f"snapshots left after deleting them: {[s.name for s in client.snapshots()]}")
    print(f"fork of the restored sandbox: {[c.id for c in copies]} on n2; snapshots listed and deleted")
    machine_snapshot_elsewhere(client, drain)


def machine_snapshot_elsewhere(client, drain):
    """A microVM's snapshot (memory and processes) taken on one node is restored on the other: the process started
    before the snapshot runs on there. The source lands where the gateway puts it; only the restore is steered, by
    draining the source's node for that one request (a node drained for long leaves the fleet once empty).
    Skipped, saying why, when the nodes have no microvm backend."""
    nodes = client._transport.call("GET", "/v1/fleet/nodes").get("nodes", [])
    without = [n.get("name") for n in nodes if "microvm" not in (n.get("backends") or [])]
    if not nodes or without:
        print(f"microvm part skipped: no microvm backend on {without or 'the nodes'}")
        return
    src = client.create(IMAGE, backend="microvm", memory="256M", labels=LABELS, timeout=300)
    here = src.info()["node"]
    there = "n2" if here == "n1" else "n1"
    src.write_file("/data/vm-mark", f"vm on {here}\n")
    src.exec("setsid sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/beat; sleep 0.1; done' "
             "</dev/null >/dev/null 2>&1 &")
    deadline = time.monotonic() + 30
    while not src.exec("cat /tmp/beat 2>/dev/null").stdout and time.monotonic() < deadline:
        time.sleep(0.1)
    if not src.exec("cat /tmp/beat").stdout:
        fail(f"{src.id}: the counter did not start")
    snap = src.snapshot(processes=True)
    if snap.kind != "machine" or snap.node != here:
        fail(f"microvm snapshot object: {snap.info}")
    src.destroy()
    drain(here, True)
    try:
        restored = client.create(snapshot=snap.name, timeout=300, labels=LABELS)
    finally:
        drain(here, False)
    if restored.info()["node"] != there:
        fail(f"with {here} drained the microvm restore landed on {restored.cached_info['node']}")
    if restored.read_file("/data/vm-mark") != f"vm on {here}\n".encode():
        fail(f"{restored.id}: the microvm's file is not there")
    b1 = restored.exec("cat /tmp/beat").stdout
    b2 = b1
    deadline = time.monotonic() + 30  # polled: a TCG guest on a loaded node is slow
    while b2 == b1 and time.monotonic() < deadline:
        time.sleep(0.1)
        b2 = restored.exec("cat /tmp/beat").stdout
    if not b1 or b1 == b2:
        fail(f"{restored.id}: the process started on {here} does not run on {there} ({b1!r}, {b2!r})")
    restored.destroy()
    snap.delete()
    print(f"microvm snapshot {snap.name} taken on {here} restored on {there} as {restored.id}, its process running")


def failover(client, state_path, dead):
    """Rank 0's node `dead` is killed while this client is in use: the same client (no change by the caller)
    carries on through another gateway. Prints the time from the kill to the first successful call."""
    sandboxes = load(state_path)["sandboxes"]
    if len(client.endpoints) < 3:
        fail(f"the fleet file names {client.endpoints}, not 3 gateway candidates")
    lost = [s for s, n in sandboxes.items() if n == dead]
    kept = [s for s, n in sandboxes.items() if n != dead]
    client.sandbox(kept[0]).info()  # in use: a keep-alive connection to the first gateway
    first = client.endpoint
    open(state_path + ".ready", "w").close()
    killed_at = float(wait_for_file(state_path + ".killed"))
    deadline = time.monotonic() + 60
    while True:
        try:
            client.sandbox(kept[0]).info()
            break
        except pydsec.InfraError as e:
            if time.monotonic() > deadline:
                fail(f"no call succeeded within 60 s of the kill: {e!r}")
    took = time.time() - killed_at
    print(f"failover: first successful call {took * 1000:.0f} ms after the kill of {dead}; gateway {first} -> "
          f"{client.endpoint}")
    if client.endpoint == first:
        fail(f"the client still uses the dead gateway {first}")
    for sid in kept:
        check_sandbox(client, sid, sandboxes[sid])
    deadline = time.monotonic() + 30
    while True:  # until the gateway declares the node lost (before that it is "not answering")
        try:
            if client.sandbox(lost[0]).info().get("state") == "lost":
                break
        except pydsec.NodeLostError as e:
            if (e.node, e.node_state) != (dead, "unreachable"):
                fail(f"{lost[0]}: {e!r}")
        if time.monotonic() > deadline:
            fail(f"{lost[0]} on the dead node {dead} is not reported lost")
        time.sleep(0.2)
    for sid in lost:
        try:
            client.sandbox(sid).exec("true", timeout=5)
            fail(f"{sid} on the dead node answered")
        except pydsec.NodeLostError as e:
            if e.node != dead:
                fail(f"NodeLostError for {sid} names {e.node}")
    new = {}
    for _ in range(6):
        sb = client.create(IMAGE, cpus=0.1, memory="64M", labels=LABELS)
        sb.write_file("/data/mark", f"{sb.id}\n")
        new[sb.id] = sb.info()["node"]
        check_sandbox(client, sb.id, new[sb.id])
    if dead in new.values():
        fail(f"a new sandbox was placed on the dead node {dead}")
    print(f"{len(kept)} sandboxes of the other nodes serve, {len(lost)} of {dead} are lost; 6 new ones on "
          f"{sorted(set(new.values()))}")


def main():
    phase, state_path = sys.argv[1], sys.argv[2]
    arg = sys.argv[3] if len(sys.argv) > 3 else None
    client = pydsec.Client(fleet=os.environ["DSEC_FLEET"])
    if phase == "create":
        sandboxes = {}
        for i in range(30):
            sb = client.create(IMAGE, cpus=0.1, memory="64M", labels=LABELS)
            node = sb.info()["node"]
            if not sb.id.startswith(node + "-"):
                fail(f"sandbox id {sb.id} does not name its node {node}")
            sb.write_file("/data/mark", f"{sb.id}\n")
            r = sb.exec("hostname; echo ok")
            if r.exit_code != 0 or not r.stdout.endswith("ok\n"):
                fail(f"{sb.id}: exec gave {r.exit_code} {r.stdout!r} {r.stderr!r}")
            sandboxes[sb.id] = node
        nodes = sorted(set(sandboxes.values()))
        print(f"30 sandboxes on {nodes}: " + ", ".join(f"{n}={list(sandboxes.values()).count(n)}" for n in nodes))
        if nodes != ["n1", "n2", "n3"]:
            fail(f"the 30 sandboxes landed on {nodes}, not on n1, n2 and n3")
        listed = {s.id for s in client.list(labels=LABELS)}
        if listed != set(sandboxes):
            fail(f"GET /v1/sandboxes lists {len(listed)} of the 30 sandboxes")
        # A streamed exec goes through the gateway line by line.
        sb = client.sandbox(next(iter(sandboxes)))
        chunks = list(sb.exec_stream("for i in 1 2 3; do echo $i; sleep 0.2; done"))
        if "".join(d for _, d in chunks) != "1\n2\n3\n":
            fail(f"exec_stream through the gateway gave {chunks!r}")
        save(state_path, {"sandboxes": sandboxes})
    elif phase in ("check", "after-join"):
        sandboxes = load(state_path)["sandboxes"]
        for sid, node in sandboxes.items():
            check_sandbox(client, sid, node)
        if phase == "check":
            print(f"all {len(sandboxes)} sandboxes reachable with their files")
        else:
            print(f"node {arg} is back: all {len(sandboxes)} sandboxes reachable again")
    elif phase == "lost":
        sandboxes = load(state_path)["sandboxes"]
        lost = [s for s, n in sandboxes.items() if n == arg]
        kept = [s for s, n in sandboxes.items() if n != arg]
        deadline = time.monotonic() + 10
        message = ""
        error = None
        while True:
            t0 = time.monotonic()
            try:
                client.sandbox(lost[0]).exec("true")
                fail(f"sandbox {lost[0]} on the killed node {arg} still answers")
            except pydsec.DsecError as e:
                message = str(e)
                error = e
            took = time.monotonic() - t0
            if took > 5:
                fail(f"a request for a sandbox of the lost node took {took:.1f}s (must not hang)")
            if "is lost" in message or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if f"node {arg} is lost" not in message or f"sandbox {lost[0]} is lost" not in message:
            fail(f"the error for a sandbox of the lost node is not clear: {message!r}")
        if not isinstance(error, pydsec.NodeLostError) or (error.node, error.node_state) != (arg, "lost"):
            fail(f"the error for a sandbox of the lost node is not a NodeLostError naming {arg} lost: {error!r}")
        print(f"lost-node error: {message}")
        for sid in lost:
            t0 = time.monotonic()
            info = client.sandbox(sid).info()  # the trainer's view: state lost, not an exception
            if info.get("state") != "lost" or info.get("node") != arg or "is lost" not in info.get("error", ""):
                fail(f"{sid}: the info does not say lost: {info!r}")
            if time.monotonic() - t0 > 1:
                fail(f"{sid}: the lost answer took {time.monotonic() - t0:.1f}s")
        for sid in kept:
            check_sandbox(client, sid, sandboxes[sid])
        new = {}
        for _ in range(6):
            sb = client.create(IMAGE, cpus=0.1, memory="64M", labels=LABELS)
            sb.write_file("/data/mark", f"{sb.id}\n")
            new[sb.id] = sb.info()["node"]
        if arg in new.values():
            fail(f"a new sandbox was placed on the lost node {arg}")
        print(f"{len(kept)} sandboxes of the other nodes serve; 6 new ones on {sorted(set(new.values()))}")
        sandboxes.update(new)
        save(state_path, {"sandboxes": sandboxes, "lost_node": arg})
    elif phase == "store":
        # The image is only in the fleet's shared layer store: batches of concurrent creates (concurrent first
        # mounts on each node) until the sandboxes span both nodes; each reads the whole 4 MiB file.
        from concurrent.futures import ThreadPoolExecutor

        def one(_):
            sb = client.create("ondemand:1", cpus=0.1, memory="64M", labels=LABELS)
            return sb.id, sb.info()["node"], sb.exec("md5sum /data/big.bin")

        made = {}
        for _ in range(5):
            with ThreadPoolExecutor(8) as pool:
                for sid, node, r in pool.map(one, range(8)):
                    if r.exit_code != 0 or r.stdout.split()[0] != arg:
                        fail(f"{sid} on {node}: md5sum gave {r.exit_code} {r.stdout!r} {r.stderr!r}")
                    made[sid] = node
            if len(set(made.values())) >= 2:
                break
        nodes = sorted(set(made.values()))
        if len(nodes) < 2:
            fail(f"{len(made)} sandboxes of the shared store's image all landed on {nodes}")
        print(f"{len(made)} sandboxes of an image only in the shared store, on {nodes}, each read it whole")
        save(state_path, {"sandboxes": made})
    elif phase == "session":
        # A session through the gateway: its sandboxes spread over the nodes, the merged session lists all
        # of them, attach (as a requeued trainer would) returns them all, destroy removes them everywhere.
        name = f"fleet-{os.environ['DSEC_FLEET']}"
        session = client.session(name, lease=30)
        # The gateway places each create on the less loaded of its sampled nodes, so the first ones may all go
        # to a node the earlier phases left emptier; creating on until the session spans two nodes is certain
        # (each create raises that node's load), and the bound only catches a placer that never spreads.
        made = []
        nodes = []
        while len(made) < 6 or len(nodes) < 2:
            if len(made) >= 40:
                fail(f"40 sandboxes of the session all landed on {nodes}: {client.node()}")
            sb = session.create(IMAGE, cpus=0.1, memory="64M", labels=LABELS)
            made.append(sb)
            nodes = sorted(set(nodes) | {sb.info()["node"]})
        for sb in made:
            sb.write_file("/data/mark", f"{sb.id}\n")
        info = session.info()
        if sorted(info["sandboxes"]) != sorted(sb.id for sb in made) or info["state"] != "active":
            fail(f"merged session: {info}")
        session.close()
        again = client.session(name, lease=30).attach()
        if sorted(sb.id for sb in again) != sorted(sb.id for sb in made):
            fail(f"attach returned {[sb.id for sb in again]}, expected {[sb.id for sb in made]}")
        for sb in again:
            check_sandbox(client, sb.id, sb.id.rsplit("-", 1)[0])
        destroyed = client.session(name).destroy()
        if destroyed != len(made):
            fail(f"destroying the session destroyed {destroyed} sandboxes, not {len(made)}")
        print(f"session {name}: {len(made)} sandboxes on {nodes}, merged, attached, destroyed")
    elif phase == "admission":
        # Idle sandboxes of the default size (1 CPU, 512 MiB) on a fleet of 1-CPU allocations: each node admits
        # them by its own density controller (CPU ratio 1024 while they use nothing) and the gateway places as
        # the nodes admit, so none is refused.
        sandboxes = {}
        for i in range(30):
            try:
                sb = client.create(IMAGE, labels=LABELS)
            except pydsec.DsecError as e:
                fail(f"sandbox {i + 1} of 30 with the default cpus was refused: {e}")
            info = sb.info()
            if info["cpus"] != 1:
                fail(f"{sb.id} has cpus {info['cpus']}, not the default 1")
            sandboxes[sb.id] = info["node"]
        counts = {n: list(sandboxes.values()).count(n) for n in sorted(set(sandboxes.values()))}
        print(f"30 default sandboxes: {counts}")
        if sorted(counts) != ["n1", "n2", "n3"]:
            fail(f"the 30 sandboxes landed on {sorted(counts)}, not on n1, n2 and n3")
        save(state_path, {"sandboxes": sandboxes})
    elif phase == "snapshot":
        snapshot_elsewhere(client)
    elif phase == "failover":
        failover(client, state_path, arg)
    elif phase == "cleanup":
        for sb in client.list(labels=LABELS):
            sb.destroy()
        left = client.list(labels=LABELS)
        if left:
            fail(f"{len(left)} sandboxes left after cleanup")
    else:
        fail(f"unknown phase {phase}")


if __name__ == "__main__":
    main()
