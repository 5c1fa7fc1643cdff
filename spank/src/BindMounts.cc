#include "BindMounts.h"

#include <fcntl.h>
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

enum ChildStep : int { kOk = 0, kSetns, kChroot, kMkdir, kCreateFile, kMoveMount };

const char* stepName(int step) {
  switch (step) {
    case kSetns:
      return "join the sandbox's mount namespace";
    case kChroot:
      return "enter the sandbox root";
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
  int step = kOk;
  int err = 0;
};

// Everything the child needs, prepared before fork (the child must not allocate).
struct Prepared {
  UniqueFd tree;
  bool is_dir = true;
  std::vector<std::string> dirs;  // to create, outermost first
  std::string target;
};

[[noreturn]] void childFail(int report_fd, int index, int step) {
  Report r{index, step, errno};
  ssize_t ignored = write(report_fd, &r, sizeof r);
  (void)ignored;
  _exit(1);
}

[[noreturn]] void child(int init_pidfd, int root_fd, const std::vector<Prepared>& items, int report_fd) {
  if (setns(init_pidfd, CLONE_NEWNS) < 0) childFail(report_fd, -1, kSetns);
  if (fchdir(root_fd) < 0 || chroot(".") < 0 || chdir("/") < 0) childFail(report_fd, -1, kChroot);
  umask(022);
  for (size_t i = 0; i < items.size(); ++i) {
    const Prepared& p = items[i];
    for (const auto& d : p.dirs) {
      if (mkdir(d.c_str(), 0755) < 0 && errno != EEXIST) childFail(report_fd, static_cast<int>(i), kMkdir);
    }
    if (!p.is_dir) {
      int fd = open(p.target.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
      if (fd < 0 && errno != EISDIR) childFail(report_fd, static_cast<int>(i), kCreateFile);
      if (fd >= 0) close(fd);
    }
    if (move_mount(p.tree.get(), "", AT_FDCWD, p.target.c_str(), MOVE_MOUNT_F_EMPTY_PATH) < 0) {
      childFail(report_fd, static_cast<int>(i), kMoveMount);
    }
  }
  _exit(0);
}

}  // namespace

Status bindIntoSandbox(int init_pidfd, int root_fd, const std::vector<MountSpec>& mounts) {
  if (mounts.empty()) return okStatus();
  std::vector<Prepared> items;
  for (const auto& m : mounts) {
    std::string what = "mount " + m.source + ":" + m.target;
    Prepared p;
    p.tree.reset(
        static_cast<int>(open_tree(AT_FDCWD, m.source.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE)));
    if (!p.tree) {
      if (errno == ENOENT)
        return Error(ErrorCode::kNotFound, what + ": " + m.source + " does not exist on this node", errno);
      return Error::sys(errno, what + ": clone " + m.source);
    }
    mount_attr attr{};
    attr.propagation = MS_PRIVATE;  // nothing mounted later on the host shows up in the sandbox, nor back
    if (m.read_only) attr.attr_set = MOUNT_ATTR_RDONLY;
    if (mount_setattr(p.tree.get(), "", AT_EMPTY_PATH | AT_RECURSIVE, &attr, sizeof attr) < 0) {
      return Error::sys(errno, what + ": set mount attributes");
    }
    struct stat st {};
    if (fstat(p.tree.get(), &st) < 0) return Error::sys(errno, what + ": stat " + m.source);
    p.is_dir = S_ISDIR(st.st_mode);
    std::string prefix;
    auto parts = split(m.target, '/');
    for (size_t i = 0; i < parts.size(); ++i) {
      if (parts[i].empty() || parts[i] == ".") continue;
      prefix += "/" + parts[i];
      bool last = i + 1 == parts.size();
      if (!last || p.is_dir) p.dirs.push_back(prefix);
    }
    p.target = prefix;
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
    std::string what = r.index >= 0 ? "mount " + mounts[static_cast<size_t>(r.index)].source + ":" +
                                          mounts[static_cast<size_t>(r.index)].target
                                    : std::string("bind mounts");
    return Error::sys(r.err, what + ": " + stepName(r.step));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return Error::internal("mount helper failed without a report");
  return okStatus();
}

}  // namespace dsec::spank
