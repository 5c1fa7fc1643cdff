#include "Spawn.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>

#include "InitProtocol.h"
#include "SpawnProtocol.h"
#include "dsec/common/FdIo.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Process.h"
#include "dsec/common/ProcessLimits.h"
#include "dsec/common/Strings.h"

namespace dsec::backends {
namespace {

namespace sp = spawn_protocol;

constexpr size_t kStackSize = size_t{64} * 1024;
// The spawner answers at once; longer than this means it is wedged, and it is replaced.
constexpr int kReplyTimeoutMs = 30000;

// Blocks every signal in the calling thread for the duration of a spawn: the child inherits the mask, so no
// handler of the agent ever runs on the child's stack.
class SignalBlock {
 public:
  SignalBlock() {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old_);
  }
  ~SignalBlock() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
  SignalBlock(const SignalBlock&) = delete;
  SignalBlock& operator=(const SignalBlock&) = delete;

 private:
  sigset_t old_;
};

// A program started with some of the caller's fds at fixed numbers (0..n-1), everything else closed.
struct ExecChildArgs {
  const char* path;
  char* const* argv;
  const int* fds;  // fds[i] becomes fd i
  int nfds;
  const rlimit* nofile;  // RLIMIT_NOFILE to give the program, or nullptr to keep ours
  int err = 0;
};

int execChild(void* arg) {
  auto* a = static_cast<ExecChildArgs*>(arg);
  // Sources were moved above nfds by the caller, so no dup2 overwrites one still needed.
  for (int i = 0; i < a->nfds; ++i) {
    if (dup2(a->fds[i], i) < 0) {
      a->err = errno;
      _exit(127);
    }
  }
  if (syscall(SYS_close_range, a->nfds, ~0U, 0) < 0) {
    a->err = errno;
    _exit(127);
  }
  // Rlimits are the child's own (not shared with us through CLONE_VM).
  if (a->nofile != nullptr) (void)setrlimit(RLIMIT_NOFILE, a->nofile);
  char* const envp[] = {nullptr};
  execve(a->path, a->argv, envp);
  a->err = errno;
  _exit(127);
}

// Starts path with fds (moved to 0..n-1) as the caller's child, in the caller's namespaces. A vfork-style clone:
// the child shares our memory only until its exec, which happens before anything else can see it.
Result<SpawnedProcess> execWithFds(const std::string& path, std::vector<std::string> args, std::vector<int> fds) {
  std::vector<UniqueFd> high;  // copies above every target number
  for (int& fd : fds) {
    high.emplace_back(fcntl(fd, F_DUPFD_CLOEXEC, 16));
    if (!high.back()) return Error::sys(errno, "dup fds for " + path);
    fd = high.back().get();
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // What the agent raised for itself (ProcessLimits.h) is not handed on to what runs in sandboxes.
  const std::optional<rlimit> nofile = originalFileLimit();
  ExecChildArgs child_args{path.c_str(), argv.data(), fds.data(), static_cast<int>(fds.size()),
                           nofile ? &*nofile : nullptr};
  std::unique_ptr<char[]> stack(new char[kStackSize]);
  int pidfd = -1;
  pid_t pid;
  {
    SignalBlock block;
    pid =
        clone(execChild, stack.get() + kStackSize, CLONE_VM | CLONE_VFORK | CLONE_PIDFD | SIGCHLD, &child_args, &pidfd);
  }
  if (pid < 0) return Error::sys(errno, "start " + path);
  SpawnedProcess out;
  out.pid = pid;
  out.pidfd.reset(pidfd);
  if (child_args.err != 0) {
    siginfo_t info;
    while (waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd), &info, WEXITED) < 0 && errno == EINTR) {
    }
    return Error::sys(child_args.err, "exec " + path);
  }
  return out;
}

void killAndReap(SpawnedProcess& p) {
  if (!p.pidfd) return;
  (void)syscall(SYS_pidfd_send_signal, p.pidfd.get(), SIGKILL, nullptr, 0);
  siginfo_t info;
  while (waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(p.pidfd.get()), &info, WEXITED) < 0 &&
         errno == EINTR) {
  }
  p.pidfd.reset();
}

