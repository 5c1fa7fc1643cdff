#include "MountSource.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace dsec::spank {
namespace {

// A user's lookup can hang (a FUSE or NFS server that does not answer): slurmstepd must not hang with it.
constexpr int kLookupTimeoutMs = 30'000;

enum ChildStep : int { kOk = 0, kDropCredentials, kResolve, kMagicLink, kInProc, kNotReadable, kSend };

struct Report {
  int step = kOk;
  int err = 0;
};

void sendReport(int sock, int step, int err, int fd) {
  Report r{step, err};
  iovec iov{&r, sizeof r};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
  }
  while (sendmsg(sock, &msg, MSG_NOSIGNAL) < 0 && errno == EINTR) {
  }
}

[[noreturn]] void childFail(int sock, int step) {
  sendReport(sock, step, errno, -1);
  _exit(1);
}

long openPath(const char* path, uint64_t resolve) {
  open_how how{};
  how.flags = O_PATH | O_CLOEXEC;
  how.resolve = resolve;
  return syscall(SYS_openat2, AT_FDCWD, path, &how, sizeof how);
}

// The child: system calls only (the parent is multithreaded). Raw set*id calls change just this thread's
// credentials, which is the whole process here, without glibc's all-threads broadcast.
[[noreturn]] void child(int sock, const char* path, const JobCredentials& creds) {
  prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  // Nothing of slurmstepd's stays open in a process that runs with the user's uid.
  if (sock > 3) syscall(SYS_close_range, 3U, static_cast<unsigned>(sock) - 1, 0U);
  syscall(SYS_close_range, static_cast<unsigned>(sock) + 1, ~0U, 0U);
  if (prctl(PR_SET_KEEPCAPS, 0, 0, 0, 0) < 0) childFail(sock, kDropCredentials);
  if (syscall(SYS_setgroups, creds.groups.size(), creds.groups.data()) < 0) childFail(sock, kDropCredentials);
  if (syscall(SYS_setresgid, creds.gid, creds.gid, creds.gid) < 0) childFail(sock, kDropCredentials);
  if (syscall(SYS_setresuid, creds.uid, creds.uid, creds.uid) < 0) childFail(sock, kDropCredentials);
  if (getuid() != creds.uid || geteuid() != creds.uid || getgid() != creds.gid || getegid() != creds.gid) {
    errno = EPERM;
    childFail(sock, kDropCredentials);
  }
  long fd = openPath(path, RESOLVE_NO_MAGICLINKS);
  if (fd < 0) {
    int err = errno;
    // ELOOP is also "too many symlinks": only a lookup that works with magic links allowed was stopped by one.
    if (err == ELOOP) {
      long probe = openPath(path, 0);
      if (probe >= 0) {
        errno = ELOOP;
        childFail(sock, kMagicLink);
      }
    }
    errno = err;
    childFail(sock, kResolve);
  }
  struct statfs fs {};
  if (fstatfs(static_cast<int>(fd), &fs) < 0) childFail(sock, kResolve);
  if (fs.f_type == PROC_SUPER_MAGIC) {
    errno = EPERM;
    childFail(sock, kInProc);
  }
  // Reading the source itself, not just reaching it: O_PATH alone needs only search permission on the way.
  if (syscall(SYS_faccessat2, static_cast<int>(fd), "", R_OK, AT_EACCESS | AT_EMPTY_PATH) < 0) {
    childFail(sock, kNotReadable);
  }
  sendReport(sock, kOk, 0, static_cast<int>(fd));
  _exit(0);
}

Error reportError(const std::string& path, const JobCredentials& creds, const Report& r) {
  const std::string who = "uid " + std::to_string(creds.uid);
  switch (r.step) {
    case kDropCredentials:
      return Error::sys(r.err, "mount source " + path + ": switch to the job's user (" + who + ")");
    case kMagicLink:
      return Error(ErrorCode::kInvalidArgument,
                   "mount source " + path +
                       " goes through a /proc magic link (/proc/<pid>/root, /proc/<pid>/cwd, /proc/<pid>/fd/N): "
                       "refused",
                   r.err);
    case kInProc:
      return Error(ErrorCode::kInvalidArgument, "mount source " + path + " is in /proc: refused", r.err);
    case kNotReadable:
    case kResolve:
      if (r.err == ENOENT) {
        return Error(ErrorCode::kNotFound, "mount source " + path + " does not exist on this node", r.err);
      }
      if (r.err == EACCES || r.err == EPERM) {
        return Error(
            ErrorCode::kInvalidArgument,
            "mount source " + path + ": permission denied for " + who +
                (r.step == kNotReadable ? " (the job's user cannot read it)" : " (the job's user cannot reach it)"),
            r.err);
      }
      return Error(ErrorCode::kInvalidArgument, "mount source " + path + ": " + strerror(r.err) + " (as " + who + ")",
                   r.err);
    default:
      return Error::internal("mount source " + path + ": unknown failure in the lookup helper");
  }
}

}  // namespace

Result<UniqueFd> openMountSourceAs(const std::string& path, const JobCredentials& creds) {
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) < 0) return Error::sys(errno, "socketpair");
  UniqueFd ours(pair[0]), theirs(pair[1]);
  pid_t pid = fork();
  if (pid < 0) return Error::sys(errno, "fork the mount source lookup");
  if (pid == 0) child(theirs.get(), path.c_str(), creds);
  theirs.reset();

  auto reap = [pid](bool kill_first) {
    if (kill_first) kill(pid, SIGKILL);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return status;
  };
  pollfd p{ours.get(), POLLIN, 0};
  int ready;
  do {
    ready = poll(&p, 1, kLookupTimeoutMs);
  } while (ready < 0 && errno == EINTR);
  if (ready <= 0) {
    int err = ready < 0 ? errno : ETIMEDOUT;
    reap(true);
    return Error(ErrorCode::kTimeout,
                 "mount source " + path + ": the lookup as uid " + std::to_string(creds.uid) + " did not finish", err);
  }
  Report r{-1, 0};
  iovec iov{&r, sizeof r};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = recvmsg(ours.get(), &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  UniqueFd fd;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int))) {
      int received = -1;
      memcpy(&received, CMSG_DATA(c), sizeof received);
      fd.reset(received);
    }
  }
  int status = reap(false);
  if (n != static_cast<ssize_t>(sizeof r) || (msg.msg_flags & MSG_CTRUNC) != 0) {
    return Error::internal("mount source " + path + ": the lookup helper died without a report");
  }
  if (r.step != kOk) return reportError(path, creds, r);
  if (!fd || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Error::internal("mount source " + path + ": the lookup helper sent no descriptor");
  }
  return fd;
}

}  // namespace dsec::spank
