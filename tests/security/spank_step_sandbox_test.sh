#!/usr/bin/env bash
# Attacks on the SPANK plugin's step sandboxes, run on the local Slurm cluster (tests/slurm/slurm_fixture.sh) as
# the unprivileged user dsecuser would run them. Each case FAILS if the attack works.
#   spank_step_sandbox_test.sh CASE       (CASE: a function below, without the t_ prefix)
# Exit 0 pass, 1 fail (what was expected and what came), 77 skipped (no root / no cluster here).
# Environment (set by CMake): DSEC_SPANK_SO, DSEC_PRELOAD_PROBE; the cluster's settings as for tests/slurm.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../slurm/lib.sh"
IMAGE=testbase:1
SUID_IMAGE=testbase:1+testsuid:1   # with /usr/local/bin/dsec-suid-probe, setuid root, dynamically linked
PROBE=/usr/local/bin/dsec-suid-probe
SRUN_TIMEOUT=60
# Capabilities a sandbox task must never hold (bit numbers): DAC_READ_SEARCH, NET_ADMIN, SYS_MODULE, SYS_RAWIO,
# SYS_PTRACE, SYS_ADMIN, SYS_BOOT, MKNOD, PERFMON, BPF.
DANGEROUS_CAPS="2 12 16 17 19 21 22 27 38 39"

[ "$(id -u)" = 0 ] || skip_test "the Slurm tests need root"
if [ -e "$BASE/skipped" ]; then skip_test "the local Slurm cluster cannot run here: $(cat "$BASE/skipped")"; fi
scontrol ping 2>/dev/null | grep -c 'is UP' >/dev/null || fail "the local Slurm cluster is not running (slurm_cluster_start)"
USER_UID=$(id -u "$TEST_USER") || fail "no user $TEST_USER (slurm_cluster_start creates it)"
cd /tmp || fail "cd /tmp"   # a working directory every user can enter

