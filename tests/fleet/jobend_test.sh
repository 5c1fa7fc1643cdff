#!/usr/bin/env bash
# Nothing outlives its fleet job, however the job ends (tests/slurm's local cluster; docs/fleet.md, "Which job
# owns what"). Every case starts slurm-configs/rollout-fleet.sbatch on the 3 nodes, puts sandboxes (with
# network "egress" where the host has nftables, so each has a veth) on every node, ends the job its way and
# then checks every node: no sandbox cgroup under the nodes' cgroup parents, no sandbox init still running, no
# layer mount under the nodes' directories, no sandbox veth, no record, no claim in /run/dsec/jobs.
#   jobend_test.sh scancel    scancel: the agents destroy their sandboxes on SIGTERM
#   jobend_test.sh timelimit  the job runs out of time (TimeLimit cut to 1 minute, Slurm's smallest, with scontrol)
#   jobend_test.sh sigkill    the agents of n2 and n3 are SIGKILLed, one is restarted inside the same job (it
#                             re-adopts its sandboxes), then scancel: the epilog (spank_dsec.so) destroys the rest
#   jobend_test.sh nodefail   (the fleet script without --no-kill) n3's agent and slurmd SIGKILLed and n3 set
#                             DOWN (Slurm ends the job: NODE_FAIL);
#                             n3 "reboots" (its /run claims are removed, its slurmd started again), so its
#                             epilog finds nothing: the sandboxes left on n3 are reaped, with a log line, by the
#                             next fleet job on the same root, which adopts none of them
#   jobend_test.sh mpirun     the fleet started with Open MPI's mpirun inside the allocation (not srun): a
#                             sandbox made and used through the gateway; scancel shuts it down cleanly
# Exit 77 = cannot run here. Environment: DSEC_LAUNCH (the dsec-launch binary), DSEC_CLI (dsec, for the clean-up
# of a failed case).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/fleet_lib.sh"

CASE=${1:-scancel}
FLEET=jobend$$
WORK="$BASE/fleet-$FLEET"
ROOT="$WORK/root"
export DSEC_FLEET="$FLEET"
FLEET_FILE="$HOME/.dsec/fleets/$FLEET.json"
REGISTRY=/run/dsec/jobs
NODES="n1 n2 n3"
rm -rf "$WORK"
mkdir -p "$ROOT"
ln -s "$STORE/layers" "$ROOT/layers"
JOBS=()
DOWNED=""
T0=$(date +%s)
log() { echo "[jobend-test $(( $(date +%s) - T0 ))s] $*"; }

