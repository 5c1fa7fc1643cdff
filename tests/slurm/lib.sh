# Shared settings of the Slurm tests (sourced).
BASE=${DSEC_SLURM_BASE:-/tmp/dsec-slurm}
export DSEC_SLURM_BASE="$BASE"
STORE="$BASE/store"                 # the layer store every node shares
# Where the plugin puts step sandboxes' cgroups: one per cluster when two run side by side (the fixture's
# stop kills whatever is left under it).
CGROUP_PARENT=${DSEC_SLURM_CGROUP_PARENT:-dsec-slurmtest}
NET_PREFIX=${DSEC_SLURM_NET_PREFIX:-dsl}  # node n<I> lives in network namespace $NET_PREFIX-n<I> (start-cluster.sh)
TEST_USER=dsecuser
TEST_GROUP=dsecgroup                # a supplementary group of TEST_USER
export SLURM_CONF="$BASE/etc/slurm.conf"

skip_test() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
