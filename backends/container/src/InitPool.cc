#include "InitPool.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>

#include "InitProtocol.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"

namespace dsec::backends {

namespace {

// Generous: on a loaded machine starting init and its namespaces has taken a few hundred milliseconds.
constexpr double kHandshakeSeconds = 30;

}  // namespace

Result<std::string> readStatusLine(int fd, double deadline, std::string& buffered) {
  size_t end;
  while ((end = buffered.find('\n')) == std::string::npos) {
    if (buffered.size() > 4096) return Error(ErrorCode::kSystem, "sandbox init sent a bad status");
    double left = deadline - monotonicSeconds();
    if (left <= 0) return Error(ErrorCode::kTimeout, "sandbox init did not start in time");
    pollfd p{fd, POLLIN, 0};
    int rc = poll(&p, 1, static_cast<int>(left * 1000) + 1);
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return Error::sys(errno, "poll init status");
    if (rc == 0) continue;
    char chunk[512];
    ssize_t n = read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error::sys(errno, "read init status");
    if (n == 0) {
      return Error(ErrorCode::kSystem,
                   "sandbox init exited while starting" + (buffered.empty() ? "" : ": " + buffered));
    }
    buffered.append(chunk, static_cast<size_t>(n));
  }
  std::string line = buffered.substr(0, end);
  buffered.erase(0, end + 1);
  // "err STEP ERRNO MESSAGE"
  if (startsWith(line, "err ")) {
    auto parts = split(line, ' ');
    int err = parts.size() > 2 ? atoi(parts[2].c_str()) : 0;
    std::string text = "sandbox init step " + (parts.size() > 1 ? parts[1] : std::string("?"));
    if (parts.size() > 3) text += ": " + line.substr(parts[0].size() + parts[1].size() + parts[2].size() + 3);
    if (err != 0) text += ": " + std::string(strerror(err));
    return Error(ErrorCode::kSystem, text, err);
  }
  return line;
}

namespace {

void reapStage(SpawnedProcess& stage) {
  siginfo_t info;
  while (waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(stage.pidfd.get()), &info, WEXITED) < 0 &&
         errno == EINTR) {
  }
  stage.pidfd.reset();
}

}  // namespace

Result<IdleInit> spawnIdleInit(const InitKind& kind) {
  int config_pair[2], status_pipe[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, config_pair) < 0) return Error::sys(errno, "socketpair");
  UniqueFd config(config_pair[0]), config_init(config_pair[1]);
  if (pipe2(status_pipe, O_CLOEXEC) < 0) return Error::sys(errno, "pipe");
  UniqueFd status_r(status_pipe[0]), status_w(status_pipe[1]);
  std::optional<IdRangeLease> lease;
  if (kind.id_ranges != nullptr) {
    DSEC_ASSIGN_OR_RETURN(lease, kind.id_ranges->acquire());
  }

  InitSpawnRequest req;
  req.init_path = kind.init_path;
  req.user_namespace = lease.has_value();
  req.userns_owner = lease && !kind.userns_owned_by_root ? static_cast<int64_t>(lease->host_base) : -1;
  req.network_namespace = kind.network_namespace;
  req.config_fd = config_init.get();
  req.status_fd = status_w.get();
  req.lease_fd = lease ? lease->init_fd.get() : -1;
  DSEC_ASSIGN_OR_RETURN(SpawnedProcess stage, spawnInitStage(req, kind.spawner));
  // Init holds the other ends now (and its lease fd): EOF on status_r means it died. Our hold on the range stays
  // with the sandbox until its processes are gone.
  config_init.reset();
  status_w.reset();
  if (lease) lease->init_fd.reset();  // init's alone
  auto fail = [&](const Error& e) {
    (void)syscall(SYS_pidfd_send_signal, stage.pidfd.get(), SIGKILL, nullptr, 0);
    reapStage(stage);
    return e.wrap("starting a sandbox init");
  };

  const double deadline = monotonicSeconds() + kHandshakeSeconds;
  std::string status_read;
  if (lease) {
    auto line = readStatusLine(status_r.get(), deadline, status_read);
    if (!line.ok()) return fail(line.error());
    if (*line != "userns") return fail(Error::internal("sandbox init sent '" + *line + "' instead of userns"));
    if (auto mapped = writeIdMaps(stage.pid, lease->host_base); !mapped.ok()) return fail(mapped.error());
    const char byte = init_protocol::kMappedByte;
    if (::send(config.get(), &byte, 1, MSG_NOSIGNAL) != 1) return fail(Error::sys(errno, "release sandbox init"));
  }
  auto line = readStatusLine(status_r.get(), deadline, status_read);
  if (!line.ok()) return fail(line.error());
  pid_t pid = startsWith(*line, "init ") ? static_cast<pid_t>(atoi(line->c_str() + 5)) : 0;
  if (pid <= 1) return fail(Error::internal("sandbox init sent '" + *line + "' instead of its pid"));
  reapStage(stage);

  IdleInit out;
  out.process.pid = pid;
  // PID 1 of the sandbox is our child (CLONE_PARENT): its pid stays ours until we reap it.
  auto pidfd = pidfdOpen(pid);
  if (!pidfd.ok()) {  // unwatched, it would never be reaped (and would hold its id range): end it here
    ::kill(pid, SIGKILL);
    while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    return pidfd.error().wrap("starting a sandbox init");
  }
  out.process.pidfd = std::move(*pidfd);
  out.config = std::move(config);
  out.status_r = std::move(status_r);
  out.status_read = std::move(status_read);
  if (lease) {
    out.host_base = lease->host_base;
    out.lease = std::move(lease->hold);
    out.userns.reset(open(("/proc/" + std::to_string(pid) + "/ns/user").c_str(), O_RDONLY | O_CLOEXEC));
    if (!out.userns) {
      Error e = Error::sys(errno, "open the sandbox's user namespace");
      discardIdleInit(out);
      return e;
    }
  }
  return out;
}

