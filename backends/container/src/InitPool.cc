#include "InitPool.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "dsec/common/Logging.h"

namespace dsec::backends {

Result<IdleInit> spawnIdleInit(const std::string& init_path, bool new_net, UniqueFd netns) {
  int config_pipe[2], status_pipe[2];
  if (pipe2(config_pipe, O_CLOEXEC) < 0) return Error::sys(errno, "pipe");
  UniqueFd config_r(config_pipe[0]), config_w(config_pipe[1]);
  if (pipe2(status_pipe, O_CLOEXEC) < 0) return Error::sys(errno, "pipe");
  UniqueFd status_r(status_pipe[0]), status_w(status_pipe[1]);

  InitSpawnRequest req;
  req.init_path = init_path;
  req.namespace_flags = CLONE_NEWPID | CLONE_NEWUTS | CLONE_NEWIPC;
  if (new_net) {
    if (!netns) req.namespace_flags |= CLONE_NEWNET;
    req.netns_fd = netns.get();
  }
  req.config_fd = config_r.get();
  req.status_fd = status_w.get();
  DSEC_ASSIGN_OR_RETURN(SpawnedProcess process, spawnInit(req));
  // init holds the only other ends now: EOF on status_r means it died.
  return IdleInit{std::move(process), std::move(config_w), std::move(status_r)};
}

void discardIdleInit(IdleInit& init) {
  init.config_w.reset();
  if (!init.process.pidfd) return;
  (void)syscall(SYS_pidfd_send_signal, init.process.pidfd.get(), SIGKILL, nullptr, 0);
  siginfo_t info;
  while (waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(init.process.pidfd.get()), &info, WEXITED) < 0 &&
         errno == EINTR) {
  }
  init.process.pidfd.reset();
}

InitPool::InitPool(size_t target, std::string init_path, NetnsPool& netns)
    : target_(target), init_path_(std::move(init_path)), netns_(netns) {}

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

std::optional<IdleInit> InitPool::take() {
  std::lock_guard lock(mu_);
  // Started by the second create, not with the backend: a process that makes at most one sandbox (a CLI
  // run, a layer build) does not pay for inits it never uses and has to kill at exit.
  if (target_ > 0 && !thread_.joinable() && !stop_ && ++takes_ >= 2) thread_ = std::thread([this] { run(); });
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
  for (;;) {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || ready_.size() < target_; });
      if (stop_) return;
    }
    auto init = spawnIdleInit(init_path_, true, netns_.take());
    if (!init.ok()) {
      DSEC_LOG(kWarn, "container") << "init pool: " << init.error().toString() << "; pool disabled";
      return;
    }
    std::lock_guard lock(mu_);
    if (stop_) {
      discardIdleInit(*init);
      return;
    }
    ready_.push_back(std::move(init).value());
  }
}

}  // namespace dsec::backends
