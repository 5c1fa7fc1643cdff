// QEMU's command line for one sandbox: the machine, its RAM as a file, the guest kernel and initramfs, the layer
// disks (read-only), the agent's ports, free page reporting, the monitor, and QEMU's own confinement.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dsec/backends/BackendKind.h"

namespace dsec::backends::vm {

struct QemuConfig {
  BackendKind kind = BackendKind::kMicrovm;
  std::string qemu = "qemu-system-x86_64";
  std::string accel = "tcg";
  int cpus = 1;
  int64_t memory_bytes = 0;  // guest RAM
  std::string ram_path;      // its file
  bool ram_shared = true;    // false: a restore's private (copy-on-write) mapping of a snapshot's RAM
  std::string kernel;        // the PVH vmlinux
  std::string initrd;
  int64_t tsc_khz = 0;  // TCG: the guest's TSC rate (the host's), so it need not calibrate
  std::vector<std::string> layer_files;
  std::string run_dir;      // qmp.sock and the ports' p<N>.sock
  uint32_t run_as = 0;      // uid and gid QEMU drops to (0: stays root; only tests)
  bool incoming = false;    // -incoming defer (a restore)
  std::string console_log;  // "" : no console
  // Booting an image's own init: the sandbox's hostname for it (systemd.hostname= outranks the image's /etc/hostname).
  std::string init_hostname;
};

std::vector<std::string> qemuArgv(const QemuConfig& config);

// Ports' and the monitor's socket paths in a run dir.
std::string portSocketPath(const std::string& run_dir, int port);
std::string monitorSocketPath(const std::string& run_dir);

}  // namespace dsec::backends::vm
