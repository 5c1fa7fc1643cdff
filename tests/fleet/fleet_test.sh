#!/usr/bin/env bash
# The rollout fleet against a real Slurm cluster (tests/slurm's fixture: slurmctld + 3 slurmd in network
# namespaces, the busybox layer testbase:1 in $STORE):
#   1. slurm-configs/rollout-fleet.sbatch on 3 nodes; pydsec in a separate job creates 30 sandboxes that land
#      on n1, n2 and n3 and run commands, files and a streamed exec through the gateway; a pydsec session
#      spreads over the nodes, is merged by the gateway, attached to and destroyed;
#   2. kill -9 of the gateway process: the supervisor restarts it, nodes re-register, no sandbox is lost;
#   3. kill -9 of node n3's rank: its sandboxes get a clear "node n3 is lost" error within 5 s (no hang; a
#      pydsec NodeLostError, and sb.info() says state "lost"), the others keep serving, new sandboxes go to n1
#      and n2;
#   4. `dsec-launch --join` from a second job brings n3 back (it re-adopts its sandboxes); draining n3 at the
#      gateway keeps new sandboxes off it; cancelling the join job drains and deregisters it.
# `fleet_test.sh admission`: rollout-fleet.sbatch with -N3 --ntasks-per-node=1 -c1 (a 1-CPU allocation per node);
#   30 idle sandboxes of the default size (1 CPU each) from pydsec are all admitted, over all 3 nodes, and no node
#   refuses a create the gateway sent it (the gateway places by the nodes' own admission, not a ratio of its own).
# `fleet_test.sh failover`: rollout-fleet.sbatch with -N3 --ntasks-per-node=1 -c1 (3 gateway candidates, listed in
#   the fleet file); pydsec makes 30 sandboxes over n1..n3, then rank 0's node n1 dies whole (its dsec-launch, with
#   the node agent in it, and its gateway, SIGKILL) while a pydsec client is in use: the same client carries on
#   through another gateway (the time from the kill to its first successful call is printed), n2's and n3's
#   sandboxes exec and serve files, n1's are lost (NodeLostError), new creates land on n2 and n3, and the job
#   keeps running.
# `fleet_test.sh snapshot`: rollout-fleet.sbatch on 2 nodes (-N2 -c1; the fleet's snapshot store is
#   <fleet root>/snapshots, shared by both); pydsec, with n2 drained at the gateway, makes a container sandbox on
#   n1, writes files and snapshots it; then n1 is drained instead and n2 undrained, and a restore of the snapshot
#   lands on n2 with the files as they were at the snapshot (not as the source has them since); a fork of the
#   restored sandbox makes its copies on n2; listing, lookup and delete of the snapshot through the gateway. Then a
#   microVM with a running counter is snapshotted (memory and processes) on one node and restored on the other,
#   where the counter runs on (skipped, saying so, when the nodes have no microvm backend).
#   Skipped (77) when the nodes have no snapshot routes.
# `fleet_test.sh store`: a layer only in a shared layer store (built from the fixture's busybox tree plus a 4 MiB
#   file and pushed there) and rollout-fleet.sbatch on 2 nodes with DSEC_STORE set: batches of 8 concurrent creates
#   of its image until they span both nodes, each reading the whole file; every node fetched each chunk once.
# `fleet_test.sh trainer`: slurm-configs/trainer.sbatch in the preemptible partition makes sandboxes through a
#   session and starts a background process in each; a rollout job preempts it; while it waits to be requeued
#   its lease lapses and the fleet pauses the sandboxes; the requeued trainer attaches and finds every sandbox
#   with its files and its process, and carries on.
# Exit 77 = cannot run here. Environment: DSEC_LAUNCH (the dsec-launch binary).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/fleet_lib.sh"

CASE=${1:-fleet}
FLEET=fleettest$$
WORK="$BASE/fleet-$FLEET"
ROOT="$WORK/root"
STATE="$WORK/client-state.json"
export DSEC_FLEET="$FLEET"
FLEET_FILE="$HOME/.dsec/fleets/$FLEET.json"
rm -rf "$WORK"
mkdir -p "$ROOT"
ln -s "$STORE/layers" "$ROOT/layers"
JOBS=()
T0=$(date +%s)
log() { echo "[fleet-test $(( $(date +%s) - T0 ))s] $*"; }

