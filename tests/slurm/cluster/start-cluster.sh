#!/usr/bin/env bash
# start-cluster.sh - a real, throw-away Slurm cluster on this one machine for dsec's tests:
# munge, slurmctld and N slurmd (Debian 12 packages, Slurm 22.05), each slurmd in its own network and
# UTS namespace (hostname nI, address SUBNET.(10+I)) on a private bridge; slurmctld, srun and sbatch run in
# the root namespaces at SUBNET.1. Every slurmd shares the host's mount namespace and file systems, the way
# compute nodes share a file system on a real cluster; the layer store is one directory for all nodes.
#
# Idempotent: running it again with the same settings leaves a running cluster alone (it only waits until
# every node answers); changed settings restart the daemons. Stop it with stop-cluster.sh (same BASE).
#
# Exit codes: 0 ready; 77 cannot run here (not root, packages not installable, no network namespaces) -
# tests map 77 to "skipped"; anything else is a real failure (message and log tail on stderr).
#
# Settings (environment, all optional):
#   DSEC_SLURM_BASE         configs, state, logs, pid files                       [/tmp/dsec-slurm]
#   DSEC_SLURM_NODES        compute nodes n1..nN                                   [3]
#   DSEC_SLURM_CPUS         CPUs declared per node                                 [$(nproc)]
#   DSEC_SLURM_MEM          RealMemory (MB) declared per node                      [4000]
#   DSEC_SLURM_SUBNET       first three octets of the private /24                  [10.98.0]
#   DSEC_SLURM_NET_PREFIX   prefix of bridge/veth/netns names (<= 6 chars)         [dsl]
#   DSEC_SLURM_CTLD_PORT    slurmctld port                                         [16917]
#   DSEC_SLURM_SLURMD_PORT  slurmd port (one per namespace, so the same on all)    [16918]
#   DSEC_SLURM_MPI_DEFAULT  MpiDefault                                             [pmix]
#   DSEC_SLURM_CRED_EXPIRE  cred_expire seconds (also the requeue delay)           [30]
#   DSEC_SLURM_FIRST_JOB_ID FirstJobId: give a second cluster on the same machine   [1]
#                           its own job ids (nodes are n1..nN in every cluster, so Slurm's cgroups
#                           slurm_nI/uid_U/job_J and the plugin's sandbox names would collide)
#   DSEC_SLURM_SPANK_SO     spank_dsec.so to load (required); empty = no plugin    []
#   DSEC_SLURM_SPANK_ARGS   its plugstack.conf arguments, e.g. "root=/var/lib/dsec"  []
#   DSEC_SLURM_EXTRA_CONF   file appended to slurm.conf                            []
#   DSEC_SLURM_TIMEOUT      seconds to wait for daemons and nodes                  [60]
#   DSEC_SLURM_SKIP_INSTALL 1 = never run apt-get                                  [0]
#   DSEC_SLURM_SMOKE        1 = finish with `srun -N<all> hostname`                [1]
# Partitions come from slurm-configs/partitions.conf (rollout: default, not preemptible; trainer:
# preemptible, requeued).
#
# Afterwards: source "$DSEC_SLURM_BASE/env.sh" (SLURM_CONF, Open MPI settings).
set -euo pipefail
# With pipefail, `cmd | grep -q` can fail when grep exits first (cmd gets SIGPIPE): use `grep -c ... >/dev/null`.

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
BASE=${DSEC_SLURM_BASE:-/tmp/dsec-slurm}
NODES=${DSEC_SLURM_NODES:-3}
CPUS=${DSEC_SLURM_CPUS:-$(nproc)}
MEM=${DSEC_SLURM_MEM:-4000}
SUBNET=${DSEC_SLURM_SUBNET:-10.98.0}
NETPFX=${DSEC_SLURM_NET_PREFIX:-dsl}
CTLD_PORT=${DSEC_SLURM_CTLD_PORT:-16917}
SLURMD_PORT=${DSEC_SLURM_SLURMD_PORT:-16918}
MPI_DEFAULT=${DSEC_SLURM_MPI_DEFAULT:-pmix}
CRED_EXPIRE=${DSEC_SLURM_CRED_EXPIRE:-30}
FIRST_JOB_ID=${DSEC_SLURM_FIRST_JOB_ID:-1}
SPANK_SO=${DSEC_SLURM_SPANK_SO:-}
SPANK_ARGS=${DSEC_SLURM_SPANK_ARGS:-}
EXTRA_CONF=${DSEC_SLURM_EXTRA_CONF:-}
TIMEOUT=${DSEC_SLURM_TIMEOUT:-60}
SKIP_INSTALL=${DSEC_SLURM_SKIP_INSTALL:-0}
SMOKE=${DSEC_SLURM_SMOKE:-1}
PACKAGES=(slurmctld slurmd slurm-client munge libslurm-dev openmpi-bin libopenmpi-dev libpmix-dev hwloc
          libhwloc-dev iproute2 util-linux)

