#!/usr/bin/env bash
# The SPANK plugin against the real local Slurm cluster (started by slurm_fixture.sh). One case per call:
#   spank_test.sh CASE       (CASE: a function below, without the t_ prefix)
# Exit 0 pass, 1 fail (with what was expected and what came), 77 skipped (no root / no cluster here).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/lib.sh"
IMAGE=testbase:1
SRUN_TIMEOUT=60

[ "$(id -u)" = 0 ] || skip_test "the Slurm tests need root"
if [ -e "$BASE/skipped" ]; then skip_test "the local Slurm cluster cannot run here: $(cat "$BASE/skipped")"; fi
scontrol ping 2>/dev/null | grep -c 'is UP' >/dev/null || fail "the local Slurm cluster is not running (slurm_cluster_start)"
cd /tmp || fail "cd /tmp"   # a working directory every user can enter

OUT=$(mktemp) ERR=$(mktemp)
trap 'rm -f "$OUT" "$ERR"' EXIT
run() {  # run CMD...: stdout in $OUT, stderr in $ERR, exit code in $RC
    RC=0
    timeout "$SRUN_TIMEOUT" "$@" >"$OUT" 2>"$ERR" || RC=$?
}
show() { echo "--- exit code $RC"; echo "--- stdout"; cat "$OUT"; echo "--- stderr"; cat "$ERR"; }
expect_ok() { [ "$RC" = 0 ] || { show; fail "$1: exit code $RC"; }; }
expect_out() {  # regex description
    grep -Ec -- "$1" "$OUT" >/dev/null || { show; fail "$2: no line matches /$1/"; }
}
expect_out_count() {  # regex count description
    local n; n=$(grep -Ec -- "$1" "$OUT")
    [ "$n" = "$2" ] || { show; fail "$3: $n lines match /$1/, want $2"; }
}
nodes_idle() {  # every node idle (or at least not drained/down) within a few seconds
    local i
    for i in $(seq 1 50); do
        if [ -z "$(sinfo -h -N -o '%N %t' | grep -vE ' (idle|mix|alloc|comp)$')" ]; then return 0; fi
        sleep 0.2
    done
    sinfo -N -l
    return 1
}
init_exe() { echo "$(dirname "$DSEC_SPANK_SO")/dsec-sandbox-init"; }
sandbox_inits() {  # pids of sandbox inits started by the plugin under test
    # One find, not a readlink per process: the node may run thousands of other processes (a dense fleet).
    find /proc -mindepth 2 -maxdepth 2 -name exe -lname "$(init_exe)" 2>/dev/null | cut -d/ -f3
}
sandbox_cgroups() { find /sys/fs/cgroup/*/"$CGROUP_PARENT" /sys/fs/cgroup/"$CGROUP_PARENT" -mindepth 1 -maxdepth 1 -type d 2>/dev/null; }

# srun on two nodes: each task runs inside a sandbox (its hostname, pid 1 = dsec-sandbox-init, overlay root).
t_two_nodes() {
    run srun -N2 -n2 --dsec-image=$IMAGE sh -c \
        'echo "host=$(hostname) pid1=$(tr "\0" "\n" </proc/1/cmdline | head -1) image=$(cat /etc/dsec-test-image)"; grep " / " /proc/mounts'
    expect_ok "srun --dsec-image on 2 nodes"
    expect_out_count '^host=n[0-9]+-[0-9]+\.0 pid1=dsec-sandbox-init image=dsec test image$' 2 "a sandbox on each node"
    expect_out_count '^overlay / overlay ' 2 "overlay root in each sandbox"
    local hosts; hosts=$(grep -Eo '^host=n[0-9]+' "$OUT" | sort -u | wc -l)
    [ "$hosts" = 2 ] || { show; fail "want sandboxes on 2 different nodes, got $hosts"; }
}

# Two tasks on one node share one sandbox: same hostname, mount namespace, and files.
t_shared_sandbox() {
    run srun -N1 -n2 --dsec-image=$IMAGE sh -c '
        if [ "$SLURM_PROCID" = 0 ]; then echo shared >/tmp/handoff; fi
        for i in $(seq 1 50); do [ -e /tmp/handoff ] && break; sleep 0.1; done
        echo "task=$SLURM_PROCID host=$(hostname) mnt=$(readlink /proc/self/ns/mnt) file=$(cat /tmp/handoff)"'
    expect_ok "srun -n2 --dsec-image"
    expect_out_count '^task=[01] host=n[0-9]+-[0-9]+\.0 mnt=mnt:\[[0-9]+\] file=shared$' 2 "both tasks in a sandbox, seeing the file"
    [ "$(sed 's/^task=. //' "$OUT" | sort -u | wc -l)" = 1 ] || { show; fail "the two tasks are in different sandboxes"; }
}

# The task runs as the job's user, not root.
t_job_user() {
    local uid; uid=$(id -u "$TEST_USER") || fail "no user $TEST_USER (slurm_cluster_start creates it)"
    run runuser -u "$TEST_USER" -- env SLURM_CONF="$SLURM_CONF" srun -N1 --dsec-image=$IMAGE sh -c \
        'echo "uid=$(id -u) pid1=$(tr "\0" "\n" </proc/1/cmdline | head -1) host=$(hostname)"; touch /etc/x 2>/dev/null && echo wrote-etc; exit 0'
    expect_ok "srun as $TEST_USER"
    expect_out "^uid=$uid pid1=dsec-sandbox-init host=n[0-9]+-[0-9]+\.0$" "the task runs as $TEST_USER inside the sandbox"
    if grep -c wrote-etc "$OUT" >/dev/null; then show; fail "an unprivileged task could write /etc"; fi
}

# An unknown layer: a clear message naming it, a failed step, and the node stays in service.
t_bad_image() {
    run srun -N1 --dsec-image=nosuchlayer:7 true
    [ "$RC" != 0 ] || { show; fail "srun with an unknown image succeeded"; }
    grep -c 'nosuchlayer:7' "$ERR" >/dev/null || { show; fail "the error does not name the missing layer"; }
    grep -c 'not found' "$ERR" >/dev/null || { show; fail "the error does not say the layer is not found"; }
    nodes_idle || fail "a node is drained or down after a bad image"
    # the same with sbatch: the job fails, the node is not drained
    run sbatch --wait -N1 -o /dev/null --dsec-image=nosuchlayer:7 --wrap true
    [ "$RC" != 0 ] || { show; fail "sbatch with an unknown image succeeded"; }
    nodes_idle || fail "a node is drained or down after a batch job with a bad image"
}

# Bad values fail at submission, in srun/sbatch, before anything reaches a node.
t_bad_options() {
    local opt
    for opt in "--dsec-image=Bad_Name" "--dsec-image=debian" "--dsec-mem=lots" "--dsec-mem=1k" \
               "--dsec-mount=relative:/x" "--dsec-mount=/tmp" "--dsec-mount=/tmp:/x:rx" "--dsec-net=bridge" \
               "--dsec-backend=vm" "--dsec-workdir=rel"; do
        run srun -N1 --dsec-image=$IMAGE "$opt" true
        [ "$RC" != 0 ] || { show; fail "srun $opt succeeded"; }
        grep -c 'dsec' "$ERR" >/dev/null || { show; fail "srun $opt: no dsec message"; }
        run sbatch -N1 -o /dev/null --dsec-image=$IMAGE "$opt" --wrap true
        [ "$RC" != 0 ] || { show; fail "sbatch $opt was accepted"; }
    done
    DSEC_MEM=lots run srun -N1 --dsec-image=$IMAGE true
    [ "$RC" != 0 ] && grep -c 'DSEC_MEM' "$ERR" >/dev/null || { show; fail "a bad DSEC_MEM is not reported"; }
}

# sbatch --dsec-image runs the batch script inside the sandbox.
t_sbatch() {
    local log; log=$(mktemp -p /tmp dsec-sbatch.XXXXXX)
    chmod 666 "$log"
    run sbatch --wait -N1 -o "$log" --dsec-image=$IMAGE \
        --wrap 'echo "host=$(hostname) pid1=$(tr "\0" "\n" </proc/1/cmdline | head -1) image=$(cat /etc/dsec-test-image)"'
    cat "$log" >>"$OUT"; rm -f "$log"
    expect_ok "sbatch --wait --dsec-image"
    expect_out '^host=n[0-9]+-[0-9]+\.batch pid1=dsec-sandbox-init image=dsec test image$' "the batch script ran in a sandbox"
}

# --dsec-mount: host directories appear inside, read-only or writable, repeated or comma-separated.
t_mounts() {
    local ro rw; ro=$(mktemp -d) rw=$(mktemp -d)
    echo from-host >"$ro/in.txt"
    chmod 755 "$ro" "$rw"
    run srun -N1 --dsec-image=$IMAGE --dsec-mount="$ro:/data/in:ro" --dsec-mount="$rw:/data/out" sh -c \
        'cat /data/in/in.txt; echo x >/data/in/new 2>/dev/null && echo ro-writable; echo written >/data/out/result'
    expect_ok "srun with two --dsec-mount"
    expect_out '^from-host$' "the read-only mount shows the host file"
    if grep -c ro-writable "$OUT" >/dev/null; then show; fail "a :ro mount was writable"; fi
    [ "$(cat "$rw/result" 2>/dev/null)" = written ] || { show; fail "a write to the rw mount did not reach the host"; }
    run srun -N1 --dsec-image=$IMAGE --dsec-mount="$ro:/a:ro,$rw:/b" sh -c 'ls /a /b'
    expect_ok "comma-separated --dsec-mount"
    expect_out '^in.txt$' "comma-separated mounts"
    run srun -N1 --dsec-image=$IMAGE --dsec-mount="/nonexistent/dsec-src:/x" true
    [ "$RC" != 0 ] && grep -c '/nonexistent/dsec-src' "$ERR" >/dev/null || { show; fail "a missing mount source is not reported"; }
    rm -rf "$ro" "$rw"
    nodes_idle || fail "a node is drained after a bad mount"
}

# Environment defaults (DSEC_*) and Slurm's own SLURM_SPANK__SLURM_SPANK_OPTION_ variables.
t_env_defaults() {
    DSEC_IMAGE=$IMAGE run srun -N1 hostname
    expect_ok "DSEC_IMAGE srun"
    expect_out '^n[0-9]+-[0-9]+\.0$' "DSEC_IMAGE puts the step in a sandbox"
    run env "SLURM_SPANK__SLURM_SPANK_OPTION_dsec_dsec_image=$IMAGE" srun -N1 hostname
    expect_ok "SLURM_SPANK__SLURM_SPANK_OPTION_dsec_dsec_image srun"
    expect_out '^n[0-9]+-[0-9]+\.0$' "Slurm's option variable puts the step in a sandbox"
    run srun -N1 hostname
    expect_ok "plain srun"
    expect_out '^n[0-9]+$' "without an image the step runs on the node as usual"
}

# --dsec-workdir and --dsec-net.
t_workdir_and_net() {
    run srun -N1 --dsec-image=$IMAGE --dsec-workdir=/etc sh -c 'echo "cwd=$(pwd -P) PWD=$PWD"'
    expect_ok "--dsec-workdir"
    expect_out '^cwd=/etc PWD=/etc$' "the task starts in the workdir"
    run srun -N1 --dsec-image=$IMAGE sh -c 'echo "cwd=$(pwd -P)"'
    expect_out '^cwd=/$' "the default workdir is /"
    run srun -N1 --dsec-image=$IMAGE --dsec-workdir=/no/such/dir true
    [ "$RC" != 0 ] && grep -c '/no/such/dir' "$ERR" >/dev/null || { show; fail "a missing workdir is not reported"; }
    run srun -N1 --dsec-image=$IMAGE cat /proc/net/dev
    expect_ok "--dsec-net default"
    if grep -c 'eth0' "$OUT" >/dev/null; then show; fail "the default network (none) shows the node's eth0"; fi
    run srun -N1 --dsec-image=$IMAGE --dsec-net=host cat /proc/net/dev
    expect_ok "--dsec-net=host"
    expect_out 'eth0' "--dsec-net=host shows the node's eth0"
}

# --dsec-mem limits the sandbox's memory cgroup (v1 memory.limit_in_bytes / v2 memory.max).
t_memory() {
    srun -N1 --dsec-image=$IMAGE --dsec-mem=96M -J dsec-mem-test sleep 20 >/dev/null 2>&1 &
    local srun_pid=$! job="" limit="" i f
    for i in $(seq 1 100); do
        job=$(squeue -h -n dsec-mem-test -o %A | head -1)
        if [ -n "$job" ]; then
            for f in /sys/fs/cgroup/memory/"$CGROUP_PARENT"/*-"$job".0/memory.limit_in_bytes \
                     /sys/fs/cgroup/"$CGROUP_PARENT"/*-"$job".0/memory.max; do
                [ -r "$f" ] && limit=$(cat "$f") && break
            done
        fi
        [ -n "$limit" ] && break
        sleep 0.1
    done
    [ -n "$job" ] && scancel "$job"
    wait "$srun_pid" 2>/dev/null
    [ "$limit" = $((96 << 20)) ] || fail "memory limit of the step sandbox is '${limit}', want $((96 << 20))"
}

# scancel of a running step: the sandbox is gone afterwards (no init, no cgroup).
t_cancel() {
    local before; before=$(sandbox_inits | wc -l)
    srun -N1 --dsec-image=$IMAGE -J dsec-cancel-test sleep 300 >/dev/null 2>&1 &
    local srun_pid=$! job="" i
    for i in $(seq 1 100); do
        job=$(squeue -h -n dsec-cancel-test -t R -o %A | head -1)
        [ -n "$job" ] && [ "$(sandbox_inits | wc -l)" -gt "$before" ] && break
        sleep 0.1
    done
    [ -n "$job" ] || fail "the step did not start"
    [ "$(sandbox_inits | wc -l)" -gt "$before" ] || fail "no sandbox init while the step runs"
    scancel "$job"
    wait "$srun_pid" 2>/dev/null
    for i in $(seq 1 100); do
        [ -z "$(sandbox_cgroups | grep -- "-$job\.")" ] && [ "$(sandbox_inits | wc -l)" -le "$before" ] && break
        sleep 0.1
    done
    [ -z "$(sandbox_cgroups | grep -- "-$job\.")" ] || fail "cgroups left after scancel: $(sandbox_cgroups | grep -- "-$job\.")"
    [ "$(sandbox_inits | wc -l)" -le "$before" ] || fail "sandbox init still running after scancel"
    nodes_idle || fail "a node is not idle after scancel"
}

# salloc --dsec-image: the steps of the allocation run in sandboxes.
t_salloc() {
    run salloc -N1 --dsec-image=$IMAGE srun hostname
    expect_ok "salloc --dsec-image srun"
    expect_out '^n[0-9]+-[0-9]+\.0$' "a step of the allocation runs in a sandbox"
}

# slurmstepd killed (node trouble, OOM killer): the job epilog reaps the sandbox it could not destroy.
t_stepd_killed() {
    srun -N1 --dsec-image=$IMAGE -J dsec-stepd-kill sleep 300 >/dev/null 2>&1 &
    local srun_pid=$! job="" stepd="" p i
    for i in $(seq 1 100); do
        job=$(squeue -h -n dsec-stepd-kill -t R -o %A | head -1)
        [ -n "$job" ] && [ -n "$(sandbox_cgroups | grep -- "-$job\.0$")" ] && break
        sleep 0.1
    done
    [ -n "$job" ] || fail "the step did not start"
    # pgrep, not a subshell per process: the node may run thousands of other processes.
    for p in $(pgrep -f "^slurmstepd: \[$job\.0\]"); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "DSEC_SLURM_CLUSTER=$BASE" && stepd=$p
    done
    [ -n "$stepd" ] || fail "cannot find the slurmstepd of step $job.0"
    kill -9 "$stepd"
    scancel "$job"
    wait "$srun_pid" 2>/dev/null
    for i in $(seq 1 150); do
        [ -z "$(sandbox_cgroups | grep -- "-$job\.")" ] && break
        sleep 0.1
    done
    [ -z "$(sandbox_cgroups | grep -- "-$job\.")" ] || fail "the epilog did not reap the sandbox of job $job"
    nodes_idle || fail "a node is not idle after its slurmstepd was killed"
}

# After all the other cases: nothing of any sandbox is left on the nodes.
t_cleanup() {
    local i
    for i in $(seq 1 50); do
        [ -z "$(squeue -h)" ] && [ -z "$(sandbox_inits)" ] && [ -z "$(sandbox_cgroups)" ] && break
        sleep 0.2
    done
    [ -z "$(squeue -h)" ] || fail "jobs still running: $(squeue -h)"
    [ -z "$(sandbox_inits)" ] || fail "sandbox inits still running: $(sandbox_inits | tr '\n' ' ')"
    [ -z "$(sandbox_cgroups)" ] || fail "sandbox cgroups left: $(sandbox_cgroups | tr '\n' ' ')"
    nodes_idle || fail "not every node is idle"
}

# An unknown plugstack.conf key: the plugin refuses to load, naming the key.
t_unknown_plugstack_key() {
    local dir; dir=$(mktemp -d)
    sed "s#^PlugStackConfig=.*#PlugStackConfig=$dir/plugstack.conf#" "$SLURM_CONF" >"$dir/slurm.conf"
    cp "$BASE/etc/cgroup.conf" "$dir/cgroup.conf"
    echo "required $DSEC_SPANK_SO root=$STORE bogus_key=1" >"$dir/plugstack.conf"
    run env SLURM_CONF="$dir/slurm.conf" srun -N1 --dsec-image=$IMAGE true
    rm -rf "$dir"
    [ "$RC" != 0 ] || { show; fail "srun ran with an unknown plugstack.conf key"; }
    grep -c "unknown plugstack.conf argument 'bogus_key'" "$ERR" >/dev/null || { show; fail "the error does not name the key"; }
}

case="${1:-}"
declare -F "t_$case" >/dev/null || { echo "usage: $0 CASE (cases: $(declare -F | sed -n 's/^declare -f t_//p' | tr '\n' ' '))" >&2; exit 2; }
"t_$case"
echo "PASS: $case"
