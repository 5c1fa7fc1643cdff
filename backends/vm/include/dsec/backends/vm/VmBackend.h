// The machine backends: `microvm` (QEMU's microvm machine, virtio-mmio) and `vm` (q35, PCI). One QEMU per
// sandbox, in its own cgroup, running as a uid of its own, booting dsec's guest kernel with dsec-guest-agent as
// PID 1 (docs/vm-backends.md). The guest stacks the image's EROFS layers (attached read-only) under a tmpfs upper.
// Guest RAM is a file (a memory backend shared with QEMU) so that snapshots copy it and restores map it
// copy-on-write: forks of one snapshot share the pages none of them wrote.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "dsec/backends/BackendKind.h"
#include "dsec/backends/Sandbox.h"
#include "dsec/common/Result.h"

namespace dsec::backends::vm {

struct VmBackendOptions {
  BackendKind kind = BackendKind::kMicrovm;  // kMicrovm | kVm
  // The node's cgroup parent (sandboxes' cgroups live under it, named by sandbox id, as containers' do).
  std::string cgroup_parent = "dsec";
  // What every backend of the host shares: the initramfs files and image kernels (named by their content) and,
  // by default, the run roots. It must be root's own (0700, not a symlink): a directory another user made first
  // is refused, since whatever it holds would boot in every VM.
  std::string shared_dir = "/dev/shm/dsec-vm";
  // Where each VM's files live (sockets, its RAM file, logs): <run_root>/<id>, a tmpfs so that guest RAM is
  // shared memory. "" : <shared_dir>/<cgroup_parent>/<kind>.
  std::string run_root;
  std::string kernel_dir;  // "" : findGuestKernelDir()
  std::string agent_path;  // "" : findGuestAgent()
  std::string qemu = "qemu-system-x86_64";
  std::string accel = "auto";                  // "auto" (KVM where it runs this kernel, else TCG) | "kvm" | "tcg"
  int64_t default_memory_bytes = 512ll << 20;  // guest RAM when a create gives none
  // Host memory a QEMU needs besides guest RAM (devices, TCG's translation cache): added to its cgroup's limit.
  int64_t overhead_bytes = 256ll << 20;
  // How long a cold boot may take to reach the agent (TCG on a loaded host is slow).
  double boot_timeout_seconds = 90;
  // Sandbox ids' uid ranges (QEMU runs as the first id of a leased range); "" : the container backend's.
  std::string id_lease_dir;
};

// The backend, or why it cannot run here (no QEMU, no TCG module, no guest kernel...).
Result<std::unique_ptr<Backend>> makeVmBackend(const VmBackendOptions& options);

// How the backend will run guests here: "kvm" or "tcg", and a note when it is not what the caller asked for
// ("TCG: this host's KVM runs only PVM guest kernels").
struct AccelChoice {
  std::string accel;
  std::string note;
};
Result<AccelChoice> chooseAccel(const std::string& wanted, const std::string& qemu);

// The host's TSC rate in kHz (measured once per process over 50 ms against the monotonic clock; 0 if unknown). A
// TCG guest gets it on its command line (tsc_early_khz): its own calibration hangs on a loaded host.
int64_t hostTscKhz();

}  // namespace dsec::backends::vm