T0=$(date +%s%N)
log() { local ms=$(( ($(date +%s%N) - T0) / 1000000 )); printf '[start-cluster %d.%03ds] %s\n' $((ms / 1000)) $((ms % 1000)) "$*"; }
die() { printf '[start-cluster] ERROR: %s\n' "$*" >&2; exit 1; }
skip() { printf '[start-cluster] SKIP: %s\n' "$*" >&2; exit 77; }

[ "$(id -u)" = 0 ] || skip "must run as root (it starts slurmd, munged and network namespaces)"
[[ "$NODES" =~ ^[0-9]+$ ]] && [ "$NODES" -ge 1 ] && [ "$NODES" -le 200 ] || die "DSEC_SLURM_NODES must be 1..200"
[ ${#NETPFX} -le 6 ] || die "DSEC_SLURM_NET_PREFIX must be at most 6 characters"
[[ "$SUBNET" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "DSEC_SLURM_SUBNET must look like 10.98.0"
[[ "$FIRST_JOB_ID" =~ ^[1-9][0-9]{0,7}$ ]] || die "DSEC_SLURM_FIRST_JOB_ID must be a number from 1 to 99999999"
case "$BASE" in /*) ;; *) die "DSEC_SLURM_BASE must be an absolute path" ;; esac
if [ -n "$SPANK_SO" ] && [ ! -r "$SPANK_SO" ]; then die "DSEC_SLURM_SPANK_SO=$SPANK_SO does not exist"; fi

# ---- 1. packages ------------------------------------------------------------------------------------------
missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -c 'install ok installed' >/dev/null || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    [ "$SKIP_INSTALL" = 1 ] && skip "missing packages ${missing[*]} (DSEC_SLURM_SKIP_INSTALL=1)"
    command -v apt-get >/dev/null || skip "missing packages ${missing[*]} and no apt-get"
    log "installing ${missing[*]}"
    # The packages' maintainer scripts would start munge/slurm with Debian's default config: forbid it.
    policy_added=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && policy_added=1
    fi
    cleanup_policy() { if [ "$policy_added" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi; }
    trap cleanup_policy EXIT
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            "${missing[@]}"; } >"/tmp/dsec-slurm-apt.$$.log" 2>&1; then
        tail -5 "/tmp/dsec-slurm-apt.$$.log" >&2
        skip "cannot install ${missing[*]} (log: /tmp/dsec-slurm-apt.$$.log)"
    fi
    rm -f "/tmp/dsec-slurm-apt.$$.log"
    cleanup_policy
    trap - EXIT
fi
log "packages present ($(slurmd -V))"

# ---- 2. can we make the network? -----------------------------------------------------------------------------
probe_net() {
    local br="${NETPFX}probe" ns="${NETPFX}-probe$$"
    ip link add "$br" type bridge 2>/dev/null || return 1
    ip link del "$br"
    ip netns add "$ns" 2>/dev/null || return 1
    ip netns del "$ns"
    unshare --uts true 2>/dev/null
}
if ! ip link show "${NETPFX}br0" >/dev/null 2>&1 && ! probe_net; then
    skip "cannot create bridges, network or UTS namespaces here"
fi

# ---- 3. configuration ----------------------------------------------------------------------------------------
# Process tracking: cgroup where Slurm can use it (v1 freezer here, v2 on modern hosts), else the process tree.
if [ -e /sys/fs/cgroup/cgroup.controllers ]; then
    CGROUP_PLUGIN=cgroup/v2; PROCTRACK=proctrack/cgroup; TASK=task/cgroup,task/affinity
elif [ -e /sys/fs/cgroup/freezer/cgroup.procs ] && [ -e /sys/fs/cgroup/cpuset/cgroup.procs ]; then
    CGROUP_PLUGIN=cgroup/v1; PROCTRACK=proctrack/cgroup; TASK=task/cgroup,task/affinity
else
    CGROUP_PLUGIN=; PROCTRACK=proctrack/linuxproc; TASK=task/affinity
fi
mkdir -p "$BASE"/{etc,state,log,run,spool,tmp}
for i in $(seq 1 "$NODES"); do mkdir -p "$BASE/spool/n$i" "$BASE/tmp/n$i"; done
chmod 755 "$BASE" "$BASE/tmp"; chmod 1777 "$BASE"/tmp/n*

new=$(mktemp -d)
trap 'rm -rf "$new"' EXIT
{
    echo "# generated by dsec tests/slurm/cluster/start-cluster.sh - overwritten on every start"
    cat <<EOF
ClusterName=dsec-test
SlurmctldHost=$(hostname -s)($SUBNET.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=$CRED_EXPIRE
FirstJobId=$FIRST_JOB_ID
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
StateSaveLocation=$BASE/state
SlurmdSpoolDir=$BASE/spool/%n
# One TmpFS per node: mpi/pmix puts per-step directories there, which collide when nodes share /tmp.
TmpFS=$BASE/tmp/%n
SlurmctldPidFile=$BASE/run/slurmctld.pid
SlurmdPidFile=$BASE/run/slurmd-%n.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=verbose
ProctrackType=$PROCTRACK
TaskPlugin=$TASK
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=$MPI_DEFAULT
PlugStackConfig=$BASE/etc/plugstack.conf
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=2,sched_interval=5
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=300
KillWait=5
Waittime=0
EOF
    for i in $(seq 1 "$NODES"); do
        echo "NodeName=n$i NodeHostname=n$i NodeAddr=$SUBNET.$((10 + i)) CPUs=$CPUS CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$MEM State=UNKNOWN"
    done
    echo "# --- slurm-configs/partitions.conf"
    sed "s/@NODES@/n[1-$NODES]/g" "$REPO/slurm-configs/partitions.conf" | grep -v '^#'
    if [ -n "$EXTRA_CONF" ]; then echo "# --- $EXTRA_CONF"; cat "$EXTRA_CONF"; fi
} >"$new/slurm.conf"
{
    echo "# generated by start-cluster.sh"
    if [ -n "$CGROUP_PLUGIN" ]; then
        echo "CgroupPlugin=$CGROUP_PLUGIN"
        echo "CgroupAutomount=no"
        echo "ConstrainCores=yes"
    fi
    # Memory is left to the sandboxes (and not enforced by Slurm here): one machine holds every node.
    echo "ConstrainRAMSpace=no"
    echo "ConstrainSwapSpace=no"
    echo "ConstrainDevices=no"
} >"$new/cgroup.conf"
{
    echo "# generated by start-cluster.sh"
    if [ -n "$SPANK_SO" ]; then echo "required $SPANK_SO $SPANK_ARGS"; fi
} >"$new/plugstack.conf"

# Daemons carry DSEC_SLURM_CLUSTER=$BASE in their environment (slurmstepd inherits it): stop-cluster.sh
# finds this cluster's processes by it, never by name.
MARK="DSEC_SLURM_CLUSTER=$BASE"
ours() { { tr '\0' '\n' <"/proc/$1/environ"; } 2>/dev/null | grep -cx "$MARK" >/dev/null; }
alive() {  # pidfile comm
    local pid
    pid=$(cat "$1" 2>/dev/null) || return 1
    [[ "$pid" =~ ^[0-9]+$ ]] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] && ours "$pid"
}
any_alive() {
    alive "$BASE/run/slurmctld.pid" slurmctld && return 0
    local f; for f in "$BASE"/run/slurmd-*.pid; do alive "$f" slurmd && return 0; done
    return 1
}
changed=0
for f in slurm.conf cgroup.conf plugstack.conf; do cmp -s "$new/$f" "$BASE/etc/$f" || changed=1; done
if [ "$changed" = 1 ] && any_alive; then
    log "configuration changed: restarting the daemons"
    DSEC_SLURM_BASE="$BASE" DSEC_SLURM_NET_PREFIX="$NETPFX" DSEC_SLURM_KEEP_NET=1 DSEC_SLURM_KEEP_MUNGE=1 \
        "$HERE/stop-cluster.sh" || die "stop-cluster.sh failed"
fi
for f in slurm.conf cgroup.conf plugstack.conf; do cmp -s "$new/$f" "$BASE/etc/$f" || cp "$new/$f" "$BASE/etc/$f"; done
cat >"$BASE/env.sh" <<EOF
# source me: Slurm clients and Open MPI on the dsec test cluster
export SLURM_CONF=$BASE/etc/slurm.conf
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_tcp_if_include=$SUBNET.0/24 OMPI_MCA_oob_tcp_if_include=$SUBNET.0/24
EOF
chmod 644 "$BASE/env.sh" "$BASE"/etc/*.conf
export SLURM_CONF="$BASE/etc/slurm.conf"
log "configs in $BASE/etc ($PROCTRACK, ${CGROUP_PLUGIN:-no cgroup plugin}, spank: ${SPANK_SO:-none})"

# ---- 4. network -------------------------------------------------------------------------------------------------
BR="${NETPFX}br0"
ip link show "$BR" >/dev/null 2>&1 || ip link add "$BR" type bridge || die "cannot create bridge $BR"
ip addr show dev "$BR" | grep -c "inet $SUBNET.1/24" >/dev/null || ip addr add "$SUBNET.1/24" dev "$BR" \
    || die "cannot give $BR $SUBNET.1/24 (subnet in use? set DSEC_SLURM_SUBNET)"
ip link set "$BR" up
for i in $(seq 1 "$NODES"); do
    ns="${NETPFX}-n$i" veth="${NETPFX}v$i"
    ip netns list | grep -c "^$ns\b" >/dev/null || ip netns add "$ns" || die "cannot create netns $ns"
    ip link show "$veth" >/dev/null 2>&1 || ip link add "$veth" type veth peer name eth0 netns "$ns" \
        || die "cannot create veth $veth"
    ip link set "$veth" master "$BR" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr show dev eth0 | grep -c "inet $SUBNET.$((10 + i))/24" >/dev/null \
        || ip -n "$ns" addr add "$SUBNET.$((10 + i))/24" dev eth0
    ip -n "$ns" link set eth0 up
done
log "network: $BR $SUBNET.1/24, namespaces ${NETPFX}-n1..${NETPFX}-n$NODES"

# ---- 5. munge ------------------------------------------------------------------------------------------------------
munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }
if munge_ok; then
    log "munged already running"
else
    if [ ! -s /etc/munge/munge.key ]; then
        if command -v mungekey >/dev/null; then mungekey -c -f -k /etc/munge/munge.key
        else dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none; fi
    fi
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
    install -d -o munge -g munge -m 755 /run/munge
    for d in /var/lib/munge /var/log/munge; do [ -d "$d" ] || install -d -o munge -g munge -m 700 "$d"; done
    rm -f /run/munge/munge.socket.2.lock
    env "$MARK" runuser -u munge -- /usr/sbin/munged || die "munged failed to start (see /var/log/munge/munged.log)"
    for _ in $(seq 1 $((TIMEOUT * 10))); do munge_ok && break; sleep 0.1; done
    munge_ok || die "munged does not answer (see /var/log/munge/munged.log)"
    cp /run/munge/munged.pid "$BASE/run/munged.pid"  # we started it, so stop-cluster.sh may stop it
    log "munged started"
fi

# ---- 6. slurmctld ------------------------------------------------------------------------------------------------
wait_until() {  # seconds command...
    local end=$(( $(date +%s) + $1 )); shift
    until "$@"; do [ "$(date +%s)" -lt "$end" ] || return 1; sleep 0.2; done
}
if alive "$BASE/run/slurmctld.pid" slurmctld; then
    log "slurmctld already running"
else
    rm -rf "${BASE:?}/state/"*  # fresh job ids and no jobs of an earlier run
    env "$MARK" slurmctld || die "slurmctld failed to start; see $BASE/log/slurmctld.log"
fi
ctld_up() { scontrol ping 2>/dev/null | grep -c 'is UP' >/dev/null; }
if ! wait_until "$TIMEOUT" ctld_up; then
    tail -n 20 "$BASE/log/slurmctld.log" >&2 || true
    die "slurmctld does not answer after ${TIMEOUT}s (port $CTLD_PORT in use?); log above"
fi
log "slurmctld up"

# ---- 7. slurmd per node --------------------------------------------------------------------------------------------
started=0
for i in $(seq 1 "$NODES"); do
    n="n$i"
    alive "$BASE/run/slurmd-$n.pid" slurmd && continue
    # stale step sockets of a killed run make new steps with the same ids fail (EADDRINUSE)
    rm -rf "${BASE:?}/spool/$n/"* "${BASE:?}/tmp/$n/"*
    # nsenter, not `ip netns exec`: the latter remounts /sys, which hides the cgroup v1 hierarchies.
    env "$MARK" nsenter --net="/run/netns/${NETPFX}-$n" unshare --uts \
        sh -c 'hostname "$1" && exec slurmd -N "$1"' sh "$n" \
        || { tail -n 5 "$BASE/log/slurmd-$n.log" >&2; die "slurmd of $n failed to start (log above)"; }
    started=$((started + 1))
done
log "slurmd: $started started, $((NODES - started)) already running"

# ---- 8. wait until every node answers ------------------------------------------------------------------------------
ready() {
    [ "$(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u | grep -cE ' (idle|mix|alloc|comp)$' || true)" -eq "$NODES" ]
}
if ! wait_until "$TIMEOUT" ready; then
    # nodes left DOWN or DRAINED by an earlier run
    scontrol update nodename="n[1-$NODES]" state=resume >/dev/null 2>&1 || true
    if ! wait_until 10 ready; then
        sinfo -N -l >&2 || true
        for f in "$BASE"/log/slurmd-n*.log; do echo "== $f" >&2; tail -n 5 "$f" >&2; done
        die "not every node is up after ${TIMEOUT}s; logs in $BASE/log"
    fi
fi
if [ "$SMOKE" = 1 ] && [ "$(sinfo -h -N -t idle -o %N | sort -u | wc -l)" -eq "$NODES" ]; then
    if ! out=$(cd /tmp && timeout "$TIMEOUT" srun -N"$NODES" -n"$NODES" --mpi=none -t 1 hostname 2>"$BASE/log/smoke.err"); then
        echo "$out" >&2; cat "$BASE/log/smoke.err" >&2
        die "smoke test 'srun -N$NODES hostname' failed (logs in $BASE/log)"
    fi
    log "smoke test: $(echo "$out" | sort | tr '\n' ' ')"
fi
log "cluster ready: $NODES nodes"
echo "Use it with:  source $BASE/env.sh"
