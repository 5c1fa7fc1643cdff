// dsec-sandbox-spawner: starts every command that runs inside a container sandbox (src/SpawnProtocol.h has the
// protocol and why it exists). One per backend, started by the agent on first use; it exits when the agent closes
// its socket or dies.
//
// Static and C-style (no heap, no exceptions): its children are copies of it, and a copy must hold nothing but the
// one request it serves. Buffers are wiped after every request.
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../src/SpawnProtocol.h"

namespace {

namespace proto = dsec::backends::spawn_protocol;

constexpr int kMaxArgs = 65536;
constexpr int kMaxFds = proto::kFixedFds + proto::kMaxProcsFds;

sock_filter g_bpf[proto::kMaxBpfInstructions];
uint32_t g_bpf_len = 0;
char g_strings[proto::kMaxStringBytes + 1];
char* g_argv[kMaxArgs + 1];
char* g_envp[kMaxArgs + 1];
char* g_candidates[kMaxArgs + 1];

// The spawner's own namespaces, which it returns to after every clone (see spawnOne).
struct OwnNamespace {
  int type;
  const char* name;
  int fd;
};
OwnNamespace g_own_ns[] = {{CLONE_NEWPID, "pid", -1}, {CLONE_NEWNS, "mnt", -1},  {CLONE_NEWNET, "net", -1},
                           {CLONE_NEWUTS, "uts", -1}, {CLONE_NEWIPC, "ipc", -1}, {CLONE_NEWCGROUP, "cgroup", -1}};
// The pidfd of a child of ours that never leaves our namespaces (startAnchor): one setns through it takes us back
// to all of them at once, where the fds above take one setns each. -1 when there is none.
int g_anchor_pidfd = -1;

struct Request {
  proto::RequestHeader header;
  int fds[kMaxFds];
  int nfds;
  const char* cwd;
};

bool readFull(int fd, void* buf, size_t len) {
  char* p = static_cast<char*>(buf);
  while (len > 0) {
    ssize_t n = read(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

bool writeFull(int fd, const void* buf, size_t len) {
  const char* p = static_cast<const char*>(buf);
  while (len > 0) {
    ssize_t n = write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

void closeFds(Request& r) {
  for (int i = 0; i < r.nfds; ++i) close(r.fds[i]);
  r.nfds = 0;
}

// Receives the header with its fds; false at EOF (the agent is gone) or on a malformed request.
bool receiveHeader(Request& r) {
  iovec iov = {&r.header, sizeof r.header};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
  msghdr msg;
  memset(&msg, 0, sizeof msg);
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = recvmsg(proto::kChannelFd, &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL);
  } while (n < 0 && errno == EINTR);
  r.nfds = 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count && r.nfds < kMaxFds; ++i)
      memcpy(&r.fds[r.nfds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
  }
  if (n != static_cast<ssize_t>(sizeof r.header) || (msg.msg_flags & MSG_CTRUNC) != 0) return false;
  return r.header.magic == proto::kRequestMagic || r.header.magic == proto::kInitRequestMagic;
}

// Splits count NUL-terminated strings starting at *pos into out; false if they run past end.
bool takeStrings(char** pos, const char* end, uint32_t count, char** out) {
  if (count > kMaxArgs) return false;
  for (uint32_t i = 0; i < count; ++i) {
    char* s = *pos;
    char* nul = static_cast<char*>(memchr(s, '\0', static_cast<size_t>(end - s)));
    if (nul == nullptr) return false;
    out[i] = s;
    *pos = nul + 1;
  }
  out[count] = nullptr;
  return true;
}

bool receiveStrings(Request& r) {
  const proto::RequestHeader& h = r.header;
  if (h.string_bytes > proto::kMaxStringBytes || h.nprocs > proto::kMaxProcsFds) return false;
  if (h.magic == proto::kInitRequestMagic) {
    if (h.nprocs != 0 || h.init_fds == 0 || r.nfds != static_cast<int>(h.init_fds) || h.ncandidates != 1) return false;
  } else if (r.nfds != static_cast<int>(proto::kFixedFds + h.nprocs) || h.init_fds != 0) {
    return false;
  }
  if (!readFull(proto::kChannelFd, g_strings, h.string_bytes)) return false;
  g_strings[h.string_bytes] = '\0';
  char* pos = g_strings;
  const char* end = g_strings + h.string_bytes;
  if (h.argc == 0 || !takeStrings(&pos, end, h.argc, g_argv) || !takeStrings(&pos, end, h.envc, g_envp) ||
      !takeStrings(&pos, end, h.ncandidates, g_candidates)) {
    return false;
  }
  char* cwd[2];
  if (!takeStrings(&pos, end, 1, cwd)) return false;
  r.cwd = cwd[0];
  return pos == end;
}

[[noreturn]] void childFail(int status_fd, int32_t step) {
  proto::ChildFailure f = {step, errno};
  (void)writeFull(status_fd, &f, sizeof f);
  _exit(127);
}

// Into the sandbox cgroup first, while still host root (the files are the host's).
void joinCgroup(const Request& r, int status_fd) {
  for (uint32_t i = 0; i < r.header.nprocs; ++i) {
    if (write(r.fds[proto::kFixedFds + i], "0", 1) != 1) childFail(status_fd, proto::kStepCgroup);
    close(r.fds[proto::kFixedFds + i]);  // host files: not held a moment longer than needed
  }
}

// Keeps only the capabilities in keep_caps: bounding set, ambient set, and effective, permitted and inheritable.
void dropCapabilities(uint64_t keep_caps, int status_fd) {
  for (int cap = 0; cap <= 63; ++cap) {
    if ((keep_caps >> cap) & 1) continue;
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0) {
      if (errno == EINVAL) break;  // past the kernel's last capability
      childFail(status_fd, proto::kStepCaps);
    }
  }
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0) childFail(status_fd, proto::kStepCaps);
  __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2];
  for (int i = 0; i < 2; ++i) {
    auto bits = static_cast<uint32_t>(keep_caps >> (32 * i));
    data[i].effective = bits;
    data[i].permitted = bits;
    data[i].inheritable = bits;
  }
  if (syscall(SYS_capset, &hdr, data) < 0) childFail(status_fd, proto::kStepCaps);
}

// No new privileges, then the sandbox's seccomp filter (when it has one).
void confine(int status_fd) {
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) childFail(status_fd, proto::kStepNoNewPrivs);
  if (g_bpf_len > 0) {
    sock_fprog prog;
    prog.len = static_cast<unsigned short>(g_bpf_len);
    prog.filter = g_bpf;
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) < 0) childFail(status_fd, proto::kStepSeccomp);
  }
}