OUT=$(mktemp) ERR=$(mktemp) WORK=$(mktemp -d /tmp/dsec-spank-sec.XXXXXX)
trap 'rm -rf "$OUT" "$ERR" "$WORK"' EXIT
chmod 755 "$WORK"
run() {  # run CMD...: stdout in $OUT, stderr in $ERR, exit code in $RC
    RC=0
    timeout "$SRUN_TIMEOUT" "$@" >"$OUT" 2>"$ERR" || RC=$?
}
AS_USER=(runuser -u "$TEST_USER" -- env SLURM_CONF="$SLURM_CONF")  # prefix: run a command as the test user
show() { echo "--- exit code $RC"; echo "--- stdout"; cat "$OUT"; echo "--- stderr"; cat "$ERR"; }
expect_ok() { [ "$RC" = 0 ] || { show; fail "$1: exit code $RC"; }; }
expect_out() { grep -Ec -- "$1" "$OUT" >/dev/null || { show; fail "$2: no line matches /$1/"; }; }
expect_no_out() { if grep -Ec -- "$1" "$OUT" >/dev/null; then show; fail "$2: a line matches /$1/"; fi; }
expect_refused() {  # description regex...: the step failed and stderr matches every regex
    local what=$1 re; shift
    [ "$RC" != 0 ] || { show; fail "$what: the step ran"; }
    for re in "$@"; do grep -Ec -- "$re" "$ERR" >/dev/null || { show; fail "$what: stderr does not match /$re/"; }; done
}
user_dir() {  # a fresh directory owned by the test user
    local d; d=$(mktemp -d -p "$WORK") && chown "$TEST_USER" "$d" && chmod 755 "$d" && echo "$d"
}
nodes_idle() {
    local i
    for i in $(seq 1 50); do
        if [ -z "$(sinfo -h -N -o '%N %t' | grep -vE ' (idle|mix|alloc|comp)$')" ]; then return 0; fi
        sleep 0.2
    done
    sinfo -N -l
    return 1
}
# The Cap* lines of /proc/<pid>/status in $OUT: none of the dangerous capabilities, and not empty-handed
# either for the bounding set (the sandbox keeps Docker's default set minus MKNOD).
expect_reduced_caps() {  # which-line (CapBnd|CapEff|CapPrm) description
    local hex bit; hex=$(sed -n "s/^$1:[[:space:]]*\([0-9a-f]*\)$/\1/p" "$OUT" | head -1)
    [ -n "$hex" ] || { show; fail "$2: no $1 line"; }
    for bit in $DANGEROUS_CAPS; do
        (( (16#$hex >> bit) & 1 )) && { show; fail "$2: $1=$hex holds capability $bit"; }
    done
    return 0
}

# The attack of the issue: bind a file you own over /etc/ld.so.preload, run a setuid-root program, and the
# library you listed runs as root. The task must run with no_new_privs (setuid bits do nothing), the
# sandbox's seccomp filter and a reduced bounding set.
t_setuid_preload() {
    local evil; evil=$(user_dir)
    install -o "$TEST_USER" -m 755 "$DSEC_PRELOAD_PROBE" "$evil/libevil.so"
    echo /evil/libevil.so >"$evil/ld.so.preload" && chown "$TEST_USER" "$evil/ld.so.preload"
    run "${AS_USER[@]}" srun -N1 --dsec-image=$SUID_IMAGE --dsec-mount="$evil:/evil:ro" \
        --dsec-mount="$evil/ld.so.preload:/etc/ld.so.preload:ro" sh -c \
        "echo \"mode=\$(stat -c '%a %u' $PROBE)\"; $PROBE; id -u; grep -E '^(NoNewPrivs|Seccomp|CapBnd|CapEff|CapPrm):' /proc/self/status"
    expect_ok "the setuid program runs"
    expect_out '^mode=4755 0$' "the probe is setuid root in the image (else this case proves nothing)"
    expect_out '^preload euid=' "the library in /etc/ld.so.preload was loaded (else this case proves nothing)"
    expect_no_out 'euid=0$' "ROOT: a setuid program or the preloaded library ran with euid 0"
    expect_out "^probe ruid=$USER_UID euid=$USER_UID$" "the setuid program keeps the user's identity"
    expect_out "^$USER_UID$" "id -u is the user's"
    expect_out '^NoNewPrivs:[[:space:]]+1$' "the task has no_new_privs"
    expect_out '^Seccomp:[[:space:]]+2$' "the task runs under a seccomp filter"
    expect_reduced_caps CapBnd "the task's bounding set"
}

# A root job (root submitted it: Slurm runs its tasks as root) gets the sandbox's capability set, not all of
# them, and the filter: no mounts, no namespaces.
t_root_job() {
    run srun -N1 --dsec-image=$IMAGE sh -c \
        'grep -E "^(NoNewPrivs|Seccomp|CapBnd|CapEff|CapPrm):" /proc/self/status
         mkdir -p /mnt/t; mount -t tmpfs none /mnt/t 2>/dev/null && echo MOUNTED
         unshare -m true 2>/dev/null && echo UNSHARED
         mknod /tmp/disk b 8 0 2>/dev/null && echo MKNOD
         echo done'
    expect_ok "a root job's task"
    expect_out '^done$' "the task ran to its end"
    expect_out '^NoNewPrivs:[[:space:]]+1$' "a root task has no_new_privs"
    expect_out '^Seccomp:[[:space:]]+2$' "a root task runs under the seccomp filter"
    expect_reduced_caps CapBnd "a root task's bounding set"
    expect_reduced_caps CapEff "a root task's effective set"
    expect_reduced_caps CapPrm "a root task's permitted set"
    expect_out '^CapEff:[[:space:]]*0*[1-9a-f]' "a root task keeps the sandbox's capabilities"
    expect_no_out '^MOUNTED$' "a root task mounted a file system"
    expect_no_out '^UNSHARED$' "a root task made a new namespace"
    expect_no_out '^MKNOD$' "a root task made a block device node"
}

# Another user's directories: a root-owned 0700 directory, and a readable directory below one. The user cannot
# open either; binding them must fail the step with a clear message and show nothing of them.
t_foreign_dir() {
    mkdir -p "$WORK/secret" "$WORK/private/pub"
    echo topsecret >"$WORK/secret/file"
    echo topsecret >"$WORK/private/pub/file"
    chmod 644 "$WORK/secret/file" "$WORK/private/pub/file"
    chmod 700 "$WORK/secret" "$WORK/private"
    chmod 755 "$WORK/private/pub"
    local src
    for src in "$WORK/secret" "$WORK/private/pub" "$WORK/private/pub/file"; do
        run "${AS_USER[@]}" srun -N1 --dsec-image=$IMAGE --dsec-mount="$src:/x:ro" sh -c 'cat /x/file /x 2>&1; echo ran'
        expect_refused "binding $src as $TEST_USER" "permission denied for uid $USER_UID" "$src"
        expect_no_out 'topsecret' "the content of $src leaked"
        expect_no_out '^ran$' "a task ran with $src bound"
    done
    # What the user's groups may read binds (the supplementary group comes with the job), what only other
    # groups may read does not: the refusals above are about permissions, not binds as such.
    mkdir "$WORK/club" "$WORK/staff"
    echo members-only >"$WORK/club/file"
    chmod 644 "$WORK/club/file"
    chgrp "$TEST_GROUP" "$WORK/club" && chgrp root "$WORK/staff" && chmod 750 "$WORK/club" "$WORK/staff"
    run "${AS_USER[@]}" srun -N1 --dsec-image=$IMAGE --dsec-mount="$WORK/club:/club:ro" cat /club/file
    expect_ok "binding a directory of $TEST_USER's supplementary group $TEST_GROUP"
    expect_out '^members-only$' "the group's directory shows its file"
    run "${AS_USER[@]}" srun -N1 --dsec-image=$IMAGE --dsec-mount="$WORK/staff:/x:ro" true
    expect_refused "binding a directory of a group $TEST_USER is not in" "permission denied for uid $USER_UID"
    nodes_idle || fail "a node is drained after a refused mount"
}

# Symlinks the user plants (resolved as the user, so they reach no further than the user could) and /proc
# magic links (/proc/<pid>/root is another process's root; refused for every user, root included).
t_symlinks_and_proc() {
    mkdir -p "$WORK/secret" "$WORK/private/pub"
    echo topsecret >"$WORK/secret/file"
    chmod 700 "$WORK/secret" "$WORK/private"
    chmod 755 "$WORK/private/pub"
    local links; links=$(user_dir)
    runuser -u "$TEST_USER" -- ln -s "$WORK/secret" "$links/to-secret"
    runuser -u "$TEST_USER" -- ln -s "$WORK/private/pub" "$links/to-pub"
    runuser -u "$TEST_USER" -- ln -s /proc/self/root/tmp "$links/to-proc-root"
    local src
    for src in "$links/to-secret" "$links/to-pub"; do
        run "${AS_USER[@]}" srun -N1 --dsec-image=$IMAGE --dsec-mount="$src:/x" sh -c 'cat /x/file 2>&1; echo ran'
        expect_refused "binding the symlink $src as $TEST_USER" "permission denied for uid $USER_UID"
        expect_no_out 'topsecret' "the content behind $src leaked"
        expect_no_out '^ran$' "a task ran with $src bound"
    done
    for src in /proc/self/root/tmp "$links/to-proc-root"; do
        run "${AS_USER[@]}" srun -N1 --dsec-image=$IMAGE --dsec-mount="$src:/x" sh -c 'echo ran'
        expect_refused "binding $src as $TEST_USER" "magic link" "refused"
        expect_no_out '^ran$' "a task ran with $src bound"
    done
    run "${AS_USER[@]}" srun -N1 --dsec-image=$IMAGE --dsec-mount=/proc/1:/x sh -c 'echo ran'
    expect_refused "binding /proc/1 as $TEST_USER" "/proc/1 is in /proc: refused"
    # Another process's root, as root (this script's shell: a root process on the node).
    run srun -N1 --dsec-image=$IMAGE --dsec-mount="/proc/$$/root/tmp:/x" sh -c 'ls /x; echo ran'
    expect_refused "binding /proc/$$/root/tmp as root" "magic link" "refused"
    expect_no_out '^ran$' "a root task ran with the node's root bound through /proc/$$/root"
    nodes_idle || fail "a node is drained after a refused mount"
}

# Every step mount is nosuid and nodev: the --dsec-mount binds and the batch script's directory, checked in
# /proc/self/mountinfo and by attack (a device node and a setuid-root program in a bound directory).
t_mount_flags() {
    local ro rw; ro=$(user_dir) rw=$(user_dir)
    echo from-host >"$ro/in.txt"
    mkdir "$WORK/devs" "$WORK/suid"
    mknod -m 666 "$WORK/devs/null" c 1 3
    install -o root -g root -m 4755 "$DSEC_SUID_PROBE" "$WORK/suid/probe"
    chmod 755 "$WORK/devs" "$WORK/suid"
    run "${AS_USER[@]}" srun -N1 --dsec-image=$SUID_IMAGE --dsec-mount="$ro:/data/in:ro" --dsec-mount="$rw:/data/out" \
        --dsec-mount="$WORK/devs:/devs" --dsec-mount="$WORK/suid:/suid:ro" sh -c \
        'cat /data/in/in.txt; echo written >/data/out/result
         echo x >/devs/null 2>/dev/null && echo DEVICE-OPENED
         /suid/probe
         cat /proc/self/mountinfo'
    expect_ok "srun with binds as $TEST_USER"
    expect_out '^from-host$' "the read-only bind shows the user's file"
    [ "$(cat "$rw/result" 2>/dev/null)" = written ] || { show; fail "a write to the rw bind did not reach the host"; }
    expect_no_out '^DEVICE-OPENED$' "a device node in a bound directory could be opened (bind without nodev)"
    expect_out "^probe ruid=$USER_UID euid=$USER_UID$" "a setuid-root program in a bound directory keeps the user's identity"
    local target opts
    for target in /data/in /data/out /devs /suid; do
        opts=$(awk -v t="$target" '$5 == t {print $6}' "$OUT" | tail -1)
        [ -n "$opts" ] || { show; fail "no mount at $target in mountinfo"; }
        [[ ",$opts," == *,nosuid,* && ",$opts," == *,nodev,* ]] || { show; fail "bind $target has options $opts, want nosuid,nodev"; }
    done
    [[ ",$(awk '$5 == "/data/in" {print $6}' "$OUT" | tail -1)," == *,ro,* ]] || { show; fail "the :ro bind is not read-only"; }
    # Every other mount, the root overlay included: nosuid; and nodev where no device node must work (/dev,
    # /dev/pts, the device nodes bound into /dev and the /proc files masked with /dev/null need them).
    local bad
    bad=$(awk '$5 ~ /^\// && (","$6",") !~ /,nosuid,/ {print $5 " " $6}' "$OUT")
    [ -z "$bad" ] || { show; fail "mounts without nosuid: $bad"; }
    bad=$(awk '$5 ~ /^\// && $5 != "/dev" && $5 != "/dev/pts" && $4 != "/null" &&
               $5 !~ /^\/dev\/(null|zero|full|random|urandom|tty)$/ && (","$6",") !~ /,nodev,/ {print $5 " " $6}' "$OUT")
    [ -z "$bad" ] || { show; fail "mounts without nodev: $bad"; }

    # The batch script's directory (slurmd's spool, bound by the plugin itself): read-only, nosuid, nodev.
    local log; log=$(mktemp -p "$WORK" sbatch.XXXXXX)
    chown "$TEST_USER" "$log"
    run "${AS_USER[@]}" sbatch --wait -N1 -o "$log" --dsec-image=$IMAGE --wrap 'cat /proc/self/mountinfo'
    cat "$log" >>"$OUT"
    expect_ok "sbatch as $TEST_USER"
    opts=$(awk -v s="$BASE/spool/" 'index($5, s) == 1 {print $6}' "$OUT" | tail -1)
    [ -n "$opts" ] || { show; fail "no mount of the batch script's directory under $BASE/spool in mountinfo"; }
    [[ ",$opts," == *,ro,* && ",$opts," == *,nosuid,* && ",$opts," == *,nodev,* ]] || { show; fail "the batch script's directory has options $opts, want ro,nosuid,nodev"; }
}

# Targets and the job's working directory: root creates missing directories and files only on the sandbox's
# own root, never inside another bind, where they would land in a host directory the user may not write.
t_target_in_foreign_mount() {
    mkdir "$WORK/rootdir"
    chmod 755 "$WORK/rootdir"
    local mine; mine=$(user_dir)
    echo mine >"$mine/f" && chown "$TEST_USER" "$mine/f"
    run "${AS_USER[@]}" srun -N1 --dsec-image=$IMAGE --dsec-mount="$WORK/rootdir:/a:ro" --dsec-mount="$mine:/a/newdir" true
    expect_refused "a target directory inside a bind of a root-owned directory" "/a/newdir" "inside another mount"
    [ ! -e "$WORK/rootdir/newdir" ] || fail "ROOT WROTE: $WORK/rootdir/newdir was created on the host"
    run "${AS_USER[@]}" srun -N1 --dsec-image=$IMAGE --dsec-mount="$WORK/rootdir:/a" --dsec-mount="$mine/f:/a/newfile" true
    expect_refused "a target file inside a bind of a root-owned directory" "/a/newfile" "inside another mount"
    [ ! -e "$WORK/rootdir/newfile" ] || fail "ROOT WROTE: $WORK/rootdir/newfile was created on the host"
    # The job's working directory (a host path the user picks) is made in the sandbox for slurmstepd to chdir
    # to, but not inside a bind: here the bind of the root-owned directory sits on the way to it.
    runuser -u "$TEST_USER" -- mkdir -p "$mine/cwd"
    run "${AS_USER[@]}" srun -N1 --chdir="$mine/cwd" --dsec-image=$IMAGE --dsec-mount="$WORK/rootdir:$WORK" true
    [ ! -e "$WORK/rootdir/$(basename "$mine")" ] || { show; fail "ROOT WROTE: the job's working directory was made in $WORK/rootdir"; }
    run "${AS_USER[@]}" srun -N1 --chdir="$mine/cwd" --dsec-image=$IMAGE ls -d "$mine/cwd"
    expect_ok "a working directory on the sandbox's root"
    expect_out "^$mine/cwd\$" "the working directory is made on the sandbox's root"
    # Nested binds onto targets that exist still work.
    local outer; outer=$(user_dir)
    runuser -u "$TEST_USER" -- mkdir "$outer/sub"
    run "${AS_USER[@]}" srun -N1 --dsec-image=$IMAGE --dsec-mount="$outer:/a" --dsec-mount="$mine:/a/sub:ro" cat /a/sub/f
    expect_ok "a bind onto an existing directory inside another bind"
    expect_out '^mine$' "the nested bind shows the user's file"
    nodes_idle || fail "a node is drained after a refused mount"
}

case="${1:-}"
declare -F "t_$case" >/dev/null || { echo "usage: $0 CASE (cases: $(declare -F | sed -n 's/^declare -f t_//p' | tr '\n' ' '))" >&2; exit 2; }
"t_$case"
echo "PASS: $case"
