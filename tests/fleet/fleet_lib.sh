# Shared by the fleet tests on tests/slurm's local cluster (fleet_test.sh, jobend_test.sh): the checks that the
# cluster, the binaries and the test layer are there (exit 77 when the host cannot run them), and polling.
# Sourced after HERE (this folder) is set; sets REPO and sources the cluster's env.sh.
REPO=$(cd "$HERE/../.." && pwd)
source "$HERE/../slurm/lib.sh"

[ "$(id -u)" = 0 ] || skip_test "the fleet tests need root"
[ -e "$BASE/skipped" ] && skip_test "$(cat "$BASE/skipped")"
[ -x "${DSEC_LAUNCH:-}" ] || fail "DSEC_LAUNCH=${DSEC_LAUNCH:-} is not executable (build dsec-launch)"
[ -r "$BASE/env.sh" ] || skip_test "no Slurm test cluster at $BASE (run the slurm_cluster_start fixture)"
source "$BASE/env.sh"
timeout 10 scontrol ping 2>/dev/null | grep -c 'is UP' >/dev/null || skip_test "the Slurm test cluster is not running"
[ -e "$STORE/layers/testbase/1/layer.erofs" ] || fail "no test layer in $STORE"

wait_for() {  # seconds what command...: polls the command until it succeeds, failing the test at the deadline
    local end=$(( $(date +%s) + $1 )) what=$2; shift 2
    until "$@" >/dev/null 2>&1; do [ "$(date +%s)" -lt "$end" ] || fail "timed out waiting for $what"; sleep 0.3; done
}
