#include "PeerBoot.h"

#include <elf.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <vector>

#include "dsec/backends/vm/Cpio.h"
#include "dsec/backends/vm/VmBackend.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"

namespace dsec::cli {
namespace {

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
  const int64_t tsc_khz = backends::vm::hostTscKhz();
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
  std::string tmp = path + ".tmp." + std::to_string(getpid());
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd) return Error::sys(errno, "creating " + tmp);
  backends::vm::CpioWriter cpio(fd.get());
  auto write_all = [&]() -> Status {
    for (const char* dir : {".", "bin", "dev"}) DSEC_TRY(cpio.add(dir, S_IFDIR | 0755, ""));
    // The kernel opens /dev/console for init's stdin, stdout and stderr; nothing mounts /dev here.
    DSEC_TRY(cpio.add("dev/console", S_IFCHR | 0600, "", 5, 1));
    DSEC_TRY(cpio.add("bin/busybox", S_IFREG | 0755, binary));
    // Should poweroff fail, init exits, the kernel panics (panic=-1 reboots at once) and -no-reboot ends QEMU.
    DSEC_TRY(cpio.add(
        "init", S_IFREG | 0755,
        std::string("#!/bin/busybox sh\n/bin/busybox echo ") + kPeerBootMarker + "\n/bin/busybox poweroff -f\n"));
    return cpio.finish();
  };
  Status written = write_all();
  fd.reset();
  if (written.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) written = Error::sys(errno, "renaming " + tmp);
  if (!written.ok()) ::unlink(tmp.c_str());
  return written;
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
