#include "MountHelper.h"

#include <fcntl.h>
#include <linux/mount.h>
#include <linux/openat2.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

namespace dsec::backends {
namespace {

// What the child sends on its socket: one per clone (with the fd), then one report.
struct HelperMessage {
  char kind;  // 'C' clone (an fd rides along), 'R' report
  uint64_t failed;
  int error;
};

// Everything below runs in the forked child of a multi-threaded process: system calls only, no allocation.

int sendMessage(int sock, const HelperMessage& msg, int fd) {
  iovec iov{const_cast<HelperMessage*>(&msg), sizeof msg};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  if (fd >= 0) {
    mh.msg_control = control;
    mh.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
  }
  while (sendmsg(sock, &mh, MSG_NOSIGNAL) < 0) {
    if (errno != EINTR) return errno;
  }
  return 0;
}

// The path, resolved in the namespace's root without following a symlink in any component: a sandbox that swapped
// a directory for a symlink gets an error, never a mount somewhere else.
int openNoSymlinks(const char* path) {
  open_how how{};
  how.flags = O_PATH | O_CLOEXEC;
  how.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  return static_cast<int>(syscall(SYS_openat2, AT_FDCWD, path, &how, sizeof how));
}

int bindOnto(int path_fd, bool read_only) {
  int tree = static_cast<int>(
      syscall(SYS_open_tree, path_fd, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE | AT_EMPTY_PATH));
  if (tree < 0) return errno;
  int err = 0;
  if (read_only) {
    mount_attr attr{};
    attr.attr_set = MOUNT_ATTR_RDONLY;
    if (syscall(SYS_mount_setattr, tree, "", AT_EMPTY_PATH | AT_RECURSIVE, &attr, sizeof attr) != 0) err = errno;
  }
  if (err == 0 &&
      syscall(SYS_move_mount, tree, "", path_fd, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) != 0)
    err = errno;
  close(tree);
  return err;
}

int cloneWritable(int path_fd, int sock) {
  int tree = static_cast<int>(syscall(SYS_open_tree, path_fd, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH));
  if (tree < 0) return errno;
  mount_attr attr{};
  attr.attr_clr = MOUNT_ATTR_RDONLY;
  int err = 0;
  if (syscall(SYS_mount_setattr, tree, "", AT_EMPTY_PATH, &attr, sizeof attr) != 0) err = errno;
  if (err == 0) err = sendMessage(sock, HelperMessage{'C', 0, 0}, tree);
  close(tree);
  return err;
}

int runOp(const MountOp& op, int sock) {
  const char* path = op.path.c_str();
  if (op.kind == MountOp::kUnmount) {
    if (umount2(path, MNT_DETACH | UMOUNT_NOFOLLOW) == 0 || errno == EINVAL || errno == ENOENT) return 0;
    return errno;
  }
  int fd = openNoSymlinks(path);
  if (fd < 0) return errno;
  int err = 0;
  switch (op.kind) {
    case MountOp::kCheck:
    case MountOp::kCheckDir: {
      struct stat st;
      if (fstat(fd, &st) != 0) {
        err = errno;
      } else if (op.kind == MountOp::kCheckDir ? !S_ISDIR(st.st_mode) : !(S_ISDIR(st.st_mode) || S_ISREG(st.st_mode))) {
        err = ENOTDIR;
      }
      break;
    }
    case MountOp::kBindReadOnly:
    case MountOp::kBindSelf:
      err = bindOnto(fd, op.kind == MountOp::kBindReadOnly);
      break;
    case MountOp::kCloneWritable:
      err = cloneWritable(fd, sock);
      break;
    case MountOp::kUnmount:
      break;
  }
  close(fd);
  return err;
}

[[noreturn]] void childMain(int init_pidfd, const std::vector<MountOp>& ops, int sock) {
  if (setns(init_pidfd, CLONE_NEWNS) != 0) {
    (void)sendMessage(sock, HelperMessage{'R', UINT64_MAX, errno}, -1);
    _exit(1);
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    if (int err = runOp(ops[i], sock); err != 0) {
      (void)sendMessage(sock, HelperMessage{'R', i, err}, -1);
      _exit(0);
    }
  }
  (void)sendMessage(sock, HelperMessage{'R', ops.size(), 0}, -1);
  _exit(0);
}

// One message and the fd it carries (-1: none). 0 bytes: the child is gone.
Result<ssize_t> receiveMessage(int sock, HelperMessage& msg, UniqueFd& fd) {
  iovec iov{&msg, sizeof msg};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = control;
  mh.msg_controllen = sizeof control;
  ssize_t n;
  while ((n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR) {
  }
  if (n < 0) return Error::sys(errno, "read from the mount helper");
  for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      int received;
      memcpy(&received, CMSG_DATA(c), sizeof received);
      fd.reset(received);
    }
  }
  return n;
}

}  // namespace

Result<MountOpsResult> runMountOps(int init_pidfd, const std::vector<MountOp>& ops) {
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) return Error::sys(errno, "socketpair");
  UniqueFd ours(pair[0]), theirs(pair[1]);
  pid_t child = fork();
  if (child < 0) return Error::sys(errno, "fork the mount helper");
  if (child == 0) childMain(init_pidfd, ops, theirs.get());
  theirs.reset();
  MountOpsResult result;
  std::optional<Error> failure;
  bool reported = false;
  for (;;) {
    HelperMessage msg{};
    UniqueFd fd;
    auto n = receiveMessage(ours.get(), msg, fd);
    if (!n.ok()) {
      failure = n.error();
      break;
    }
    if (*n == 0) break;
    if (*n != sizeof msg) {
      failure = Error::internal("short message from the mount helper");
      break;
    }
    if (msg.kind == 'C' && fd) {
      result.clones.push_back(std::move(fd));
    } else if (msg.kind == 'R') {
      reported = true;
      if (msg.failed == UINT64_MAX) {
        failure = Error::sys(msg.error, "join the sandbox's mount namespace");
      } else {
        result.failed = static_cast<size_t>(msg.failed);
        result.error = msg.error;
      }
    }
  }
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (failure) return *failure;
  if (!reported)
    return Error::internal("the mount helper exited without a report (status " + std::to_string(status) + ")");
  return result;
}

}  // namespace dsec::backends