Status sendToSpawner(int fd, const void* data, size_t len) {
  return sendAll(fd, std::string_view(static_cast<const char*>(data), len), "to the spawner");
}

void appendStrings(std::string* out, const std::vector<std::string>& strings) {
  for (const auto& s : strings) {
    out->append(s);
    out->push_back('\0');
  }
}

}  // namespace

int sandboxSchedPolicy(const SandboxSpec& spec, bool cpu_qos) {
  return cpu_qos && spec.qos == CpuQos::kBatch ? SCHED_IDLE : -1;
}

Result<SpawnedProcess> spawnInitStage(const InitSpawnRequest& request, Spawner* spawner) {
  UniqueFd devnull(open("/dev/null", O_RDWR | O_CLOEXEC));
  if (!devnull) return Error::sys(errno, "open /dev/null");
  std::vector<int> fds = {devnull.get(), devnull.get(), devnull.get(), request.config_fd, request.status_fd};
  if (request.lease_fd >= 0) fds.push_back(request.lease_fd);
  std::vector<std::string> args = {"dsec-sandbox-init",
                                   !request.user_namespace     ? std::string("nouserns")
                                   : request.userns_owner >= 0 ? "userns=" + std::to_string(request.userns_owner)
                                                               : std::string("userns=root"),
                                   request.network_namespace ? "netns" : "hostnet"};
  if (spawner != nullptr) return spawner->startInit(request.init_path, args, fds);
  return execWithFds(request.init_path, std::move(args), std::move(fds));
}

Result<ExecStart> awaitExec(SpawnedCommand& command, double deadline) {
  for (;;) {
    pollfd p{command.status_fd.get(), POLLIN, 0};
    double left = deadline - monotonicSeconds();
    if (left <= 0) return Error(ErrorCode::kTimeout, "the command did not start in time");
    int rc = poll(&p, 1, static_cast<int>(left * 1000) + 1);
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return Error::sys(errno, "poll the command's start");
    if (rc == 0) continue;
    sp::ChildFailure failure{};
    ssize_t n;
    do {
      n = read(command.status_fd.get(), &failure, sizeof failure);
    } while (n < 0 && errno == EINTR);
    command.status_fd.reset();
    if (n == static_cast<ssize_t>(sizeof failure)) {
      return ExecStart{failure.err != 0 ? failure.err : EIO, failure.step};
    }
    return ExecStart{};  // EOF: it exec'd (or died, which its exit status tells)
  }
}

std::string findSpawner() {
  std::vector<std::string> candidates = {selfExeDir() + "/dsec-sandbox-spawner",
                                         selfExeDir() + "/../libexec/dsec/dsec-sandbox-spawner"};
#ifdef DSEC_SANDBOX_SPAWNER_BUILD_PATH
  candidates.push_back(DSEC_SANDBOX_SPAWNER_BUILD_PATH);
#endif
  for (const auto& c : candidates) {
    if (access(c.c_str(), X_OK) == 0) return c;
  }
  return candidates[0];
}

Spawner::Spawner(std::string path, std::vector<sock_filter> seccomp)
    : path_(std::move(path)), seccomp_(std::move(seccomp)) {}

Spawner::~Spawner() {
  std::lock_guard lock(mu_);
  stopLocked();
}

void Spawner::stopLocked() {
  channel_.reset();  // EOF: the spawner exits on its own
  if (process_.pidfd) {
    pollfd p{process_.pidfd.get(), POLLIN, 0};
    if (poll(&p, 1, 2000) == 0) (void)syscall(SYS_pidfd_send_signal, process_.pidfd.get(), SIGKILL, nullptr, 0);
    siginfo_t info;
    while (waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(process_.pidfd.get()), &info, WEXITED) < 0 &&
           errno == EINTR) {
    }
  }
  process_ = SpawnedProcess{};
}

