# Shared settings of the Slurm tests (sourced).
BASE=${DSEC_SLURM_BASE:-/tmp/dsec-slurm}
export DSEC_SLURM_BASE="$BASE"
STORE="$BASE/store"                 # the layer store every node shares
CGROUP_PARENT=dsec-slurmtest        # where the plugin puts step sandboxes' cgroups
TEST_USER=dsecuser
export SLURM_CONF="$BASE/etc/slurm.conf"

skip_test() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
