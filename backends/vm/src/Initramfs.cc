#include "dsec/backends/vm/Initramfs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

#include "dsec/backends/vm/Cpio.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Process.h"

namespace dsec::backends::vm {
namespace {

constexpr const char* kDefaultKernelDir = "/usr/local/lib/dsec/guest-kernel";

Result<std::string> readWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error::sys(errno ? errno : ENOENT, "reading " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Error::sys(EIO, "reading " + path);
  return ss.str();
}

}  // namespace

bool isModuleFileName(const std::string& name) {
  for (const char* suffix : {".ko", ".ko.xz", ".ko.zst", ".ko.gz"}) {
    std::string_view s(suffix);
    if (name.size() > s.size() && name.ends_with(s)) return true;
  }
  return false;
}

Result<std::string> findGuestKernelDir() {
  const char* env = getenv("DSEC_GUEST_KERNEL_DIR");
  std::string dir = env != nullptr && *env != '\0' ? env : kDefaultKernelDir;
  if (access((dir + "/vmlinux").c_str(), R_OK) != 0 || access((dir + "/modules.order").c_str(), R_OK) != 0) {
    return Error::notFound("no guest kernel in " + dir +
                           " (install it with backends/vm/guest/fetch-guest-kernel.sh, or set DSEC_GUEST_KERNEL_DIR)");
  }
  return dir;
}

Result<std::string> findGuestAgent() {
  std::vector<std::string> candidates = {selfExeDir() + "/dsec-guest-agent",
                                         selfExeDir() + "/../libexec/dsec/dsec-guest-agent"};
#ifdef DSEC_GUEST_AGENT_BUILD_PATH
  candidates.emplace_back(DSEC_GUEST_AGENT_BUILD_PATH);
#endif
  for (const auto& c : candidates) {
    if (access(c.c_str(), X_OK) == 0) return c;
  }
  return Error::notFound("dsec-guest-agent not found next to the program, in ../libexec/dsec or the build tree");
}

Status writeInitramfs(const std::string& out_path, const std::string& agent_path, const std::string& kernel_dir) {
  DSEC_ASSIGN_OR_RETURN(std::string agent, readWhole(agent_path));
  DSEC_ASSIGN_OR_RETURN(std::string order, readWhole(kernel_dir + "/modules.order"));
  std::string tmp = out_path + ".tmp." + std::to_string(getpid());
  UniqueFd fd(open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd) return Error::sys(errno, "creating " + tmp);
  CpioWriter cpio(fd.get());
  auto write_all = [&]() -> Status {
    for (const char* dir : {".", "dev", "proc", "sys", "lib", "lib/modules", "layers", "upper", "sandbox"}) {
      DSEC_TRY(cpio.add(dir, S_IFDIR | 0755, ""));
    }
    // The kernel opens /dev/console for init's stdin, stdout and stderr before /dev is mounted.
    DSEC_TRY(cpio.add("dev/console", S_IFCHR | 0600, "", 5, 1));
    DSEC_TRY(cpio.add("init", S_IFREG | 0755, agent));
    std::istringstream lines(order);
    std::string name;
    std::string kept_order;
    while (std::getline(lines, name)) {
      if (name.empty()) continue;
      if (name.find('/') != std::string::npos || name.starts_with(".") || !isModuleFileName(name)) {
        return Error::invalid("bad module name in " + kernel_dir + "/modules.order: " + name);
      }
      DSEC_ASSIGN_OR_RETURN(std::string module, readWhole(kernel_dir + "/modules/" + name));
      DSEC_TRY(cpio.add("lib/modules/" + name, S_IFREG | 0644, module));
      kept_order += name + "\n";
    }
    DSEC_TRY(cpio.add("lib/modules/modules.order", S_IFREG | 0644, kept_order));
    return cpio.finish();
  };
  Status written = write_all();
  if (written.ok() && fsync(fd.get()) != 0) written = Error::sys(errno, "fsync " + tmp);
  fd.reset();
  if (written.ok() && rename(tmp.c_str(), out_path.c_str()) != 0) written = Error::sys(errno, "renaming " + tmp);
  if (!written.ok()) unlink(tmp.c_str());
  return written;
}

}  // namespace dsec::backends::vm