void discardIdleInit(IdleInit& init) {
  init.config.reset();
  if (init.process.pidfd) {
    (void)syscall(SYS_pidfd_send_signal, init.process.pidfd.get(), SIGKILL, nullptr, 0);
    reapStage(init.process);
  }
  init.lease.reset();  // reaped: nothing of its pid namespace is left
}

InitPool::InitPool(size_t target, InitKind kind) : target_(target), kind_(std::move(kind)) {}

InitPool::~InitPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // All signals first, then the waits: the inits die in parallel.
  for (auto& init : ready_) {
    if (init.process.pidfd) (void)syscall(SYS_pidfd_send_signal, init.process.pidfd.get(), SIGKILL, nullptr, 0);
  }
  for (auto& init : ready_) discardIdleInit(init);
}

std::optional<IdleInit> InitPool::takeInFlight(double wait_seconds) {
  std::unique_lock lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_seconds);
  for (;;) {
    if (auto init = popReadyLocked()) return init;
    if (stop_ || !spawning_) return std::nullopt;  // nothing on its way
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && ready_.empty()) return std::nullopt;
  }
}

std::optional<IdleInit> InitPool::take() {
  std::lock_guard lock(mu_);
  // Started by the second create, not with the backend: a process that makes at most one sandbox (a CLI
  // run, a layer build) does not pay for inits it never uses and has to kill at exit.
  if (target_ > 0 && !thread_.joinable() && !stop_ && ++takes_ >= 2) thread_ = std::thread([this] { run(); });
  return popReadyLocked();
}

std::optional<IdleInit> InitPool::popReadyLocked() {
  // An init that died while waiting (killed from outside) is dropped here rather than failing a create.
  while (!ready_.empty()) {
    IdleInit init = std::move(ready_.front());
    ready_.pop_front();
    cv_.notify_all();
    pollfd p{init.process.pidfd.get(), POLLIN, 0};
    if (poll(&p, 1, 0) == 0) return init;
    discardIdleInit(init);
  }
  return std::nullopt;
}

void InitPool::run() {
  // A failure may pass (a node at its open-files limit or out of id ranges frees some as sandboxes go): creates
  // start their own inits meanwhile, and the pool tries again later, less often the longer it keeps failing.
  double backoff_seconds = 0.5;
  std::string last_failure;
  for (;;) {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || ready_.size() < target_; });
      if (stop_) return;
      spawning_ = true;
    }
    auto init = spawnIdleInit(kind_);
    if (!init.ok()) {
      {
        std::lock_guard lock(mu_);
        spawning_ = false;
      }
      cv_.notify_all();  // a create waiting in takeInFlight gives up
      if (init.error().message() != last_failure) {
        last_failure = init.error().message();
        DSEC_LOG(kWarn, "container") << "init pool: " << init.error().toString() << "; trying again later";
      }
      std::unique_lock lock(mu_);
      cv_.wait_for(lock, std::chrono::duration<double>(backoff_seconds), [&] { return stop_; });
      if (stop_) return;
      backoff_seconds = std::min(backoff_seconds * 2, 30.0);
      continue;
    }
    backoff_seconds = 0.5;
    last_failure.clear();
    std::lock_guard lock(mu_);
    spawning_ = false;  // in the same step as the push: a waiting create sees the init, or that none is coming
    cv_.notify_all();
    if (stop_) {
      discardIdleInit(*init);
      return;
    }
    ready_.push_back(std::move(init).value());
  }
}

}  // namespace dsec::backends