// Execs the first candidate path that exists; the failure reported is the most telling one (EACCES over a later
// ENOENT, as a shell's PATH search does).
[[noreturn]] void execCandidates(int status_fd) {
  int err = ENOENT;
  bool denied = false;
  for (char* const* c = g_candidates; *c != nullptr; ++c) {
    execve(*c, g_argv, g_envp);
    err = errno;
    if (err == EACCES) {
      denied = true;
    } else if (err != ENOENT && err != ENOTDIR && err != ESTALE && err != ELOOP && err != ENAMETOOLONG) {
      break;
    }
  }
  errno = denied && (err == ENOENT || err == ENOTDIR) ? EACCES : err;
  childFail(status_fd, proto::kStepExec);
}

// The command's side: everything between the clone and the exec.
[[noreturn]] void runChild(const Request& r) {
  const proto::RequestHeader& h = r.header;
  const int init_pidfd = r.fds[0];
  const int status_fd = r.fds[4];
  close(proto::kChannelFd);                        // the agent's channel is no business of the command's
  for (const auto& own : g_own_ns) close(own.fd);  // nor are the node's namespaces
  if (g_anchor_pidfd >= 0) close(g_anchor_pidfd);
  joinCgroup(r, status_fd);
  // The spawner's own OOM protection must not be inherited by sandbox workloads. (This /proc is the one the sandbox's
  // init mounted: nothing inside may mount over it.)
  int oom_fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (oom_fd >= 0) {
    (void)!write(oom_fd, "0", 1);
    close(oom_fd);
  }
  // Born in every other namespace of the sandbox (spawnOne), with its root and cwd at the sandbox's root; the user
  // namespace is the last step: from here on it is the sandbox's root.
  if ((h.flags & proto::kUserNamespace) != 0) {
    if (setns(init_pidfd, CLONE_NEWUSER) < 0) childFail(status_fd, proto::kStepSetns);
    if (setresgid(0, 0, 0) < 0 || setgroups(0, nullptr) < 0 || setresuid(0, 0, 0) < 0) {
      childFail(status_fd, proto::kStepIds);
    }
  }
  // Its own session and process group: a timeout kills the whole group, and nothing of the agent's terminal or
  // job control leaks in.
  if (setsid() < 0) childFail(status_fd, proto::kStepSetsid);
  if (dup2(r.fds[1], 0) < 0 || dup2(r.fds[2], 1) < 0 || dup2(r.fds[3], 2) < 0) childFail(status_fd, proto::kStepFds);
  // A terminal session: the sandbox's pty (the agent opened it inside the sandbox's devpts) becomes the new
  // session's controlling terminal, so ^C and window changes reach its foreground job.
  if ((h.flags & proto::kControllingTty) != 0 && ioctl(0, TIOCSCTTY, 0) < 0) childFail(status_fd, proto::kStepTty);
  umask(022);
  if (chdir(r.cwd) < 0) childFail(status_fd, proto::kStepChdir);
  // The spawner ignores SIGPIPE; every other disposition is the default (it installs no handler), and exec resets
  // handled ones anyway.
  signal(SIGPIPE, SIG_DFL);
  dropCapabilities(h.keep_caps, status_fd);
  confine(status_fd);
  // Batch sandboxes: SCHED_IDLE, inherited by everything the command forks; without CAP_SYS_NICE (dropped above)
  // and with RLIMIT_NICE 0 the command cannot leave it. Set last, so the setup before exec does not wait behind
  // the node's other work.
  if (h.sched_policy >= 0) {
    sched_param param;
    memset(&param, 0, sizeof param);
    if (sched_setscheduler(0, h.sched_policy, &param) < 0) childFail(status_fd, proto::kStepSched);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  execCandidates(status_fd);
}

// Back to our own namespaces of the kinds in flags: all at once through the anchor, else one by one (the anchor
// was killed). Failing that, we would start the next command in the wrong sandbox: stop instead (the agent starts
// a new spawner).
void returnHome(int flags) {
  if (g_anchor_pidfd >= 0 && setns(g_anchor_pidfd, flags) == 0) return;
  for (const auto& own : g_own_ns) {
    if ((flags & own.type) != 0 && setns(own.fd, own.type) < 0) _exit(3);
  }
}

// Starts the anchor: a child that only sleeps, in our namespaces, until we are gone (it sets no handler, blocks
// every signal and holds no fd). It is our own child, not the agent's; -1 when it cannot be had (returnHome then
// uses the namespace fds).
int startAnchor() {
  const pid_t self = getpid();
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // we are single-threaded: this fires when the spawner exits
    if (getppid() != self) _exit(0);   // it already did
    syscall(SYS_close_range, 0, ~0U, 0);
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, nullptr);
    for (;;) pause();
  }
  int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) {
    kill(pid, SIGKILL);
    while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    return -1;
  }
  return pidfd;  // close-on-exec, as every pidfd
}

