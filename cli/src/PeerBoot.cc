#include "PeerBoot.h"

#include <elf.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <x86intrin.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <thread>
#include <vector>

#include "dsec/common/Fd.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"

namespace dsec::cli {
namespace {

// newc cpio: "070701", 13 eight-digit hex fields, the NUL-terminated name and the data, each padded to 4 bytes.
// The machine backends' writer (backends/vm) writes only the agent's archive; this one takes any entries.
class NewcWriter {
 public:
  void add(const std::string& name, uint32_t mode, const std::string& data, uint32_t rdev_major = 0,
           uint32_t rdev_minor = 0) {
    char header[111];
    snprintf(header, sizeof header, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X", next_ino_++, mode, 0u,
             0u, S_ISDIR(mode) ? 2u : 1u, 0u, static_cast<uint32_t>(data.size()), 0u, 0u, rdev_major, rdev_minor,
             static_cast<uint32_t>(name.size() + 1), 0u);
    out_.append(header, 110);
    out_ += name;
    out_.push_back('\0');
    pad();
    out_ += data;
    pad();
  }
  std::string finish() {
    add("TRAILER!!!", 0, "");
    return std::move(out_);
  }

 private:
  void pad() {
    while (out_.size() % 4 != 0) out_.push_back('\0');
  }
  std::string out_;
  uint32_t next_ino_ = 1;
};

// True when the ELF file asks for no program interpreter (a static executable runs in an empty initramfs).
bool isStaticElf(const std::string& bytes) {
  if (bytes.size() < sizeof(Elf64_Ehdr) || bytes.compare(0, SELFMAG, ELFMAG) != 0) return false;
  Elf64_Ehdr header{};
  bytes.copy(reinterpret_cast<char*>(&header), sizeof header);
  if (header.e_ident[EI_CLASS] != ELFCLASS64 || header.e_phentsize != sizeof(Elf64_Phdr)) return false;
  for (size_t i = 0; i < header.e_phnum; ++i) {
    size_t at = header.e_phoff + i * sizeof(Elf64_Phdr);
    if (at + sizeof(Elf64_Phdr) > bytes.size()) return false;
    Elf64_Phdr program{};
    bytes.copy(reinterpret_cast<char*>(&program), sizeof program, at);
    if (program.p_type == PT_INTERP) return false;
  }
  return true;
}

// The host's TSC rate in kHz, as the machine backends pass it to a TCG guest (whose own calibration hangs on a
// loaded host); 0 if it cannot be measured.
int64_t hostTscKhz() {
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
  if (t1 <= t0 || c1 <= c0) return 0;
  return static_cast<int64_t>(std::llround(static_cast<double>(c1 - c0) / (t1 - t0) / 1000.0));
}

std::vector<std::string> peerArgv(const PeerBootConfig& c) {
  const bool micro = c.kind == backends::BackendKind::kMicrovm;
  std::vector<std::string> a = {c.qemu, "-nodefaults", "-no-user-config", "-nographic", "-no-reboot"};
  // The machine options of the backends (backends/vm/src/QemuCommand.cc) with the serial port on.
  a.insert(a.end(), {"-M", micro ? "microvm,x-option-roms=off,pit=off,pic=off,rtc=off,isa-serial=on" : "q35"});
  if (c.accel == "kvm") {
    a.insert(a.end(), {"-accel", "kvm", "-cpu", "host"});
  } else {
    a.insert(a.end(), {"-accel", "tcg,tb-size=64", "-cpu", "max"});
  }
  a.insert(a.end(), {"-smp", "1", "-m", std::to_string(c.memory_bytes >> 20) + "M"});
  std::string append = "quiet panic=-1 rdinit=/init";
  if (micro) append += " pci=off";
  static const int64_t tsc_khz = hostTscKhz();
  if (c.accel != "kvm" && tsc_khz > 0) append += " tsc_early_khz=" + std::to_string(tsc_khz) + " tsc=reliable";
  append += " console=ttyS0";
  a.insert(a.end(), {"-kernel", c.kernel, "-initrd", c.initramfs, "-append", append, "-serial", "stdio"});
  return a;
}

}  // namespace

Result<std::string> findStaticBusybox() {
  std::string busybox = "/bin/busybox";
  if (access(busybox.c_str(), X_OK) != 0) busybox = findProgram("busybox");
  if (busybox.empty()) return Error::notFound("busybox not found (apt-get install busybox-static)");
  return busybox;
}

Status writePeerInitramfs(const std::string& path, const std::string& busybox) {
  DSEC_ASSIGN_OR_RETURN(std::string binary, readFile(busybox));
  if (!isStaticElf(binary))
    return Error::invalid(busybox + " is not a static executable (apt-get install busybox-static)");
  NewcWriter cpio;
  for (const char* dir : {".", "bin", "dev"}) cpio.add(dir, S_IFDIR | 0755, "");
  // The kernel opens /dev/console for init's stdin, stdout and stderr; nothing mounts /dev here.
  cpio.add("dev/console", S_IFCHR | 0600, "", 5, 1);
  cpio.add("bin/busybox", S_IFREG | 0755, binary);
  // Should poweroff fail, init exits, the kernel panics (panic=-1 reboots at once) and -no-reboot ends QEMU.
  cpio.add("init", S_IFREG | 0755,
           std::string("#!/bin/busybox sh\n/bin/busybox echo ") + kPeerBootMarker + "\n/bin/busybox poweroff -f\n");
  return writeFileAtomic(path, cpio.finish(), 0644);
}

Result<double> bootPeerOnce(const PeerBootConfig& config) {
  CommandOptions options;
  options.timeout_seconds = config.timeout_seconds;
  double marker_at = 0;
  const double start = monotonicSeconds();
  options.on_line = [&](std::string_view line) {
    if (marker_at == 0 && line.find(kPeerBootMarker) != std::string_view::npos) marker_at = monotonicSeconds();
  };
  auto ran = runCommand(peerArgv(config), options);
  if (!ran.ok()) return ran.error();
  if (marker_at == 0) {
    std::string tail = ran->output.size() > 600 ? ran->output.substr(ran->output.size() - 600) : ran->output;
    return Error::internal("the peer QEMU exited (" + std::to_string(ran->exit_code) + ") without " + kPeerBootMarker +
                           " on its console: " + tail);
  }
  return marker_at - start;
}

}  // namespace dsec::cli
