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

#include "SandboxPath.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Strings.h"

namespace dsec::spank {
namespace {

enum ChildStep : int { kOk = 0, kSetns, kChroot, kOpenRoot, kTarget, kMoveMount };

struct Report {
  int index = -1;
  int step = kOk;
  int err = 0;
  SandboxPathResult target;  // step kTarget: where the walk failed
};

std::string stepName(const Report& r) {
  switch (r.step) {
    case kSetns:
      return "join the sandbox's mount namespace";
    case kChroot:
      return "enter the sandbox root";
    case kOpenRoot:
      return "open the sandbox root";
    case kTarget:
      return std::string("target: ") + sandboxPathStepName(r.target.step);
    case kMoveMount:
      return "attach the mount";
    default:
      return "unknown step";
  }
}

// Everything the child needs, prepared before fork (the child must not allocate).
struct Prepared {
  UniqueFd tree;
  bool is_dir = true;
  std::string target;                   // normalised, absolute
  std::vector<std::string> components;  // of the target, outermost first (for messages)
};

[[noreturn]] void childFail(int report_fd, int index, int step, SandboxPathResult target = {}) {
  Report r{index, step, step == kTarget ? target.err : errno, target};
  ssize_t ignored = write(report_fd, &r, sizeof r);
  (void)ignored;
  _exit(1);
}

[[noreturn]] void child(int init_pidfd, int root_fd, const std::vector<Prepared>& items, int report_fd) {
  if (setns(init_pidfd, CLONE_NEWNS) < 0) childFail(report_fd, -1, kSetns);
  if (fchdir(root_fd) < 0 || chroot(".") < 0 || chdir("/") < 0) childFail(report_fd, -1, kChroot);
  umask(022);
  int root = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
  uint64_t root_mount = 0;
  if (root < 0 || !mountIdOf(root, &root_mount)) childFail(report_fd, -1, kOpenRoot);
  for (size_t i = 0; i < items.size(); ++i) {
    const Prepared& p = items[i];
    const int index = static_cast<int>(i);
    // Each target is walked afresh from the root: an earlier mount may sit on its way.
    SandboxPathResult target = openOrCreateInSandbox(root, root_mount, p.target.c_str(), p.is_dir);
    if (target.fd < 0) childFail(report_fd, index, kTarget, target);
    if (move_mount(p.tree.get(), "", target.fd, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0) {
      childFail(report_fd, index, kMoveMount);
    }
    close(target.fd);
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
      p.target += "/" + part;
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
      if (r.step == kTarget && r.target.component >= 0 && static_cast<size_t>(r.target.component) < parts.size()) {
        std::string at;
        for (int c = 0; c <= r.target.component; ++c) at += "/" + parts[static_cast<size_t>(c)];
        what += " (at " + at + ")";
      }
    }
    return Error::sys(r.err, what + ": " + stepName(r));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return Error::internal("mount helper failed without a report");
  return okStatus();
}

}  // namespace dsec::spank
