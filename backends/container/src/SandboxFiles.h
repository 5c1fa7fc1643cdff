// File access inside a sandbox from the host, through an O_PATH fd of the sandbox root: every lookup uses
// openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV), so a symlink planted inside the
// sandbox resolves inside it and can never reach a host file, a /proc magic link or another mount.
#pragma once

#include <linux/capability.h>
#include <sys/fsuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dsec/backends/Sandbox.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"

namespace dsec::backends {

// For the duration of a create, the calling thread's file system ids become the sandbox root's (host id owner):
// a sandbox in a user namespace refuses inodes owned by ids it cannot map (EOVERFLOW), and what the API creates
// belongs to the sandbox's root anyway. setfsuid/setfsgid and capset act on the calling thread only; the
// capabilities the fsuid change drops from the effective set are raised again (they stay permitted), so access
// checks are still those of host root.
class ActingOwner {
 public:
  explicit ActingOwner(std::optional<uint32_t> owner) : active_(owner.has_value()) {
    if (!active_) return;
    (void)setfsgid(*owner);
    (void)setfsuid(*owner);
    raiseEffective();
  }
  ~ActingOwner() {
    if (!active_) return;
    (void)setfsuid(0);
    (void)setfsgid(0);
    raiseEffective();
  }
  ActingOwner(const ActingOwner&) = delete;
  ActingOwner& operator=(const ActingOwner&) = delete;

 private:
  static void raiseEffective() {
    __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct data[2] = {};
    if (syscall(SYS_capget, &hdr, data) != 0) return;
    for (auto& d : data) d.effective = d.permitted;
    (void)syscall(SYS_capset, &hdr, data);
  }
  bool active_;
};

// "/a//b/./c" -> "/a/b/c"; rejects relative, empty, NUL and "..".
Result<std::string> normalizeSandboxPath(const std::string& path);

Result<UniqueFd> sandboxOpenForRead(int root_fd, const std::string& path);
// Creates or truncates (parents created as needed); what it creates belongs to owner (host uid and gid of the
// sandbox's root) when given, else to the caller.
Result<UniqueFd> sandboxOpenForWrite(int root_fd, const std::string& path, uint32_t mode,
                                     std::optional<uint32_t> owner = std::nullopt);
Result<FileStat> sandboxStat(int root_fd, const std::string& path);
Result<std::vector<FileStat>> sandboxListDir(int root_fd, const std::string& path);
Status sandboxRemove(int root_fd, const std::string& path, bool recursive);

}  // namespace dsec::backends
