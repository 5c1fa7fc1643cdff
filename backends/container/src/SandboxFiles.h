// File access inside a sandbox from the host, through an O_PATH fd of the sandbox root: every lookup uses
// openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV), so a symlink planted inside the
// sandbox resolves inside it and can never reach a host file, a /proc magic link or another mount.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dsec/backends/Sandbox.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"

namespace dsec::backends {

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