// Clones the child into the sandbox; returns its pid (in ours) or -errno.
//
// The child appears in the sandbox's pid namespace the moment it is cloned, and root inside may read the /proc files
// of any process it sees that need no ptrace access: net/* (the process's network namespace: interfaces, sockets,
// routes), mountinfo (its mount table), cgroup. So it is born in the sandbox's other namespaces already: we enter
// them (all but the user namespace, which the child joins last) around the clone. Nothing inside sees us meanwhile:
// we live in the node's pid namespace.
int spawnOne(const Request& r) {
  // Only namespaces returnHome knows how to leave: anything else (a user namespace above all) would stay with the
  // spawner for every later command.
  constexpr uint32_t kEnterable = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWCGROUP;
  if ((r.header.namespace_flags & ~kEnterable) != 0) return -EINVAL;
  const int enter = CLONE_NEWPID | r.header.namespace_flags;
  if (setns(r.fds[0], enter) < 0) return -errno;  // all or nothing: still at home
  long pid = syscall(SYS_clone, CLONE_PARENT | SIGCHLD, nullptr, nullptr, nullptr, 0);
  if (pid == 0) runChild(r);
  int err = errno;
  returnHome(enter);
  return pid < 0 ? -err : static_cast<int>(pid);
}

// A sandbox init's side: its fds at 0..n-1, nothing else of ours, every signal blocked (init unblocks what it
// handles), then the exec. A failure is reported on fd 4 as init itself would (InitProtocol.h).
[[noreturn]] void runInitProgram(const Request& r) {
  close(proto::kChannelFd);
  for (const auto& own : g_own_ns) close(own.fd);
  if (g_anchor_pidfd >= 0) close(g_anchor_pidfd);
  int oom_fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (oom_fd >= 0) {
    (void)!write(oom_fd, "0", 1);
    close(oom_fd);
  }
  // Each source above every target number first, so no dup2 overwrites one still needed.
  int high[kMaxFds];
  for (int i = 0; i < r.nfds; ++i) {
    high[i] = fcntl(r.fds[i], F_DUPFD, kMaxFds + 16);
    if (high[i] < 0) _exit(127);
  }
  for (int i = 0; i < r.nfds; ++i) {
    if (dup2(high[i], i) < 0) _exit(127);
  }
  if (syscall(SYS_close_range, r.nfds, ~0U, 0) < 0) _exit(127);
  signal(SIGPIPE, SIG_DFL);
  sigset_t all;
  sigfillset(&all);
  sigprocmask(SIG_SETMASK, &all, nullptr);
  execve(g_candidates[0], g_argv, g_envp);
  const int err = errno;
  char line[64] = "err exec ";
  char digits[16];
  int len = 0;
  for (int v = err; len == 0 || v > 0; v /= 10) digits[len++] = static_cast<char>('0' + v % 10);
  size_t at = strlen(line);
  while (len > 0 && at + 1 < sizeof line) line[at++] = digits[--len];
  line[at] = '\0';
  strncat(line, " exec dsec-sandbox-init\n", sizeof line - strlen(line) - 1);
  if (r.nfds > 4) (void)writeFull(4, line, strlen(line));
  _exit(127);
}

