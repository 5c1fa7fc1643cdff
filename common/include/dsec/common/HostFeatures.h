// What this host's kernel and tools support, probed by trying each feature (not by reading version numbers):
// `dsec doctor` prints it, and tests use it to skip with a reason where a kernel feature is missing.
#pragma once

#include <string>
#include <vector>

namespace dsec {

enum class FeatureState {
  kOk,       // tried and works
  kMissing,  // tried and does not work (detail says why)
  kUnknown,  // could not be tried (not root, a tool missing): detail says what was in the way
};
const char* featureStateName(FeatureState state);  // "ok", "MISSING", "unknown"

struct HostFeature {
  std::string name;
  FeatureState state = FeatureState::kUnknown;
  std::string detail;     // what the probe found: "unshare(CLONE_NEWNET) works", "open /dev/kvm: ENOENT"
  std::string why;        // what dsec uses it for, i.e. what does not work without it
  bool required = false;  // the container backend cannot run without it
  bool ok() const { return state == FeatureState::kOk; }
};

struct HostFeatures {
  HostFeature user_ns, mount_ns, pid_ns, net_ns, uts_ns, ipc_ns, cgroup_ns;
  HostFeature cgroups;
  int cgroup_version = 0;      // the driver dsec would use: 1, 2, or 0 if none is usable
  bool cgroup_hybrid = false;  // v1 controllers plus a controller-less cgroup2 mount (root/unified)
  HostFeature overlayfs, erofs;
  HostFeature erofs_file_mount;  // mount(image_file, dir, "erofs") without a loop device (Linux 6.12+)
  HostFeature kvm;
  bool kvm_pvm = false;  // the host's KVM is PVM: only PVM-enabled guest kernels run, stock ones need TCG
  HostFeature bpf_lsm;
  HostFeature landlock;
  int landlock_abi = 0;
  HostFeature seccomp, psi, mkfs_erofs, debootstrap;

  // Every feature in display order.
  std::vector<const HostFeature*> all() const;
  // Names of required features that are not ok.
  std::vector<std::string> missingRequired() const;
};

struct HostProbeOptions {
  // Builds a tiny image with mkfs.erofs and mounts it in a private mount namespace (needs root; ~20 ms).
  bool try_erofs_mount = true;
};

HostFeatures probeHostFeatures(const HostProbeOptions& options = {});
// A human table: one line per feature, then what is missing and why it matters, then a verdict line.
std::string formatHostFeatures(const HostFeatures& features);

}  // namespace dsec
