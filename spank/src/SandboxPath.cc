#include "SandboxPath.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>

namespace dsec::spank {
namespace {

int openComponent(int dir_fd, const char* name, bool want_dir) {
  open_how how{};
  how.flags = (want_dir ? O_DIRECTORY : 0) | O_PATH | O_CLOEXEC;
  how.resolve = RESOLVE_NO_MAGICLINKS;
  return static_cast<int>(syscall(SYS_openat2, dir_fd, name, &how, sizeof how));
}

SandboxPathResult failAt(int component, SandboxPathStep step, int err) { return {-1, component, step, err}; }

// One component below dir_fd, created first if missing (on the root mount only).
SandboxPathResult stepInto(int dir_fd, const char* name, bool want_dir, uint64_t root_mount, int component) {
  int fd = openComponent(dir_fd, name, want_dir);
  if (fd >= 0) return {fd, component, SandboxPathStep::kOk, 0};
  if (errno != ENOENT) return failAt(component, SandboxPathStep::kResolve, errno);
  uint64_t here = 0;
  if (!mountIdOf(dir_fd, &here)) return failAt(component, SandboxPathStep::kResolve, errno);
  if (here != root_mount) return failAt(component, SandboxPathStep::kOutsideRoot, EXDEV);
  if (want_dir) {
    if (mkdirat(dir_fd, name, 0755) < 0 && errno != EEXIST) return failAt(component, SandboxPathStep::kMkdir, errno);
  } else {
    int created = openat(dir_fd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (created < 0 && errno != EEXIST) return failAt(component, SandboxPathStep::kCreateFile, errno);
    if (created >= 0) close(created);
  }
  fd = openComponent(dir_fd, name, want_dir);
  if (fd < 0) return failAt(component, SandboxPathStep::kResolve, errno);
  return {fd, component, SandboxPathStep::kOk, 0};
}

}  // namespace

bool mountIdOf(int fd, uint64_t* id) {
  struct statx stx {};
  if (statx(fd, "", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW, STATX_MNT_ID, &stx) < 0) return false;
  if ((stx.stx_mask & STATX_MNT_ID) == 0) {
    errno = ENOSYS;
    return false;
  }
  *id = stx.stx_mnt_id;
  return true;
}

SandboxPathResult openOrCreateInSandbox(int root_fd, uint64_t root_mount, const char* path, bool want_dir) {
  int dir = fcntl(root_fd, F_DUPFD_CLOEXEC, 0);
  if (dir < 0) return failAt(-1, SandboxPathStep::kResolve, errno);
  char name[NAME_MAX + 1];
  int component = 0;
  const char* p = path;
  for (;;) {
    while (*p == '/') ++p;
    if (*p == '\0') break;
    const char* end = p;
    while (*end != '\0' && *end != '/') ++end;
    size_t len = static_cast<size_t>(end - p);
    const char* rest = end;
    while (*rest == '/') ++rest;
    const bool last = *rest == '\0';
    if (len > NAME_MAX) {
      close(dir);
      return failAt(component, SandboxPathStep::kBadPath, ENAMETOOLONG);
    }
    memcpy(name, p, len);
    name[len] = '\0';
    p = end;
    if (strcmp(name, ".") == 0) {
      if (!last) continue;
      // A trailing "." names the directory reached so far.
      break;
    }
    if (strcmp(name, "..") == 0) {
      close(dir);
      return failAt(component, SandboxPathStep::kBadPath, EINVAL);
    }
    SandboxPathResult next = stepInto(dir, name, !last || want_dir, root_mount, component);
    close(dir);
    if (next.fd < 0) return next;
    dir = next.fd;
    ++component;
  }
  return {dir, component, SandboxPathStep::kOk, 0};
}

const char* sandboxPathStepName(SandboxPathStep step) {
  switch (step) {
    case SandboxPathStep::kOk:
      return "ok";
    case SandboxPathStep::kResolve:
      return "resolve it";
    case SandboxPathStep::kOutsideRoot:
      return "create it inside another mount (only the sandbox's own root file system gets new directories and "
             "files: create it in that mount's source first)";
    case SandboxPathStep::kMkdir:
      return "create the directory";
    case SandboxPathStep::kCreateFile:
      return "create the file";
    case SandboxPathStep::kBadPath:
      return "walk the path (no '..', components of at most 255 bytes)";
  }
  return "unknown step";
}

}  // namespace dsec::spank
