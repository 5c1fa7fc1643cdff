#!/usr/bin/env bash
# Installs what dsec needs to build, run and test on Debian 12 (run as root). Idempotent and quiet when
# everything is already there.
set -euo pipefail

PACKAGES=(
  # build
  g++ cmake ninja-build pkg-config git clang llvm libbpf-dev bpftool
  libboost-dev libboost-program-options-dev nlohmann-json3-dev libseccomp-dev libcap-dev libssl-dev
  libnftables-dev nftables
  libgtest-dev libgmock-dev
  # layers, sandboxes, placement (git, listed above, also makes `dsec layer build --scrub-git` layers)
  erofs-utils debootstrap busybox-static iproute2 util-linux patch libhwloc-dev hwloc
  # on-demand layers from a shared store (a FUSE file per layer under the EROFS mount)
  libfuse3-dev fuse3
  # a local Slurm cluster for the Slurm tests (slurmctld, slurmd, munge, Open MPI with PMIx)
  slurmctld slurmd slurm-client munge libslurm-dev openmpi-bin libopenmpi-dev libpmix-dev
  # SDK and tests
  python3 python3-pytest python3-setuptools python3-pip
  # microvm/vm sandboxes: QEMU (TCG where there is no KVM), and what fetch-guest-kernel.sh uses
  qemu-system-x86 qemu-utils kmod xz-utils zstd binutils
  # benchmarks: the peers, and the load `dsec bench qos` runs inside its sandboxes
  crun bubblewrap stress-ng
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# E2B's JS SDK for the tests of the E2B-compatible listener (tests/launcher/e2b installs the npm package itself):
# Node.js and npm, from Debian unless the host has them already (a Node.js of its own brings its npm).
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "install-deps: installing nodejs npm"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends nodejs npm
fi

# The guest kernel of microvm/vm sandboxes (quiet when it is there; `--update` takes a newer one).
"$(dirname "$0")/../backends/vm/guest/fetch-guest-kernel.sh" "${DSEC_GUEST_KERNEL_DIR:-/usr/local/lib/dsec/guest-kernel}"
