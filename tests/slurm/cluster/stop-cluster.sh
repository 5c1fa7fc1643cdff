#!/usr/bin/env bash
# stop-cluster.sh - stops what start-cluster.sh started (same DSEC_SLURM_BASE), found by pid files and by
# the DSEC_SLURM_CLUSTER=$BASE marker in the processes' environment - never by process name.
#   1. cancels every job and waits for them to end (the SPANK plugin destroys their sandboxes)
#   2. stops slurmd(s), then slurmctld (SIGTERM, SIGKILL after a timeout)
#   3. kills what is left of this cluster's steps (slurmstepd and their children)
#   4. removes this cluster's empty Slurm cgroup directories
#   5. stops munged only if start-cluster.sh started it
#   6. deletes the bridge and the network namespaces
# Idempotent: stopping a stopped cluster does nothing.
# Settings: DSEC_SLURM_BASE [/tmp/dsec-slurm], DSEC_SLURM_NET_PREFIX [dsl], DSEC_SLURM_TIMEOUT [20],
#   DSEC_SLURM_KEEP_NET=1, DSEC_SLURM_KEEP_MUNGE=1, DSEC_SLURM_PURGE=1 (also delete $BASE).
set -uo pipefail

BASE=${DSEC_SLURM_BASE:-/tmp/dsec-slurm}
NETPFX=${DSEC_SLURM_NET_PREFIX:-dsl}
TIMEOUT=${DSEC_SLURM_TIMEOUT:-20}
KEEP_NET=${DSEC_SLURM_KEEP_NET:-0}
KEEP_MUNGE=${DSEC_SLURM_KEEP_MUNGE:-0}
PURGE=${DSEC_SLURM_PURGE:-0}

