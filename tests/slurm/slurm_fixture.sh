#!/usr/bin/env bash
# ctest fixture of the Slurm tests: `slurm_fixture.sh start` builds the busybox test layer, creates the
# unprivileged test user and starts the local cluster with spank_dsec.so; `slurm_fixture.sh stop` stops it
# and unmounts the layer mounts the plugin leaves in place. Exit 77 = cannot run here (skipped).
# Environment (set by CMake): DSEC_SPANK_SO, DSEC_TEST_LAYER_TOOL, DSEC_SUID_PROBE; optional DSEC_SLURM_BASE,
# DSEC_SLURM_CGROUP_PARENT (lib.sh) and the cluster's settings (cluster/start-cluster.sh).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/lib.sh"

start() {
    [ "$(id -u)" = 0 ] || skip_test "the Slurm tests need root"
    rm -f "$BASE/skipped"
    mkdir -p "$BASE"
    [ -r "${DSEC_SPANK_SO:-}" ] || fail "DSEC_SPANK_SO=${DSEC_SPANK_SO:-} does not exist (build spank_dsec)"
    # The test image: busybox and its applets. Built once per store.
    if [ ! -e "$STORE/layers/testbase/1/layer.erofs" ]; then
        command -v busybox >/dev/null || skip_test "busybox is not installed (apt-get install busybox-static)"
        local rootfs="$BASE/rootfs"
        rm -rf "$rootfs"
        mkdir -p "$rootfs"/{bin,dev,proc,sys,tmp,etc,data,work}
        cp "$(command -v busybox)" "$rootfs/bin/busybox"
        for applet in $("$rootfs/bin/busybox" --list); do
            [ -e "$rootfs/bin/$applet" ] || ln -s busybox "$rootfs/bin/$applet"
        done
        echo "root:x:0:0:root:/:/bin/sh" >"$rootfs/etc/passwd"
        echo "dsec test image" >"$rootfs/etc/dsec-test-image"
        "$DSEC_TEST_LAYER_TOOL" "$STORE" testbase:1 "$rootfs" || fail "cannot build the test layer"
        rm -rf "$rootfs"
    fi
    # The security cases' layer, on top of testbase:1: a dynamically linked setuid-root program with its
    # loader and libraries (tests/security/spank_step_sandbox_test.sh).
    if [ ! -e "$STORE/layers/testsuid/1/layer.erofs" ]; then
        [ -x "${DSEC_SUID_PROBE:-}" ] || fail "DSEC_SUID_PROBE=${DSEC_SUID_PROBE:-} does not exist (build dsec-suid-probe)"
        local rootfs="$BASE/rootfs-suid" lib
        rm -rf "$rootfs"
        mkdir -p "$rootfs/usr/local/bin"
        for lib in $(ldd "$DSEC_SUID_PROBE" | grep -Eo '/[^ ]+'); do
            cp -L --parents "$lib" "$rootfs/" || fail "cannot copy $lib into the setuid test layer"
        done
        install -o root -g root -m 4755 "$DSEC_SUID_PROBE" "$rootfs/usr/local/bin/dsec-suid-probe"
        "$DSEC_TEST_LAYER_TOOL" "$STORE" testsuid:1 "$rootfs" || fail "cannot build the setuid test layer"
        rm -rf "$rootfs"
    fi
    id -u "$TEST_USER" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$TEST_USER" \
        || fail "cannot create user $TEST_USER"
    # A supplementary group of the test user: --dsec-mount sources are opened with the job's groups.
    getent group "$TEST_GROUP" >/dev/null || groupadd --system "$TEST_GROUP" || fail "cannot create group $TEST_GROUP"
    id -nG "$TEST_USER" | tr ' ' '\n' | grep -cx "$TEST_GROUP" >/dev/null || usermod -aG "$TEST_GROUP" "$TEST_USER" \
        || fail "cannot add $TEST_USER to $TEST_GROUP"
    local rc=0
    DSEC_SLURM_SPANK_SO="$DSEC_SPANK_SO" DSEC_SLURM_SPANK_ARGS="root=$STORE cgroup_parent=$CGROUP_PARENT" \
        "$HERE/cluster/start-cluster.sh" || rc=$?
    if [ "$rc" = 77 ]; then
        echo "start-cluster.sh cannot run here" >"$BASE/skipped"
        exit 77
    fi
    [ "$rc" = 0 ] || fail "start-cluster.sh failed ($rc)"
}

stop() {
    [ "$(id -u)" = 0 ] || skip_test "the Slurm tests need root"
    "$HERE/cluster/stop-cluster.sh" || fail "stop-cluster.sh failed"
    # Layer mounts outlive steps by design (spank/src/StepSandbox.h): the test store's go with the cluster.
    if [ -d "$STORE/mnt" ]; then
        for m in $(awk -v p="$STORE/mnt/" 'index($5, p) == 1 {print $5}' /proc/self/mountinfo | sort -r); do
            umount "$m" 2>/dev/null || umount -l "$m"
        done
        while awk -v p="$STORE/mnt" '$5 == p {f=1} END {exit !f}' /proc/self/mountinfo; do umount -l "$STORE/mnt"; done
    fi
    # Sandboxes the plugin could not clean up (it reaps them in the job epilog; this is the tests' safety
    # net): kill what is in their cgroups, then remove the cgroups and their parent.
    local d p
    for d in $(find /sys/fs/cgroup/*/"$CGROUP_PARENT" /sys/fs/cgroup/"$CGROUP_PARENT" -mindepth 1 -maxdepth 1 -type d 2>/dev/null); do
        echo "WARNING: sandbox cgroup left behind: $d"
        for p in $(cat "$d/cgroup.procs" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
    done
    sleep 0.2
    find /sys/fs/cgroup/*/"$CGROUP_PARENT" /sys/fs/cgroup/"$CGROUP_PARENT" -mindepth 1 -depth -type d -exec rmdir {} \; 2>/dev/null || true
    for d in /sys/fs/cgroup/*/"$CGROUP_PARENT" /sys/fs/cgroup/"$CGROUP_PARENT"; do
        [ -d "$d" ] && { rmdir "$d" 2>/dev/null || echo "WARNING: $d is not empty"; }
    done
    return 0
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