cleanup() {
    local rc=$?
    set +e
    for j in "${JOBS[@]}"; do scancel "$j" 2>/dev/null; done
    if [ -n "$DOWNED" ]; then
        node_slurmd "$DOWNED" >/dev/null || start_slurmd "$DOWNED"
        for _ in $(seq 1 100); do node_slurmd "$DOWNED" >/dev/null && break; sleep 0.2; done
        scontrol update nodename="$DOWNED" state=resume 2>/dev/null
    fi
    for _ in $(seq 1 150); do
        left=0
        for j in "${JOBS[@]}"; do [ -n "$(squeue -h -j "$j" 2>/dev/null)" ] && left=1; done
        [ "$left" = 0 ] && break
        sleep 0.2
    done
    # Whatever a failed case left: the clean-up the epilog runs, for every job of the case, as each node (the
    # claims name the node's host name, its UTS namespace here).
    for j in "${JOBS[@]}"; do
        for n in $NODES; do
            s=$(node_slurmd "$n")
            [ -n "$s" ] && nsenter --uts="/proc/$s/ns/uts" "$DSEC" node cleanup --job "$j" >/dev/null 2>&1
        done
    done
    for m in $(awk -v p="$ROOT/" 'index($5, p) == 1 {print $5}' /proc/self/mountinfo | sort -r); do umount -l "$m"; done
    if [ "$rc" != 0 ] && [ "$rc" != 77 ]; then
        for f in "$WORK"/*.out; do echo "== $f"; tail -n 40 "$f"; done
    else
        rm -rf "$WORK"
    fi
    rm -f "$FLEET_FILE"
    exit "$rc"
}
trap cleanup EXIT

DSEC=${DSEC_CLI:-$(command -v dsec || true)}
[ -x "$DSEC" ] || fail "DSEC_CLI=${DSEC_CLI:-} is not executable (build dsec)"

node_slurmd() {  # node -> pid of its slurmd (fails when there is none)
    local p
    for p in $(ip netns pids "${NET_PREFIX}-$1" 2>/dev/null); do
        [ "$(cat "/proc/$p/comm" 2>/dev/null)" = slurmd ] && { echo "$p"; return 0; }
    done
    return 1
}
no_slurmd() { ! node_slurmd "$1" >/dev/null; }
start_slurmd() {  # node: as tests/slurm/cluster/start-cluster.sh starts it (stop-cluster.sh finds it by the mark)
    env "DSEC_SLURM_CLUSTER=$BASE" nsenter --net="/run/netns/${NET_PREFIX}-$1" unshare --uts \
        sh -c 'hostname "$1" && exec slurmd -N "$1"' sh "$1"
}
launch_pids() {  # node -> pids of this fleet's dsec-launch processes there (ranks and gateway)
    local p cmd
    for p in $(ip netns pids "${NET_PREFIX}-$1" 2>/dev/null); do
        cmd=$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null) || continue
        case "$cmd" in *dsec-launch*--fleet\ "$FLEET"*) echo "$p" ;; esac
    done
}
rank_pid() {  # node -> pid of this fleet's node agent there (not the gateway)
    local p
    for p in $(launch_pids "$1"); do
        tr '\0' ' ' <"/proc/$p/cmdline" | grep -c -- '--gateway-only' >/dev/null || echo "$p"
    done
}
not_queued() { [ -z "$(squeue -h -j "$1" 2>/dev/null)" ]; }
node_usable() { sinfo -h -n "$1" -o %t | grep -Ec '^(idle|mix|alloc)$' >/dev/null; }
agent_gone() { [ -z "$(rank_pid "$1")" ]; }
job_state() { scontrol show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
api() {  # METHOD PATH -> body
    local ep token
    ep=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["endpoint"])' "$FLEET_FILE")
    token=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["token"])' "$FLEET_FILE")
    curl -sS --max-time 10 -X "$1" -H "Authorization: Bearer $token" "$ep$2"
}
node_is() {  # node state: the gateway's node table says so
    api GET /v1/fleet/nodes | python3 -c 'import json,sys; sys.exit(0 if any(n["name"] == sys.argv[1] and n["state"] == sys.argv[2] for n in json.load(sys.stdin)["nodes"]) else 1)' "$1" "$2"
}
states_are() {
    [ "$(api GET /v1/fleet/nodes | python3 -c 'import json,sys; print(" ".join(n["name"] + "=" + n["state"] for n in json.load(sys.stdin)["nodes"]))')" = "$1" ]
}
fleet_py() {  # python with pydsec against the fleet
    PYTHONPATH="$REPO/pydsec" python3 - "$@"
}

start_fleet() {  # [sbatch args...] -> JOB
    local job
    job=$(sbatch --parsable -N3 --output="$WORK/fleet-%j.out" \
        --export=ALL,DSEC_FLEET="$FLEET",DSEC_ROOT="$ROOT",DSEC_LAUNCH="$DSEC_LAUNCH" "$@")
    JOBS+=("$job")
    JOB=$job
    wait_for 90 "the fleet file of job $job" test -s "$FLEET_FILE"
    wait_for 30 "3 healthy nodes" states_are "n1=healthy n2=healthy n3=healthy"
    log "fleet job $job up"
}

# Sandboxes on every node, each with a file and a background process; egress where the host can.
make_sandboxes() {
    fleet_py "$WORK/sandboxes.txt" <<'EOF'
import sys, pydsec
client = pydsec.Client()
network = "egress"
per_node = {}
for attempt in range(40):
    try:
        sb = client.create("testbase:1", cpus=0.1, memory="64M", network=network, labels={"jobend": "1"})
    except pydsec.DsecError as e:
        if network == "egress" and ("egress" in str(e) or "nftables" in str(e)):
            print(f"egress unavailable here ({e}): sandboxes without network")
            network = None
            continue
        raise
    sb.exec("echo kept > /tmp/mark; sleep 100000 >/dev/null 2>&1 &")
    node = sb.info()["node"]
    per_node.setdefault(node, []).append(sb.id)
    if len(per_node) == 3 and all(len(v) >= 2 for v in per_node.values()):
        break
if len(per_node) != 3:
    sys.exit(f"sandboxes landed on {sorted(per_node)} only")
with open(sys.argv[1], "w") as f:
    for node, ids in sorted(per_node.items()):
        for i in ids:
            f.write(f"{node} {i}\n")
print("sandboxes:", {n: len(v) for n, v in per_node.items()}, "network:", network or "none")
EOF
    # What the job owns, read from its claims while it runs: the checks afterwards look exactly there.
    python3 - "$REGISTRY/$JOB" >"$WORK/claims-$JOB.txt" <<'EOF'
import json, os, sys
for name in sorted(os.listdir(sys.argv[1])):
    c = json.load(open(os.path.join(sys.argv[1], name)))
    print(c["node"], c["state_dir"], c["cgroup_parent"])
EOF
    [ "$(wc -l <"$WORK/claims-$JOB.txt")" = 3 ] || fail "job $JOB has $(wc -l <"$WORK/claims-$JOB.txt") claims, want 3: $(cat "$WORK/claims-$JOB.txt")"
    # The sandboxes' init pids, from their records.
    python3 - "$ROOT" >"$WORK/inits-$JOB.txt" <<'EOF'
import glob, json, sys
for path in sorted(glob.glob(sys.argv[1] + "/nodes/*/state/sandboxes/*.json")):
    r = json.load(open(path))
    print(r["backend_state"]["init_pid"], r["backend_state"]["init_start_time"], r.get("slurm_job"))
EOF
    grep -vc " $JOB\$" "$WORK/inits-$JOB.txt" >/dev/null && fail "records not owned by job $JOB: $(grep -v " $JOB\$" "$WORK/inits-$JOB.txt")"
    [ "$(wc -l <"$WORK/inits-$JOB.txt")" = "$(wc -l <"$WORK/sandboxes.txt")" ] ||
        fail "$(wc -l <"$WORK/inits-$JOB.txt") records for the $(wc -l <"$WORK/sandboxes.txt") sandboxes made: the checks would look at too few inits"
    log "$(wc -l <"$WORK/inits-$JOB.txt") sandboxes of job $JOB on $NODES"
}

# What is still there of job $1 (nothing printed: nothing).
leftovers_of() {
    local job=$1 node dir parent pid start
    while read -r node dir parent; do
        for d in /sys/fs/cgroup/"$parent" /sys/fs/cgroup/*/"$parent"; do
            [ -d "$d" ] && echo "cgroup $d"
        done
        awk -v p="$dir/mnt" '$5 == p || index($5, p "/") == 1 {print "mount " $5}' /proc/self/mountinfo
        for f in "$dir"/state/sandboxes/*.json; do [ -e "$f" ] && echo "record $f"; done
    done <"$WORK/claims-$job.txt"
    while read -r pid start _; do
        [ -r "/proc/$pid/stat" ] && [ "$(awk '{print $22}' "/proc/$pid/stat" 2>/dev/null)" = "$start" ] && echo "init $pid"
    done <"$WORK/inits-$job.txt"
    for node in $NODES; do
        ip -n "${NET_PREFIX}-$node" -o link show 2>/dev/null | grep -Eo ' dsv[0-9]+@' | sed "s/^/veth $node:/"
        for pid in $(launch_pids "$node"); do echo "dsec-launch $node:$pid"; done
    done
    [ -e "$REGISTRY/$job" ] && echo "claims $REGISTRY/$job: $(ls "$REGISTRY/$job")"
    return 0
}
nothing_left_of() { [ -z "$(leftovers_of "$1")" ]; }
check_nothing_left() {  # job how
    # (Generous: Slurm checks time limits, which it keeps in whole minutes, about every 30 s.)
    wait_for 150 "job $1 to leave the queue" not_queued "$1"
    local end=$(( $(date +%s) + 30 ))
    until nothing_left_of "$1"; do
        [ "$(date +%s)" -lt "$end" ] || fail "job $1 ($2, $(job_state "$1")) left behind: $(leftovers_of "$1" | tr '\n' ';')"
        sleep 0.3
    done
    log "job $1 ended ($2, state $(job_state "$1")): nothing of it is left on any node"
}

# ---- the cases
t_scancel() {
    start_fleet "$REPO/slurm-configs/rollout-fleet.sbatch"
    make_sandboxes
    scancel "$JOB"
    check_nothing_left "$JOB" scancel
}

t_timelimit() {
    start_fleet "$REPO/slurm-configs/rollout-fleet.sbatch"
    make_sandboxes
    scontrol update JobId="$JOB" TimeLimit=1
    check_nothing_left "$JOB" "time limit"
    [ "$(job_state "$JOB")" = TIMEOUT ] || fail "job $JOB ended as $(job_state "$JOB"), not TIMEOUT"
}

t_sigkill() {
    start_fleet "$REPO/slurm-configs/rollout-fleet.sbatch"
    make_sandboxes
    local n p
    for n in n2 n3; do
        p=$(rank_pid "$n")
        [ -n "$p" ] || fail "no agent of the fleet on $n"
        kill -KILL "$p"
        log "SIGKILLed the agent of $n ($p)"
    done
    for n in n2 n3; do wait_for 10 "the agent of $n to die" agent_gone "$n"; done
    # A restarted agent inside the same job re-adopts its sandboxes (n2), as before.
    srun --jobid="$JOB" --overlap -N1 -n1 -w n2 --mpi=none --output="$WORK/restart-n2.out" \
        "$DSEC_LAUNCH" --join "$FLEET" --root "$ROOT" &
    wait_for 30 "n2's restarted agent" grep -c "joined fleet $FLEET" "$WORK/restart-n2.out"
    wait_for 30 "n2 healthy again at the gateway" node_is n2 healthy
    fleet_py "$WORK/sandboxes.txt" <<'EOF'
import sys, pydsec
client = pydsec.Client()
ids = [line.split()[1] for line in open(sys.argv[1]) if line.startswith("n2 ")]
for i in ids:
    r = client.sandbox(i).exec("cat /tmp/mark")
    assert r.stdout == "kept\n", (i, r.stdout, r.stderr)
print(f"n2's restarted agent re-adopted its {len(ids)} sandboxes")
EOF
    grep -c "reaping it instead of adopting" "$WORK/restart-n2.out" >/dev/null && fail "the restarted agent reaped its own job's sandboxes"
    scancel "$JOB"
    check_nothing_left "$JOB" "agents of n2 and n3 SIGKILLed, then scancel"
}

t_nodefail() {
    # rollout-fleet.sbatch asks for --no-kill, so a failed node does not end the fleet (tested by fleet_test.sh
    # failover). A site whose fleet script does not, or a node failure Slurm ends the job for, is this case: the
    # same script without --no-kill. --no-requeue: a batch job is otherwise requeued (and starts again with the
    # same id) after a node failure.
    sed -e '/^#SBATCH --no-kill/d' -e 's/ --no-kill / /' "$REPO/slurm-configs/rollout-fleet.sbatch" >"$WORK/killable-fleet.sbatch"
    grep -Ec -- '^(#SBATCH|[^#]).*--no-kill' "$WORK/killable-fleet.sbatch" >/dev/null && fail "could not take --no-kill out of rollout-fleet.sbatch"
    start_fleet --no-requeue "$WORK/killable-fleet.sbatch"
    make_sandboxes
    local first=$JOB p
    p=$(rank_pid n3)
    [ -n "$p" ] || fail "no agent of the fleet on n3"
    # The node dies: its agent and its slurmd (so no epilog can run there), and Slurm declares it DOWN.
    kill -KILL "$p"
    DOWNED=n3
    kill -KILL "$(node_slurmd n3)"
    wait_for 10 "n3's slurmd to die" no_slurmd n3
    scontrol update nodename=n3 state=down reason="dsec jobend test: node failure"
    log "n3's agent and slurmd SIGKILLed, n3 set DOWN"
    wait_for 60 "job $first to end" not_queued "$first"
    log "job $first ended: $(job_state "$first")"
    [ "$(job_state "$first")" = NODE_FAIL ] || fail "job $first ended as $(job_state "$first"), not NODE_FAIL"
    # When n3's slurmd comes back, Slurm sends it the job's end again and its epilog runs then. A node that
    # really failed rebooted: its /run (the job's claims) is gone, and with it what the epilog would find; here
    # its sandboxes even kept running. Only the records on the shared root are left to go by.
    local n3_claims; n3_claims=$(grep -l '"host":"n3"' "$REGISTRY/$first"/*.json) || fail "job $first has no claim of n3"
    rm -f $n3_claims
    start_slurmd n3
    wait_for 30 "n3's slurmd" node_slurmd n3
    scontrol update nodename=n3 state=resume 2>/dev/null || true
    DOWNED=""
    wait_for 60 "n3 to be usable again" node_usable n3
    # n1 and n2 had their epilog; n3 did not (Slurm never ran it on a DOWN node): its sandboxes are still there.
    local left; left=$(leftovers_of "$first" | grep -c "^init " || true)
    log "after the node failure, $left sandbox init(s) of job $first are left (on n3, whose epilog did not run)"
    [ "$left" -gt 0 ] || fail "nothing of job $first was left on n3: the node failure was not simulated"
    # The next fleet job on the same root reaps them at start, saying so, and adopts none of them.
    rm -f "$FLEET_FILE"
    start_fleet "$REPO/slurm-configs/rollout-fleet.sbatch"
    wait_for 20 "the new job's log line about job $first" grep -c "belongs to Slurm job $first, not to this agent's job $JOB: reaping it" "$WORK/fleet-$JOB.out"
    log "the next job says: $(grep -m1 "belongs to Slurm job $first" "$WORK/fleet-$JOB.out" | sed 's/.*node: //')"
    fleet_py <<'EOF'
import pydsec
left = pydsec.Client().list()
assert not left, f"the new fleet job lists sandboxes of the old one: {[s.id for s in left]}"
print("the new fleet job adopted nothing of the old one")
EOF
    # (The new job runs on the same directories and cgroup parents: only what is the old job's own counts.)
    local end=$(( $(date +%s) + 30 ))
    until [ -z "$(leftovers_of "$first" | grep -E '^(init|record|veth|claims) ')" ]; do
        [ "$(date +%s)" -lt "$end" ] || fail "job $first left behind: $(leftovers_of "$first" | tr '\n' ';')"
        sleep 0.3
    done
    log "the sandboxes, records and claims of job $first are gone"
    scancel "$JOB"
    check_nothing_left "$JOB" "scancel of the next job"
}

t_mpirun() {
    command -v mpirun >/dev/null || skip_test "no mpirun (openmpi-bin)"
    cat >"$WORK/mpirun-fleet.sbatch" <<EOF
#!/bin/bash
#SBATCH --ntasks-per-node=1
source "$BASE/env.sh"
exec mpirun --map-by ppr:1:node "$DSEC_LAUNCH" --fleet "$FLEET" --root "$ROOT"
EOF
    start_fleet "$WORK/mpirun-fleet.sbatch"
    fleet_py <<'EOF'
import pydsec
client = pydsec.Client()
with client.create("testbase:1", cpus=0.1, memory="64M") as sb:
    sb.write_file("/tmp/hello", "from mpirun\n")
    r = sb.exec("cat /tmp/hello; hostname")
    assert r.exit_code == 0 and r.stdout.startswith("from mpirun\n"), r
    print(f"sandbox {sb.id} on {sb.info()['node']} under an mpirun fleet: {r.stdout.split()[-1]}")
EOF
    make_sandboxes
    scancel "$JOB"
    check_nothing_left "$JOB" "scancel of an mpirun fleet"
    [ ! -e "$FLEET_FILE" ] || fail "the fleet file $FLEET_FILE is still there"
}

declare -F "t_$CASE" >/dev/null || fail "unknown case $CASE"
"t_$CASE"
log "PASS: $CASE"
