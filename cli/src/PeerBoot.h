// The peer `dsec bench create --backend microvm|vm` compares against: a plain QEMU (the same binary, machine type,
// accelerator and guest kernel as the machine backends) booting an initramfs whose /init is a busybox shell
// script that prints a marker on the serial console and powers off. No agent, no disks, no sockets: what any
// VM of this shape costs to boot here.
#pragma once

#include <cstdint>
#include <string>

#include "dsec/backends/BackendKind.h"
#include "dsec/common/Result.h"

namespace dsec::cli {

inline constexpr const char* kPeerBootMarker = "DSEC-PEER-BOOTED";

struct PeerBootConfig {
  backends::BackendKind kind = backends::BackendKind::kMicrovm;  // kMicrovm | kVm
  std::string qemu = "qemu-system-x86_64";
  std::string accel;      // "tcg" | "kvm" (as the node chose it)
  std::string kernel;     // the guest kernel's vmlinux
  std::string initramfs;  // writePeerInitramfs()
  int64_t memory_bytes = 512ll << 20;
  double timeout_seconds = 120;
};

// Writes a newc cpio archive to path: /bin/busybox (a static one, copied from `busybox`), /dev/console and /init.
Status writePeerInitramfs(const std::string& path, const std::string& busybox);

// The host's static busybox (/bin/busybox, else on PATH); kNotFound naming the package when there is none.
Result<std::string> findStaticBusybox();

// Boots the peer once and returns the seconds from starting QEMU to the marker on its console. An error (with
// the console's tail) if QEMU exits without printing it or the timeout passes.
Result<double> bootPeerOnce(const PeerBootConfig& config);

}  // namespace dsec::cli