Status Spawner::startLocked() {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) return Error::sys(errno, "socketpair");
  UniqueFd ours(sv[0]), theirs(sv[1]);
  UniqueFd devnull(open("/dev/null", O_RDWR | O_CLOEXEC));
  if (!devnull) return Error::sys(errno, "open /dev/null");
  DSEC_ASSIGN_OR_RETURN(
      SpawnedProcess process,
      execWithFds(path_, {"dsec-sandbox-spawner"}, {devnull.get(), devnull.get(), devnull.get(), theirs.get()}));
  process_ = std::move(process);
  channel_ = std::move(ours);
  if (!cgroup2_dir_.empty()) {
    // Before it starts anything: what it starts must be under the directory's programs from the first.
    Status placed = writeFile(cgroup2_dir_ + "/cgroup.procs", std::to_string(process_.pid));
    if (!placed.ok()) {
      killAndReap(process_);
      channel_.reset();
      return placed.error().wrap("starting " + path_);
    }
  }
  sp::SetupHeader setup{sp::kSetupMagic, static_cast<uint32_t>(seccomp_.size())};
  Status sent = sendToSpawner(channel_.get(), &setup, sizeof setup);
  if (sent.ok()) sent = sendToSpawner(channel_.get(), seccomp_.data(), seccomp_.size() * sizeof(sock_filter));
  if (!sent.ok()) {
    killAndReap(process_);
    channel_.reset();
    return sent.error().wrap("starting " + path_);
  }
  return okStatus();
}

Status Spawner::placeIn(const std::string& cgroup2_dir) {
  std::lock_guard lock(mu_);
  cgroup2_dir_ = cgroup2_dir;
  if (!process_.pidfd) return okStatus();  // placed when it starts
  return writeFile(cgroup2_dir_ + "/cgroup.procs", std::to_string(process_.pid));
}

Result<SpawnedCommand> Spawner::sendLocked(const CommandSpawnRequest& request, const std::string& strings, bool* sent) {
  *sent = false;
  int status[2];
  if (pipe2(status, O_CLOEXEC) < 0) return Error::sys(errno, "pipe");
  UniqueFd status_r(status[0]), status_w(status[1]);

  std::vector<int> fds = {request.init_pidfd, request.stdin_fd, request.stdout_fd, request.stderr_fd, status_w.get()};
  fds.insert(fds.end(), request.procs_fds.begin(), request.procs_fds.end());
  sp::RequestHeader header{};
  header.magic = sp::kRequestMagic;
  header.flags = (request.user_namespace ? static_cast<uint32_t>(sp::kUserNamespace) : 0U) |
                 (request.controlling_tty ? static_cast<uint32_t>(sp::kControllingTty) : 0U);
  header.namespace_flags = request.namespace_flags;
  header.sched_policy = request.sched_policy;
  header.keep_caps = request.keep_caps;
  header.argc = static_cast<uint32_t>(request.argv.size());
  header.envc = static_cast<uint32_t>(request.env.size());
  header.ncandidates = static_cast<uint32_t>(request.candidates.size());
  header.nprocs = static_cast<uint32_t>(request.procs_fds.size());
  header.string_bytes = static_cast<uint32_t>(strings.size());

  DSEC_ASSIGN_OR_RETURN(
      size_t n, sendWithFds(channel_.get(), std::string_view(reinterpret_cast<const char*>(&header), sizeof header),
                            fds, "to the spawner"));
  *sent = true;  // from here the spawner may have started something: no blind retry
  if (n != sizeof header) return Error::internal("short send to the spawner");
  DSEC_TRY(sendToSpawner(channel_.get(), strings.data(), strings.size()));
  status_w.reset();  // the child holds the only write end now

  DSEC_ASSIGN_OR_RETURN(SpawnedProcess child, readReplyLocked("a command in the sandbox"));
  SpawnedCommand out;
  out.pid = child.pid;
  out.pidfd = std::move(child.pidfd);
  out.status_fd = std::move(status_r);
  return out;
}