// Starts a sandbox init as the agent's child in our (the host's) namespaces; its pid or -errno.
int startInit(const Request& r) {
  long pid = syscall(SYS_clone, CLONE_PARENT | SIGCHLD, nullptr, nullptr, nullptr, 0);
  if (pid == 0) runInitProgram(r);
  return pid < 0 ? -errno : static_cast<int>(pid);
}

// Reads the setup, then serves requests until the agent closes the channel; returns the exit status.
int serve() {
  proto::SetupHeader setup;
  if (!readFull(proto::kChannelFd, &setup, sizeof setup) || setup.magic != proto::kSetupMagic ||
      setup.bpf_len > proto::kMaxBpfInstructions ||
      !readFull(proto::kChannelFd, g_bpf, setup.bpf_len * sizeof(sock_filter))) {
    return 2;
  }
  g_bpf_len = setup.bpf_len;
  for (;;) {
    Request r;
    memset(&r, 0, sizeof r);
    bool ok = receiveHeader(r);
    if (!ok && r.nfds == 0 && r.header.magic == 0) return 0;  // EOF: the agent closed the channel
    proto::Reply reply = {0, EPROTO};
    if (ok && receiveStrings(r)) {
      int pid = r.header.magic == proto::kInitRequestMagic ? startInit(r) : spawnOne(r);
      reply.pid = pid > 0 ? pid : 0;
      reply.err = pid > 0 ? 0 : -pid;
    } else {
      closeFds(r);
      memset(g_strings, 0, sizeof g_strings);
      return 2;  // a malformed request: the stream is out of step, so stop (the agent starts a new one)
    }
    closeFds(r);
    // What this request said must not be in the next child's copy of us.
    memset(g_strings, 0, r.header.string_bytes + 1);
    if (!writeFull(proto::kChannelFd, &reply, sizeof reply)) return 0;
  }
}

}  // namespace

int main() {
  // Nothing of ours may be read through /proc or ptrace. We go when the agent goes: its end of the channel closes
  // with it. (Not PR_SET_PDEATHSIG: that fires when the agent *thread* that started us ends, and any of its
  // request threads may be the one.)
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  signal(SIGPIPE, SIG_IGN);
  for (auto& own : g_own_ns) {
    char path[64] = "/proc/self/ns/";
    strncat(path, own.name, sizeof path - strlen(path) - 1);
    own.fd = open(path, O_RDONLY | O_CLOEXEC);
    if (own.fd < 0) return 2;
  }
  g_anchor_pidfd = startAnchor();  // before the setup: its copy of our memory holds not even the filter
  int rc = serve();
  // Reaped here rather than left to its death signal: an orphan would be reaped by whoever adopts it, maybe late.
  if (g_anchor_pidfd >= 0) {
    syscall(SYS_pidfd_send_signal, g_anchor_pidfd, SIGKILL, nullptr, 0);
    siginfo_t info;
    while (waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(g_anchor_pidfd), &info, WEXITED) < 0 &&
           errno == EINTR) {
    }
  }
  return rc;
}