log() { echo "[stop-cluster] $*"; }
if [ "$(id -u)" != 0 ]; then echo "[stop-cluster] SKIP: must run as root" >&2; exit 77; fi
case "$BASE" in /*) ;; *) echo "[stop-cluster] ERROR: DSEC_SLURM_BASE must be absolute" >&2; exit 1 ;; esac
export SLURM_CONF="$BASE/etc/slurm.conf"
MARK="DSEC_SLURM_CLUSTER=$BASE"

ours() { { tr '\0' '\n' <"/proc/$1/environ"; } 2>/dev/null | grep -cx "$MARK" >/dev/null; }
pid_of() {  # pidfile comm -> pid, if alive, ours and that command
    local pid
    pid=$(cat "$1" 2>/dev/null) || return 1
    [[ "$pid" =~ ^[0-9]+$ ]] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] && ours "$pid" && echo "$pid"
}
gone() {  # seconds pids...
    local end=$(( $(date +%s) + $1 )) p; shift
    while :; do
        local left=0
        for p in "$@"; do kill -0 "$p" 2>/dev/null && left=1; done
        [ "$left" = 0 ] && return 0
        [ "$(date +%s)" -lt "$end" ] || return 1
        sleep 0.1
    done
}
stop_pids() {  # what seconds pids...
    local what=$1 secs=$2; shift 2
    [ $# -gt 0 ] || return 0
    kill -TERM "$@" 2>/dev/null
    gone "$secs" "$@" && return 0
    log "$what still running after ${secs}s: SIGKILL"
    kill -KILL "$@" 2>/dev/null
    gone 5 "$@" || log "WARNING: $what still alive: $*"
}
self_and_ancestors() {
    local p=$$
    while [ -n "$p" ] && [ "$p" -gt 1 ] 2>/dev/null; do echo "$p"; p=$(ps -o ppid= -p "$p" 2>/dev/null | tr -d ' '); done
}
SELF=" $(self_and_ancestors | tr '\n' ' ') "
descendants() { local c; for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do echo "$c"; descendants "$c"; done; }
strays() {  # slurmstepd and whatever they started, but not the daemons and never ourselves
    local p
    for p in $(ls /proc | grep -E '^[0-9]+$'); do
        case "$SELF" in *" $p "*) continue ;; esac
        ours "$p" || continue
        case "$(cat "/proc/$p/comm" 2>/dev/null)" in slurmd | slurmctld | munged) continue ;; esac
        echo "$p"
        descendants "$p"
    done | sort -un | while read -r p; do case "$SELF" in *" $p "*) ;; *) echo "$p" ;; esac; done
}
node_names() { ls -d "$BASE"/spool/n* 2>/dev/null | xargs -rn1 basename; }

if [ ! -d "$BASE" ]; then log "nothing to stop ($BASE does not exist)"; exit 0; fi

# ---- 1. jobs
if pid_of "$BASE/run/slurmctld.pid" slurmctld >/dev/null && timeout 10 scontrol ping 2>/dev/null | grep -c 'is UP' >/dev/null; then
    jobs=$(timeout 10 squeue -h -o %A 2>/dev/null | tr '\n' ' ')
    if [ -n "${jobs// /}" ]; then
        log "cancelling jobs: $jobs"
        # shellcheck disable=SC2086
        timeout 10 scancel $jobs 2>/dev/null
        end=$(( $(date +%s) + TIMEOUT ))
        while [ -n "$(timeout 10 squeue -h -o %A 2>/dev/null)" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 0.2; done
    fi
fi

# ---- 2. daemons
before=$(strays)
daemons=()
for f in "$BASE"/run/slurmd-*.pid; do [ -e "$f" ] && p=$(pid_of "$f" slurmd) && daemons+=("$p"); done
if [ ${#daemons[@]} -gt 0 ]; then log "stopping slurmd: ${daemons[*]}"; stop_pids slurmd "$TIMEOUT" "${daemons[@]}"; fi
if p=$(pid_of "$BASE/run/slurmctld.pid" slurmctld); then log "stopping slurmctld: $p"; stop_pids slurmctld "$TIMEOUT" "$p"; fi
rm -f "$BASE"/run/slurmd-*.pid "$BASE/run/slurmctld.pid"

# ---- 3. leftover steps (slurmstepd ignores SIGTERM)
left=()
for p in $( { echo "$before"; strays; } | grep -E '^[0-9]+$' | sort -un); do kill -0 "$p" 2>/dev/null && left+=("$p"); done
if [ ${#left[@]} -gt 0 ]; then log "killing leftover step processes: ${left[*]}"; stop_pids "step processes" 3 "${left[@]}"; fi

# ---- 4. this cluster's Slurm cgroups (v1: slurm_<node> per controller; v2: under system.slice or /)
for n in $(node_names); do
    for d in /sys/fs/cgroup/*/slurm_"$n" /sys/fs/cgroup/slurm_"$n" /sys/fs/cgroup/system.slice/slurmstepd.scope/slurm_"$n"; do
        [ -d "$d" ] || continue
        find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null
        [ -d "$d" ] && log "WARNING: could not remove $d (processes still inside?)"
    done
done

# ---- 5. munged, if we started it
if [ "$KEEP_MUNGE" != 1 ] && [ -e "$BASE/run/munged.pid" ]; then
    if p=$(pid_of "$BASE/run/munged.pid" munged); then log "stopping munged: $p"; stop_pids munged "$TIMEOUT" "$p"; fi
    rm -f "$BASE/run/munged.pid"
fi

# ---- 6. network
if [ "$KEEP_NET" != 1 ]; then
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${NETPFX}-n[0-9]+$"); do
        pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
        [ -n "$pids" ] && log "WARNING: processes still in netns $ns: $pids"
        ip netns del "$ns"
    done
    ip link show "${NETPFX}br0" >/dev/null 2>&1 && ip link del "${NETPFX}br0"
    # veth ends go away asynchronously once their namespace is gone
    for _ in $(seq 1 50); do ip -o link show 2>/dev/null | grep -cE ": ${NETPFX}v[0-9]+@" >/dev/null || break; sleep 0.1; done
fi

if [ "$PURGE" = 1 ]; then rm -rf "${BASE:?}"; log "removed $BASE"; fi
log "stopped"
