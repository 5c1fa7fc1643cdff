#include "Spawn.h"

#include <fcntl.h>
#include <linux/capability.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace dsec::backends {
namespace {

constexpr size_t kStackSize = size_t{64} * 1024;

// Steps a child can fail at (reported through shared memory: the children share the caller's VM).
enum ChildStep : int {
  kNone = 0,
  kCgroup,
  kDupFds,
  kExecInit,
  kSetns,
  kChroot,
  kCloneCommand,
  kSetsid,
  kChdir,
  kCaps,
  kNoNewPrivs,
  kSeccomp,
  kSched,
  kExec,
};

const char* childStepName(int step) {
  switch (step) {
    case kCgroup:
      return "join cgroup";
    case kDupFds:
      return "set up fds";
    case kExecInit:
      return "exec init";
    case kSetns:
      return "setns into sandbox";
    case kChroot:
      return "chroot into sandbox root";
    case kCloneCommand:
      return "clone command";
    case kSetsid:
      return "setsid";
    case kChdir:
      return "chdir";
    case kCaps:
      return "drop capabilities";
    case kNoNewPrivs:
      return "no_new_privs";
    case kSeccomp:
      return "install seccomp filter";
    case kSched:
      return "set scheduling policy";
    case kExec:
      return "exec";
    default:
      return "unknown step";
  }
}

// Blocks every signal in the calling thread for the duration of a spawn: the children inherit the mask,
// so no handler of the agent ever runs on a child's stack.
class SignalBlock {
 public:
  SignalBlock() {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old_);
  }
  ~SignalBlock() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }

 private:
  sigset_t old_;
};

std::vector<char*> cStrings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (const auto& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

bool joinCgroup(const char* const* files) {
  for (; *files != nullptr; ++files) {
    int fd = open(*files, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return false;
    ssize_t n = write(fd, "0", 1);
    close(fd);
    if (n != 1) return false;
  }
  return true;
}

// ---- init ----

struct InitChildArgs {
  const char* init_path;
  const char* const* procs_files;
  char* const* argv;
  char* const* envp;
  int config_fd, status_fd, devnull_fd, netns_fd;
  std::atomic<int> step{kNone};
  std::atomic<int> err{0};
};

int initChild(void* arg) {
  auto* a = static_cast<InitChildArgs*>(arg);
  if (!joinCgroup(a->procs_files)) {
    a->err = errno;
    a->step = kCgroup;
    _exit(127);
  }
  if (a->netns_fd >= 0 && setns(a->netns_fd, CLONE_NEWNET) < 0) {
    a->err = errno;
    a->step = kSetns;
    _exit(127);
  }
  if (dup2(a->devnull_fd, 0) < 0 || dup2(a->devnull_fd, 1) < 0 || dup2(a->devnull_fd, 2) < 0 ||
      dup2(a->config_fd, 3) < 0 || dup2(a->status_fd, 4) < 0 || syscall(SYS_close_range, 5, ~0U, 0) < 0) {
    a->err = errno;
    a->step = kDupFds;
    _exit(127);
  }
  execve(a->init_path, a->argv, a->envp);
  a->err = errno;
  a->step = kExecInit;
  _exit(127);
}

// ---- exec ----

struct CommandChildArgs {
  const int* procs_fds;  // opened by the parent on the host, -1 terminated
  int stdin_fd, stdout_fd, stderr_fd;
  const char* cwd;
  char* const* argv;
  char* const* envp;
  const char* const* candidates;
  sock_fprog prog;
  uint64_t keep_caps;
  int sched_policy;
  std::atomic<int> step{kNone};
  std::atomic<int> err{0};
};

[[noreturn]] void commandFail(CommandChildArgs* a, int step) {
  a->err = errno;
  a->step = step;
  _exit(127);
}

int commandChild(void* arg) {
  auto* a = static_cast<CommandChildArgs*>(arg);
  // Joins the sandbox cgroup through fds the parent opened on the host (the paths are not visible here).
  for (const int* fd = a->procs_fds; *fd >= 0; ++fd) {
    if (write(*fd, "0", 1) != 1) commandFail(a, kCgroup);
  }
  // Its own session and process group: a timeout kills the whole group, and nothing of the agent's
  // terminal or job control leaks in.
  if (setsid() < 0) commandFail(a, kSetsid);
  if (dup2(a->stdin_fd, 0) < 0 || dup2(a->stdout_fd, 1) < 0 || dup2(a->stderr_fd, 2) < 0 ||
      syscall(SYS_close_range, 3, ~0U, 0) < 0) {
    commandFail(a, kDupFds);
  }
  umask(022);
  if (chdir(a->cwd) < 0) commandFail(a, kChdir);
  // The agent's own OOM protection (if any) must not be inherited by sandbox workloads.
  int oom_fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (oom_fd >= 0) {
    (void)!write(oom_fd, "0", 1);
    close(oom_fd);
  }
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigaction(sig, &sa, nullptr);  // fails harmlessly for the signals libc reserves
  }
  // Batch sandboxes: SCHED_IDLE, inherited by everything the command forks; without CAP_SYS_NICE (dropped
  // below) and with RLIMIT_NICE 0 the command cannot leave it.
  if (a->sched_policy >= 0) {
    sched_param param{};
    if (sched_setscheduler(0, a->sched_policy, &param) < 0) commandFail(a, kSched);
  }
  for (int cap = 0; cap <= 63; ++cap) {
    if ((a->keep_caps >> cap) & 1) continue;
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0) {
      if (errno == EINVAL) break;  // past the kernel's last capability
      commandFail(a, kCaps);
    }
  }
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0) commandFail(a, kCaps);
  __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2];
  for (int i = 0; i < 2; ++i) {
    auto bits = static_cast<uint32_t>(a->keep_caps >> (32 * i));
    data[i].effective = bits;
    data[i].permitted = bits;
    data[i].inheritable = bits;
  }
  if (syscall(SYS_capset, &hdr, data) < 0) commandFail(a, kCaps);
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) commandFail(a, kNoNewPrivs);
  if (a->prog.len > 0 && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &a->prog, 0, 0) < 0) {
    commandFail(a, kSeccomp);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  int err = ENOENT;
  bool denied = false;
  for (const char* const* c = a->candidates; *c != nullptr; ++c) {
    execve(*c, a->argv, a->envp);
    err = errno;
    if (err == EACCES) {
      denied = true;
    } else if (err != ENOENT && err != ENOTDIR && err != ESTALE && err != ELOOP && err != ENAMETOOLONG) {
      break;
    }
  }
  errno = denied && (err == ENOENT || err == ENOTDIR) ? EACCES : err;
  commandFail(a, kExec);
}

