#include "QemuCommand.h"

#include <x86intrin.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <thread>

#include "dsec/backends/vm/AgentChannel.h"
#include "dsec/backends/vm/VmBackend.h"

namespace dsec::backends::vm {
namespace {

std::string mib(int64_t bytes) { return std::to_string(bytes >> 20) + "M"; }

}  // namespace

std::string portSocketPath(const std::string& run_dir, int port) {
  return run_dir + "/p" + std::to_string(port) + ".sock";
}
std::string monitorSocketPath(const std::string& run_dir) { return run_dir + "/qmp.sock"; }

int64_t hostTscKhz() {
  static const int64_t khz = [] {
    auto now = [] {
      timespec ts{};
      clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
      return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
    };
    double t0 = now();
    uint64_t c0 = __rdtsc();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    double t1 = now();
    uint64_t c1 = __rdtsc();
    if (t1 <= t0 || c1 <= c0) return int64_t{0};
    return static_cast<int64_t>(std::llround(static_cast<double>(c1 - c0) / (t1 - t0) / 1000.0));
  }();
  return khz;
}

std::vector<std::string> qemuArgv(const QemuConfig& c) {
  const bool micro = c.kind == BackendKind::kMicrovm;
  const std::string bus = micro ? "device" : "pci";  // virtio-mmio on microvm, PCI on q35
  std::vector<std::string> a = {c.qemu, "-nodefaults", "-no-user-config", "-nographic", "-no-reboot"};
  if (micro) {
    a.insert(a.end(), {"-M", std::string("microvm,x-option-roms=off,pit=off,pic=off,rtc=off,memory-backend=ram,") +
                                 (c.console_log.empty() ? "isa-serial=off" : "isa-serial=on")});
  } else {
    a.insert(a.end(), {"-M", "q35,memory-backend=ram"});
  }
  if (c.accel == "kvm") {
    a.insert(a.end(), {"-accel", "kvm", "-cpu", "host"});
  } else {
    // The translation cache is the largest part of a TCG QEMU's own memory; 64 MiB holds a busy guest's code.
    a.insert(a.end(), {"-accel", "tcg,tb-size=64", "-cpu", "max"});
  }
  a.insert(a.end(), {"-smp", std::to_string(std::max(1, c.cpus)), "-m", mib(c.memory_bytes)});
  a.insert(a.end(), {"-object", "memory-backend-file,id=ram,size=" + mib(c.memory_bytes) + ",mem-path=" + c.ram_path +
                                    ",share=" + (c.ram_shared ? "on" : "off")});
  std::string append = "quiet panic=-1 rdinit=/init";
  if (micro) append += " pci=off";
  if (c.accel != "kvm" && c.tsc_khz > 0) append += " tsc_early_khz=" + std::to_string(c.tsc_khz) + " tsc=reliable";
  append += c.console_log.empty() ? " console=none" : " console=ttyS0";
  if (!c.init_hostname.empty()) append += " systemd.hostname=" + c.init_hostname;
  a.insert(a.end(), {"-kernel", c.kernel, "-initrd", c.initrd, "-append", append});
  if (!c.console_log.empty()) a.insert(a.end(), {"-serial", "file:" + c.console_log});
  for (size_t i = 0; i < c.layer_files.size(); ++i) {
    std::string id = "layer" + std::to_string(i);
    a.insert(a.end(), {"-drive", "file=" + c.layer_files[i] + ",format=raw,if=none,readonly=on,id=" + id, "-device",
                       "virtio-blk-" + bus + ",drive=" + id + ",serial=dsec-layer-" + std::to_string(i)});
  }
  a.insert(a.end(), {"-device", "virtio-serial-" + bus + ",max_ports=" + std::to_string(kAgentPorts + 1)});
  for (int p = 0; p < kAgentPorts; ++p) {
    std::string id = "p" + std::to_string(p);
    a.insert(a.end(), {"-chardev", "socket,id=" + id + ",path=" + portSocketPath(c.run_dir, p) + ",server=on,wait=off",
                       "-device", "virtserialport,chardev=" + id + ",name=dsec." + std::to_string(p)});
  }
  a.insert(a.end(), {"-device", "virtio-balloon-" + bus + ",free-page-reporting=on"});
  a.insert(a.end(), {"-qmp", "unix:" + monitorSocketPath(c.run_dir) + ",server=on,wait=off"});
  if (c.incoming) a.insert(a.end(), {"-incoming", "defer"});
  if (c.run_as != 0) a.insert(a.end(), {"-runas", std::to_string(c.run_as) + ":" + std::to_string(c.run_as)});
  // QEMU's own seccomp filter: no exec, no new privileges, no priority or affinity games.
  a.insert(a.end(), {"-sandbox", "on,obsolete=deny,spawn=deny,resourcecontrol=deny"});
  return a;
}

}  // namespace dsec::backends::vm
