#include "BindMounts.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "dsec/common/Fd.h"
#include "dsec/common/Strings.h"

namespace dsec::spank {
namespace {

enum ChildStep : int {
  kOk = 0,
  kSetns,
  kChroot,
  kOpenRoot,
  kResolveTarget,
  kOutsideRoot,
  kMkdir,
  kCreateFile,
  kMoveMount
};

const char* stepName(int step) {
  switch (step) {
    case kSetns:
      return "join the sandbox's mount namespace";
    case kChroot:
      return "enter the sandbox root";
    case kOpenRoot:
      return "open the sandbox root";
    case kResolveTarget:
      return "resolve the target";
    case kOutsideRoot:
      return "create the target inside another mount (only the sandbox's own root file system gets new "
             "directories and files: create it in that mount's source first)";
    case kMkdir:
      return "create the target directory";
    case kCreateFile:
      return "create the target file";
    case kMoveMount:
      return "attach the mount";
    default:
      return "unknown step";
  }
}

struct Report {
  int index = -1;
  int component = -1;  // of the target path, for the message
  int step = kOk;
  int err = 0;
};

// Everything the child needs, prepared before fork (the child must not allocate).
struct Prepared {
  UniqueFd tree;
  bool is_dir = true;
  std::vector<std::string> components;  // of the target, outermost first
};

[[noreturn]] void childFail(int report_fd, int index, int component, int step) {
  Report r{index, component, step, errno};
  ssize_t ignored = write(report_fd, &r, sizeof r);
  (void)ignored;
  _exit(1);
}

int openBeneath(int dir_fd, const char* name, uint64_t flags) {
  open_how how{};
  how.flags = flags | O_PATH | O_CLOEXEC;
  how.resolve = RESOLVE_NO_MAGICLINKS;
  return static_cast<int>(syscall(SYS_openat2, dir_fd, name, &how, sizeof how));
}

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

// Opens (creating it if missing, on the root mount only) one component below dir_fd. Returns the new fd.
int stepInto(int dir_fd, const char* name, bool want_dir, uint64_t root_mount, int report_fd, int index,
             int component) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    int fd = openBeneath(dir_fd, name, want_dir ? O_DIRECTORY : 0);
    if (fd >= 0) return fd;
    if (errno != ENOENT || attempt > 0) childFail(report_fd, index, component, kResolveTarget);
    uint64_t here = 0;
    if (!mountIdOf(dir_fd, &here)) childFail(report_fd, index, component, kResolveTarget);
    if (here != root_mount) {
      errno = EXDEV;
      childFail(report_fd, index, component, kOutsideRoot);
    }
    if (want_dir) {
      if (mkdirat(dir_fd, name, 0755) < 0 && errno != EEXIST) childFail(report_fd, index, component, kMkdir);
    } else {
      int created = openat(dir_fd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
      if (created < 0 && errno != EEXIST) childFail(report_fd, index, component, kCreateFile);
      if (created >= 0) close(created);
    }
  }
  childFail(report_fd, index, component, kResolveTarget);
}

[[noreturn]] void child(int init_pidfd, int root_fd, const std::vector<Prepared>& items, int report_fd) {
  if (setns(init_pidfd, CLONE_NEWNS) < 0) childFail(report_fd, -1, -1, kSetns);
  if (fchdir(root_fd) < 0 || chroot(".") < 0 || chdir("/") < 0) childFail(report_fd, -1, -1, kChroot);
  umask(022);
  int root = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
  uint64_t root_mount = 0;
  if (root < 0 || !mountIdOf(root, &root_mount)) childFail(report_fd, -1, -1, kOpenRoot);
  for (size_t i = 0; i < items.size(); ++i) {
    const Prepared& p = items[i];
    const int index = static_cast<int>(i);
    // Each target is walked afresh from the root: an earlier mount may sit on its way.
    int dir = dup(root);
    if (dir < 0) childFail(report_fd, index, -1, kOpenRoot);
    for (size_t c = 0; c < p.components.size(); ++c) {
      bool last = c + 1 == p.components.size();
      int next =
          stepInto(dir, p.components[c].c_str(), !last || p.is_dir, root_mount, report_fd, index, static_cast<int>(c));
      close(dir);
      dir = next;
    }
    if (move_mount(p.tree.get(), "", dir, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0) {
      childFail(report_fd, index, -1, kMoveMount);
    }
    close(dir);
  }
  _exit(0);
}

Result<UniqueFd> openSource(const BindRequest& request, const JobCredentials& creds) {
  if (request.as_job_user) return openMountSourceAs(request.mount.source, creds);
  open_how how{};
  how.flags = O_PATH | O_CLOEXEC;
  how.resolve = RESOLVE_NO_MAGICLINKS;
  UniqueFd fd(static_cast<int>(syscall(SYS_openat2, AT_FDCWD, request.mount.source.c_str(), &how, sizeof how)));
  if (!fd) {
    if (errno == ENOENT) {
      return Error(ErrorCode::kNotFound, "mount source " + request.mount.source + " does not exist on this node",
                   errno);
    }
    return Error::sys(errno, "open mount source " + request.mount.source);
  }
  return fd;
}

}  // namespace

Status bindIntoSandbox(int init_pidfd, int root_fd, const std::vector<BindRequest>& mounts,
                       const JobCredentials& creds) {
  if (mounts.empty()) return okStatus();
  std::vector<Prepared> items;
  for (const auto& request : mounts) {
    const MountSpec& m = request.mount;
    std::string what = "mount " + m.source + ":" + m.target;
    auto source = openSource(request, creds);
    if (!source.ok()) return source.error().wrap(what);
    Prepared p;
    p.tree.reset(static_cast<int>(
        open_tree(source->get(), "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH | AT_RECURSIVE)));
    if (!p.tree) return Error::sys(errno, what + ": clone " + m.source);
    mount_attr attr{};
    // A setuid binary or a device node in a bound tree must not work inside: the user may own either.
    attr.attr_set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    if (m.read_only) attr.attr_set |= MOUNT_ATTR_RDONLY;
    attr.propagation = MS_PRIVATE;  // nothing mounted later on the host shows up in the sandbox, nor back
    if (mount_setattr(p.tree.get(), "", AT_EMPTY_PATH | AT_RECURSIVE, &attr, sizeof attr) < 0) {
      return Error::sys(errno, what + ": set mount attributes");
    }
    struct stat st {};
    if (fstat(p.tree.get(), &st) < 0) return Error::sys(errno, what + ": stat " + m.source);
    p.is_dir = S_ISDIR(st.st_mode);
    for (const auto& part : split(m.target, '/')) {
      if (part.empty() || part == ".") continue;
      if (part == "..") return Error::invalid(what + ": the target must not contain '..'");
      p.components.push_back(part);
    }
    if (p.components.empty()) return Error::invalid(what + ": cannot mount over the sandbox's root");
    items.push_back(std::move(p));
  }

  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) < 0) return Error::sys(errno, "pipe");
  UniqueFd report_r(pipefd[0]), report_w(pipefd[1]);
  pid_t pid = fork();
  if (pid < 0) return Error::sys(errno, "fork mount helper");
  if (pid == 0) child(init_pidfd, root_fd, items, report_w.get());
  report_w.reset();
  Report r;
  ssize_t n;
  do {
    n = read(report_r.get(), &r, sizeof r);
  } while (n < 0 && errno == EINTR);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (n == static_cast<ssize_t>(sizeof r)) {
    std::string what = "bind mounts";
    if (r.index >= 0 && static_cast<size_t>(r.index) < mounts.size()) {
      const MountSpec& m = mounts[static_cast<size_t>(r.index)].mount;
      what = "mount " + m.source + ":" + m.target;
      const auto& parts = items[static_cast<size_t>(r.index)].components;
      if (r.component >= 0 && static_cast<size_t>(r.component) < parts.size()) {
        std::string at;
        for (int c = 0; c <= r.component; ++c) at += "/" + parts[static_cast<size_t>(c)];
        what += " (at " + at + ")";
      }
    }
    return Error::sys(r.err, what + ": " + stepName(r.step));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return Error::internal("mount helper failed without a report");
  return okStatus();
}

}  // namespace dsec::spank