void reap(pid_t pid) {
  while (waitpid(pid, nullptr, __WALL) < 0 && errno == EINTR) {
  }
}

// The namespaces, root and cwd a thread returns to after entering a sandbox to spawn a command there.
// Entering from the calling thread (instead of from a helper process that then forks the command) saves a
// process and two context switches per exec. It needs the thread's own fs_struct (setns(CLONE_NEWNS) and
// chroot act on it): unshare(CLONE_FS) before each entry, a no-op unless a thread created since shares it
// (pthread_create shares the creator's). The agent never changes its cwd, so the thread keeps seeing the
// same files as the rest of the process.
struct ThreadHome {
  bool ready = false;
  UniqueFd root, cwd;
  std::array<UniqueFd, 6> ns;
};
constexpr int kHomeNsFlags[6] = {CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWCGROUP, CLONE_NEWPID};
constexpr const char* kHomeNsNames[6] = {"mnt", "uts", "ipc", "net", "cgroup", "pid"};
thread_local ThreadHome t_home;

Status prepareThreadHome() {
  if (t_home.ready) return okStatus();
  ThreadHome home;
  home.root.reset(open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
  home.cwd.reset(open(".", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!home.root || !home.cwd) return Error::sys(errno, "open root and cwd of the spawning thread");
  for (int i = 0; i < 6; ++i) {
    // thread-self: another thread of the agent may be inside a sandbox right now.
    home.ns[i].reset(open((std::string("/proc/thread-self/ns/") + kHomeNsNames[i]).c_str(), O_RDONLY | O_CLOEXEC));
    if (!home.ns[i]) return Error::sys(errno, std::string("open namespace ") + kHomeNsNames[i]);
  }
  t_home = std::move(home);
  t_home.ready = true;
  return okStatus();
}

// Puts the calling thread back into its own namespaces, root and cwd. A thread that cannot go back would
// run the agent's later work inside a sandbox: that must never happen, so it ends the process instead.
void returnHome(int entered_flags) {
  for (int i = 0; i < 6; ++i) {
    if ((entered_flags & kHomeNsFlags[i]) == 0) continue;
    if (setns(t_home.ns[i].get(), kHomeNsFlags[i]) < 0) {
      fprintf(stderr, "dsec: cannot leave sandbox %s namespace: %s\n", kHomeNsNames[i], strerror(errno));
      abort();
    }
  }
  if (fchdir(t_home.root.get()) < 0 || chroot(".") < 0 || fchdir(t_home.cwd.get()) < 0) {
    fprintf(stderr, "dsec: cannot restore root of the spawning thread: %s\n", strerror(errno));
    abort();
  }
}

}  // namespace

int sandboxSchedPolicy(const SandboxSpec& spec, bool cpu_qos) {
  return cpu_qos && spec.qos == CpuQos::kBatch ? SCHED_IDLE : -1;
}

Result<SpawnedProcess> spawnInit(const InitSpawnRequest& request) {
  UniqueFd devnull(open("/dev/null", O_RDWR | O_CLOEXEC));
  if (!devnull) return Error::sys(errno, "open /dev/null");
  // dup2 onto 0..4 must never find its source already sitting there: move the sources above.
  UniqueFd config(fcntl(request.config_fd, F_DUPFD_CLOEXEC, 10));
  UniqueFd status(fcntl(request.status_fd, F_DUPFD_CLOEXEC, 10));
  UniqueFd null_high(fcntl(devnull.get(), F_DUPFD_CLOEXEC, 10));
  if (!config || !status || !null_high) return Error::sys(errno, "dup fds for init");

  std::vector<std::string> argv_s = {"dsec-sandbox-init"};
  std::vector<std::string> env_s;
  auto argv = cStrings(argv_s);
  auto envp = cStrings(env_s);
  std::vector<const char*> procs;
  for (const auto& f : request.procs_files) procs.push_back(f.c_str());
  procs.push_back(nullptr);

  InitChildArgs args;
  args.init_path = request.init_path.c_str();
  args.procs_files = procs.data();
  args.argv = argv.data();
  args.envp = envp.data();
  args.config_fd = config.get();
  args.status_fd = status.get();
  args.devnull_fd = null_high.get();
  args.netns_fd = request.netns_fd;

  // On the heap, not the caller's stack: the agent may run this on a small (coroutine) stack.
  std::unique_ptr<char[]> stack_mem(new char[kStackSize]);
  char* stack = stack_mem.get();
  int pidfd = -1;
  pid_t pid;
  {
    SignalBlock block;
    pid = clone(initChild, stack + kStackSize, CLONE_VM | CLONE_VFORK | CLONE_PIDFD | request.namespace_flags | SIGCHLD,
                &args, &pidfd);
  }
  if (pid < 0) return Error::sys(errno, "clone init");
  SpawnedProcess out;
  out.pid = pid;
  out.pidfd.reset(pidfd);
  if (args.step != kNone) {
    reap(pid);
    return Error::sys(args.err, std::string(childStepName(args.step)) + " (" + request.init_path + ")");
  }
  return out;
}

Result<SpawnedCommand> spawnCommand(const CommandSpawnRequest& request) {
  DSEC_TRY(prepareThreadHome());
  UniqueFd in(fcntl(request.stdin_fd, F_DUPFD_CLOEXEC, 10));
  UniqueFd out(fcntl(request.stdout_fd, F_DUPFD_CLOEXEC, 10));
  UniqueFd err(fcntl(request.stderr_fd, F_DUPFD_CLOEXEC, 10));
  if (!in || !out || !err) return Error::sys(errno, "dup fds for exec");
  std::vector<UniqueFd> procs;
  std::vector<int> procs_fds;
  for (const auto& f : request.procs_files) {
    procs.emplace_back(open(f.c_str(), O_WRONLY | O_CLOEXEC));
    if (!procs.back()) return Error::sys(errno, "open " + f);
    procs_fds.push_back(procs.back().get());
  }
  procs_fds.push_back(-1);

  auto argv = cStrings(request.argv);
  auto envp = cStrings(request.env);
  std::vector<const char*> candidates;
  for (const auto& c : request.candidates) candidates.push_back(c.c_str());
  candidates.push_back(nullptr);

  std::unique_ptr<char[]> stack(new char[kStackSize]);
  CommandChildArgs args;
  args.procs_fds = procs_fds.data();
  args.stdin_fd = in.get();
  args.stdout_fd = out.get();
  args.stderr_fd = err.get();
  args.cwd = request.cwd.c_str();
  args.argv = argv.data();
  args.envp = envp.data();
  args.candidates = candidates.data();
  args.prog.len = request.seccomp ? static_cast<unsigned short>(request.seccomp->size()) : 0;
  args.prog.filter = request.seccomp ? const_cast<sock_filter*>(request.seccomp->data()) : nullptr;
  args.keep_caps = request.keep_caps;
  args.sched_policy = request.sched_policy;

  pid_t child;
  int pidfd = -1;
  int clone_errno = 0;
  {
    SignalBlock block;
    // One setns through the init's pidfd joins every namespace at once (or none on failure); the pid
    // namespace applies to the children of this thread only. Then the sandbox root becomes this thread's
    // root, and the command is cloned straight into all of it.
    if (unshare(CLONE_FS) < 0) return Error::sys(errno, "unshare fs of the spawning thread");
    if (setns(request.init_pidfd, request.namespace_flags) < 0) return Error::sys(errno, childStepName(kSetns));
    if (fchdir(request.root_fd) < 0 || chroot(".") < 0) {
      int e = errno;
      returnHome(request.namespace_flags);
      return Error::sys(e, childStepName(kChroot));
    }
    child =
        clone(commandChild, stack.get() + kStackSize, CLONE_VM | CLONE_VFORK | CLONE_PIDFD | SIGCHLD, &args, &pidfd);
    clone_errno = errno;
    returnHome(request.namespace_flags);
  }
  if (child < 0) return Error::sys(clone_errno, childStepName(kCloneCommand));
  SpawnedCommand result;
  result.pid = child;
  result.pidfd.reset(pidfd);
  int step = args.step;
  if (step != kNone) {
    reap(child);
    if (step == kExec) {
      SpawnedCommand failed;
      failed.exec_errno = args.err != 0 ? args.err.load() : ENOENT;
      return failed;
    }
    Error e = Error::sys(args.err, childStepName(step));
    if (step == kChdir) return Error(ErrorCode::kInvalidArgument, "cwd " + request.cwd + ": " + e.message());
    return e;
  }
  return result;
}

}  // namespace dsec::backends