cleanup() {
    local rc=$?
    set +e
    if [ -r "$FLEET_FILE" ]; then client cleanup >/dev/null 2>&1; fi
    for j in "${JOBS[@]}"; do scancel "$j" 2>/dev/null; done
    for _ in $(seq 1 100); do
        left=0
        for j in "${JOBS[@]}"; do [ -n "$(squeue -h -j "$j" 2>/dev/null)" ] && left=1; done
        [ "$left" = 0 ] && break
        sleep 0.2
    done
    # Sandboxes of a node whose rank was killed and never came back: a throw-away agent on its state dir
    # re-adopts them and destroys them on SIGTERM.
    for d in "$ROOT"/nodes/*; do
        [ -n "$(ls "$d/state/sandboxes" 2>/dev/null)" ] || continue
        n=$(basename "$d")
        log "reaping what node $n left behind"
        HOME="$WORK/reap-home" "$DSEC_LAUNCH" --no-mpi --fleet "reap-$n" --root "$ROOT" --node-name "$n" \
            --address 127.0.0.1 >"$WORK/reap-$n.log" 2>&1 &
        p=$!
        for _ in $(seq 1 50); do grep -c 'serving on' "$WORK/reap-$n.log" >/dev/null 2>&1 && break; sleep 0.1; done
        kill -TERM "$p"; wait "$p"
    done
    for m in $(awk -v p="$ROOT/" 'index($5, p) == 1 {print $5}' /proc/self/mountinfo | sort -r); do umount -l "$m"; done
    if [ "$rc" != 0 ] && [ "$rc" != 77 ]; then
        for f in "$WORK"/*.out; do echo "== $f"; tail -n 30 "$f"; done
    else
        rm -rf "$WORK"
    fi
    rm -f "$FLEET_FILE"
    exit "$rc"
}
trap cleanup EXIT

# pydsec in a job of its own, on n2 (the trainer's side of the fleet).
client() {
    srun -N1 -w "${CLIENT_NODE:-n2}" --mpi=none -t 5 --export=ALL,PYTHONPATH="$REPO/pydsec",DSEC_FLEET="$FLEET" \
        /usr/bin/python3 "$HERE/fleet_client.py" "$@" "$STATE" "${CLIENT_ARG:-}"
}
api() {  # METHOD PATH -> body (through $API_ENDPOINT, else the fleet file's first gateway)
    local ep token
    ep=${API_ENDPOINT:-$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["endpoint"])' "$FLEET_FILE")}
    token=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["token"])' "$FLEET_FILE")
    curl -sS --max-time 10 -X "$1" -H "Authorization: Bearer $token" "$ep$2"
}
node_states() {  # "n1=healthy n2=healthy ..."
    api GET /v1/fleet/nodes | python3 -c 'import json,sys; print(" ".join(n["name"] + "=" + n["state"] for n in json.load(sys.stdin)["nodes"]))'
}
states_are() { [ "$(node_states)" = "$1" ]; }
launch_pid() {  # node [gateway] -> pid of that node's dsec-launch rank (or of its gateway process)
    local p cmd
    for p in $(ip netns pids "${NET_PREFIX}-$1" 2>/dev/null); do
        cmd=$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null) || continue
        # Not srun (on the batch host its command line names dsec-launch too): the rank itself.
        [ "$(basename "$(readlink "/proc/$p/exe" 2>/dev/null)")" = dsec-launch ] || continue
        case "$cmd" in
            *dsec-launch*--gateway-only*--fleet\ "$FLEET"*) [ "${2:-}" != gateway ] || echo "$p" ;;
            *dsec-launch*--fleet\ "$FLEET"*) [ "${2:-}" = gateway ] || echo "$p" ;;
        esac
    done
}

start_fleet() {  # [more sbatch arguments]; FLEET_NODES nodes (default 3)
    local nodes=${FLEET_NODES:-3} job want
    want=$(for i in $(seq 1 "$nodes"); do printf 'n%s=healthy ' "$i"; done)
    want=${want% }
    log "starting fleet $FLEET on $nodes nodes $*"
    job=$(sbatch --parsable -N"$nodes" "$@" --output="$WORK/fleet.out" \
        --export=ALL,DSEC_FLEET="$FLEET",DSEC_ROOT="$ROOT",DSEC_LAUNCH="$DSEC_LAUNCH" \
        "$REPO/slurm-configs/rollout-fleet.sbatch")
    JOBS+=("$job")
    wait_for 60 "the fleet file $FLEET_FILE" test -s "$FLEET_FILE"
    [ "$(stat -c %a "$FLEET_FILE")" = 600 ] || fail "the fleet file is not mode 0600"
    wait_for 30 "$nodes healthy nodes" states_are "$want"
    log "fleet up: $(node_states)"
}

if [ "$CASE" = admission ]; then
    start_fleet --ntasks-per-node=1 -c1
    client admission
    # Every node's own books (its GET /v1/node, asked directly): what it holds, what it refused, the ratio it
    # admits by; and the allocation the gateway was told of.
    python3 - "$FLEET_FILE" <<'PY' || fail "the nodes' own admission does not agree"
import json, sys, urllib.request
fleet = json.load(open(sys.argv[1]))
def get(endpoint, path):
    req = urllib.request.Request(endpoint + path, headers={"Authorization": "Bearer " + fleet["token"]})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)
nodes = {n["name"]: n for n in get(fleet["endpoint"], "/v1/fleet/nodes")["nodes"]}
held = 0
for name in ("n1", "n2", "n3"):
    own = get(nodes[name]["endpoint"], "/v1/node")
    a = own["admission"]
    print(f"{name}: allocation {nodes[name]['capacity']['cpus']} CPU, {own['sandboxes']} sandboxes, "
          f"{own['density']['refusals']} refused; admits CPU by use ({a['cpu_used']}) <= cpu_ratio {a['cpu_ratio']} "
          f"x {a['cpus']} CPUs (committed {a['cpu_committed']}), memory_ratio {a['memory_ratio']}")
    assert nodes[name]["capacity"]["cpus"] == 1, f"{name} did not run on a 1-CPU allocation: {nodes[name]}"
    assert own["density"]["refusals"] == 0, f"{name} refused a create the gateway sent it"
    assert a["cpu_by_use"], f"{name}: CPU admitted by limits, not by use: {a}"
    held += own["sandboxes"]
assert held == 30, f"the nodes hold {held} sandboxes, not 30"
PY
    # srun --dsec-image steps beside the fleet: a 1-CPU step in its own sandbox on every node (the nodes have a
    # CPU the fleet's allocation left free) while the fleet holds its 30 sandboxes.
    steps=$(timeout 120 srun -N3 -n3 --ntasks-per-node=1 -c1 --dsec-image=testbase:1 sh -c \
        'echo "step host=$(hostname) pid1=$(tr "\0" "\n" </proc/1/cmdline | head -1) image=$(cat /etc/dsec-test-image)"' 2>&1) ||
        fail "srun --dsec-image beside the fleet failed: $steps"
    [ "$(echo "$steps" | grep -Ec '^step host=n[1-3]-[0-9]+\.0 pid1=dsec-sandbox-init image=dsec test image$')" = 3 ] ||
        fail "want a sandboxed step on each of the 3 nodes beside the fleet, got: $steps"
    log "srun --dsec-image steps ran beside the fleet on all 3 nodes"
    client cleanup
    log "PASS"
    exit 0
fi

if [ "$CASE" = snapshot ]; then
    FLEET_NODES=2 start_fleet --ntasks-per-node=1 -c1
    rc=0
    client snapshot || rc=$?
    [ "$rc" = 77 ] && skip_test "the fleet's nodes have no snapshot routes yet"
    [ "$rc" = 0 ] || fail "restoring a snapshot on another node failed"
    [ -z "$(ls "$ROOT/snapshots" 2>/dev/null)" ] || fail "snapshots left in $ROOT/snapshots: $(ls "$ROOT/snapshots")"
    client cleanup
    log "PASS"
    exit 0
fi

if [ "$CASE" = store ]; then
    # A layer only in the fleet's shared layer store (not in the nodes' own): built from the fixture's busybox
    # tree plus a 4 MiB file, in a root of its own, and pushed to $WORK/shared-store.
    [ -x "${DSEC_CLI:-}" ] || skip_test "DSEC_CLI (the dsec binary) is not set"
    [ -e /dev/fuse ] || skip_test "no /dev/fuse: on-demand layers need FUSE"
    SHARED="$WORK/shared-store"
    mkdir -p "$SHARED" "$WORK/base-mnt" "$WORK/tree"
    mount -t erofs -o ro "$STORE/layers/testbase/1/layer.erofs" "$WORK/base-mnt"
    cp -a "$WORK/base-mnt/." "$WORK/tree/"
    umount "$WORK/base-mnt"
    mkdir -p "$WORK/tree/data"
    head -c 4194304 /dev/urandom >"$WORK/tree/data/big.bin"
    md5=$(md5sum <"$WORK/tree/data/big.bin" | cut -d' ' -f1)
    "$DSEC_CLI" layer build ondemand:1 --from-dir "$WORK/tree" --root "$WORK/builder" --store "$SHARED" ||
        fail "building and pushing the layer failed"
    [ ! -e "$ROOT/layers/ondemand" ] || fail "the layer is in the nodes' own store: the test would prove nothing"
    export DSEC_STORE="$SHARED"
    FLEET_NODES=2 start_fleet --ntasks-per-node=1 -c1
    CLIENT_ARG=$md5 client store
    # Every node fetched each chunk it needed once, however many of its sandboxes mounted the layer at once.
    python3 - "$FLEET_FILE" <<'PY' || fail "a node fetched a chunk twice, or not at all"
import json, sys, urllib.request
fleet = json.load(open(sys.argv[1]))
def get(endpoint, path):
    req = urllib.request.Request(endpoint + path, headers={"Authorization": "Bearer " + fleet["token"]})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)
for node in get(fleet["endpoint"], "/v1/fleet/nodes")["nodes"]:
    own = get(node["endpoint"], "/v1/node")
    store = own["layer_store"]
    assert store and store["error"] is None, f"{node['name']}: {store}"
    c = store["chunk_cache"]
    print(f"{node['name']}: {own['sandboxes']} sandboxes; {c['misses']} chunks fetched "
          f"({c['bytes_fetched']} bytes), {c['chunks']} cached, {c['hits']} hits, {c['corrupt']} corrupt")
    assert own["sandboxes"] > 0, f"{node['name']} has no sandbox of the image"
    assert c["misses"] == c["chunks"] and c["evictions"] == 0, f"{node['name']} fetched a chunk twice: {c}"
    assert c["bytes_fetched"] >= 4 << 20 and c["corrupt"] == 0 and c["fetch_errors"] == 0, f"{node['name']}: {c}"
PY
    client cleanup
    log "PASS"
    exit 0
fi

if [ "$CASE" = failover ]; then
    start_fleet --ntasks-per-node=1 -c1
    n_endpoints=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["endpoints"]))' "$FLEET_FILE")
    [ "$n_endpoints" = 3 ] || fail "the fleet file lists $n_endpoints gateways, not 3"
    client create
    rank0=$(launch_pid n1)
    gw0=$(launch_pid n1 gateway)
    [ -n "$rank0" ] && [ -n "$gw0" ] || fail "no dsec-launch rank 0 or gateway of fleet $FLEET on n1"
    CLIENT_ARG=n1 client failover >"$WORK/failover-client.out" 2>&1 &
    client_pid=$!
    wait_for 60 "the pydsec client to be in use" test -e "$STATE.ready"
    # Rank 0's node dies whole: the rank (its node agent is in it) and its gateway, with no cleanup.
    date +%s.%N >"$STATE.killed.tmp"
    kill -9 "$rank0" "$gw0"
    mv "$STATE.killed.tmp" "$STATE.killed"
    log "killed rank 0 ($rank0) and its gateway ($gw0) on n1"
    wait "$client_pid" || { cat "$WORK/failover-client.out"; fail "pydsec did not carry on after rank 0's node died"; }
    cat "$WORK/failover-client.out"
    API_ENDPOINT=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["endpoints"][1])' "$FLEET_FILE")
    export API_ENDPOINT
    wait_for 15 "n1 lost at the surviving gateway" states_are "n1=lost n2=healthy n3=healthy"
    [ "$(squeue -h -j "${JOBS[0]}" -o %T)" = RUNNING ] || fail "the fleet job did not survive rank 0: $(squeue -h -j "${JOBS[0]}")"
    log "rank 0's node is gone; the fleet serves on n2 and n3: $(node_states)"
    client cleanup
    log "PASS"
    exit 0
fi

if [ "$CASE" = trainer ]; then
    start_fleet
    session_field() {  # session field
        api GET "/v1/sessions/$1" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get(sys.argv[1]))' "$2"
    }
    session_lapsed() { [ "$(session_field "$SESSION" state)" = lapsed ]; }
    requeued() { [ "$(scontrol show job "$tjob" 2>/dev/null | grep -o 'Restarts=[0-9]*')" = Restarts=1 ]; }
    tjob=$(sbatch --parsable -p trainer -w n1 --output="$WORK/trainer.out" \
        --export=ALL,DSEC_FLEET="$FLEET",TRAINER_IMAGE=testbase:1,TRAINER_SANDBOXES=4,TRAINER_LEASE=3,TRAINER_STEPS=12,TRAINER_STEP_SECONDS=1,PYTHONPATH="$REPO/pydsec" \
        "$REPO/slurm-configs/trainer.sbatch")
    JOBS+=("$tjob")
    SESSION="trainer-$tjob"
    wait_for 60 "the trainer's sandboxes" grep -c "created 4 sandboxes" "$WORK/trainer.out"
    log "trainer $tjob made its sandboxes: $(grep 'created 4' "$WORK/trainer.out")"
    sleep 2
    # A rollout job that needs n1's other CPU preempts the trainer (PreemptMode=REQUEUE).
    pjob=$(sbatch --parsable -p rollout -w n1 -n1 --output="$WORK/preemptor.out" --wrap "sleep 10")
    JOBS+=("$pjob")
    wait_for 30 "the trainer to be preempted and requeued" requeued
    log "trainer preempted and requeued"
    wait_for 20 "the session's lease to lapse" session_lapsed
    first=$(api GET "/v1/sessions/$SESSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["sandboxes"][0])')
    paused_by=$(api GET "/v1/sandboxes/$first" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("state"), d.get("paused_by"))')
    [ "$paused_by" = "paused lease" ] || fail "sandbox $first of the lapsed session is '$paused_by', not paused by the lease"
    log "lease lapsed: the session's sandboxes are paused ($first: $paused_by)"
    wait_for 180 "the requeued trainer to finish" grep -c "trainer done" "$WORK/trainer.out"
    grep -c "re-attached to 4 sandboxes" "$WORK/trainer.out" >/dev/null || fail "the requeued trainer did not re-attach"
    [ "$(grep -c 'background process alive' "$WORK/trainer.out")" = 4 ] || fail "not every background process survived"
    grep -E "re-attached|alive|trainer done" "$WORK/trainer.out"
    log "PASS"
    exit 0
fi

# ---- 1. the fleet
start_fleet
client create
log "created 30 sandboxes"
client session
log "a session across the fleet"

# ---- 2. gateway restart
gw=$(launch_pid n1 gateway)
[ -n "$gw" ] || fail "no gateway process of fleet $FLEET on n1"
kill -9 "$gw"
log "killed the gateway ($gw)"
wait_for 15 "the restarted gateway with 3 healthy nodes" states_are "n1=healthy n2=healthy n3=healthy"
new_gw=$(launch_pid n1 gateway)
[ -n "$new_gw" ] && [ "$new_gw" != "$gw" ] || fail "the gateway was not restarted"
client check
log "gateway restarted ($new_gw): every sandbox reachable"

# ---- 3. a node dies
victim=$(launch_pid n3)
[ -n "$victim" ] || fail "no dsec-launch rank on n3"
kill -9 "$victim"
log "killed node n3's rank ($victim)"
CLIENT_ARG=n3 client lost
states_are "n1=healthy n2=healthy n3=lost" || fail "fleet nodes after the kill: $(node_states)"
log "n3 reported lost; the others serve"

# ---- 4. n3 comes back through --join from a second job, is drained, and leaves
join=$(sbatch --parsable -N1 -w n3 --output="$WORK/join.out" --export=ALL,DSEC_ROOT="$ROOT" \
    --wrap "srun --mpi=none '$DSEC_LAUNCH' --join '$FLEET' --root '$ROOT' --drain-timeout 10")
JOBS+=("$join")
wait_for 30 "n3 to join again" states_are "n1=healthy n2=healthy n3=healthy"
CLIENT_ARG=n3 client after-join
api POST /v1/fleet/nodes/n3/drain >/dev/null
states_are "n1=healthy n2=healthy n3=draining" || fail "after drain: $(node_states)"
client cleanup
# Signal the step (dsec-launch), not the batch shell: a killed shell would end the job before the node left.
scancel --signal=TERM "$join"
wait_for 20 "n3 to leave the fleet" states_are "n1=healthy n2=healthy"
log "n3 joined, drained and left"
log "PASS"