Result<SpawnedProcess> Spawner::readReplyLocked(const std::string& what) {
  sp::Reply reply{};
  size_t got = 0;
  while (got < sizeof reply) {
    pollfd p{channel_.get(), POLLIN, 0};
    int rc = poll(&p, 1, kReplyTimeoutMs);
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) return Error(ErrorCode::kUnavailable, "the sandbox spawner did not answer");
    ssize_t r = ::read(channel_.get(), reinterpret_cast<char*>(&reply) + got, sizeof reply - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return Error(ErrorCode::kUnavailable, "the sandbox spawner exited");
    got += static_cast<size_t>(r);
  }
  if (reply.pid <= 0) return Error::sys(reply.err != 0 ? reply.err : EIO, "start " + what);
  SpawnedProcess out;
  out.pid = reply.pid;
  // The child is ours (CLONE_PARENT): its pid cannot be reused before we reap it. Without a pidfd nothing would
  // ever watch or reap it: kill it rather than leave it running unsupervised.
  auto pidfd = pidfdOpen(reply.pid);
  if (!pidfd.ok()) {
    ::kill(reply.pid, SIGKILL);
    while (::waitpid(reply.pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    return pidfd.error().wrap("watching " + what);
  }
  out.pidfd = std::move(*pidfd);
  return out;
}

Result<SpawnedProcess> Spawner::sendInitLocked(const std::string& path, const std::vector<std::string>& args,
                                               const std::vector<int>& fds, bool* sent) {
  *sent = false;
  std::string strings;
  appendStrings(&strings, args);
  strings.append(path);
  strings.push_back('\0');
  strings.append("/");
  strings.push_back('\0');
  sp::RequestHeader header{};
  header.magic = sp::kInitRequestMagic;
  header.argc = static_cast<uint32_t>(args.size());
  header.ncandidates = 1;
  header.string_bytes = static_cast<uint32_t>(strings.size());
  header.init_fds = static_cast<uint32_t>(fds.size());
  DSEC_ASSIGN_OR_RETURN(
      size_t n, sendWithFds(channel_.get(), std::string_view(reinterpret_cast<const char*>(&header), sizeof header),
                            fds, "to the spawner"));
  *sent = true;
  if (n != sizeof header) return Error::internal("short send to the spawner");
  DSEC_TRY(sendToSpawner(channel_.get(), strings.data(), strings.size()));
  return readReplyLocked(path);
}

Result<SpawnedProcess> Spawner::startInit(const std::string& path, const std::vector<std::string>& args,
                                          const std::vector<int>& fds) {
  std::lock_guard lock(mu_);
  for (int attempt = 0;; ++attempt) {
    if (!channel_) DSEC_TRY(startLocked());
    bool sent = false;
    auto started = sendInitLocked(path, args, fds, &sent);
    if (started.ok()) return started;
    if (started.error().code() != ErrorCode::kUnavailable && sent) return started;
    DSEC_LOG(kWarn, "container") << "sandbox spawner: " << started.error().message() << "; restarting it";
    stopLocked();
    if (sent || attempt > 0) return started;
  }
}

Result<SpawnedCommand> Spawner::spawn(const CommandSpawnRequest& request) {
  if (request.procs_fds.size() > sp::kMaxProcsFds) return Error::invalid("too many cgroup files");
  std::string strings;
  appendStrings(&strings, request.argv);
  appendStrings(&strings, request.env);
  appendStrings(&strings, request.candidates);
  strings.append(request.cwd);
  strings.push_back('\0');
  if (strings.size() > sp::kMaxStringBytes) return Error::invalid("command line and environment are too long");

  std::lock_guard lock(mu_);
  for (int attempt = 0;; ++attempt) {
    if (!channel_) DSEC_TRY(startLocked());
    bool sent = false;
    auto spawned = sendLocked(request, strings, &sent);
    if (spawned.ok()) return spawned;
    if (spawned.error().code() != ErrorCode::kUnavailable && sent) return spawned;
    // The spawner is gone or wedged: replace it. A request it never received is retried once.
    DSEC_LOG(kWarn, "container") << "sandbox spawner: " << spawned.error().message() << "; restarting it";
    stopLocked();
    if (sent || attempt > 0) return spawned;
  }
}

}  // namespace dsec::backends
