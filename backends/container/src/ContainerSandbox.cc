#include "ContainerSandbox.h"

#include <linux/capability.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <string_view>

#include "SandboxFiles.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"

namespace dsec::backends {

uint64_t defaultSandboxCaps() {
  // Docker's default set without CAP_MKNOD: there is no device cgroup here to stop a device node of the
  // host disk from being created and opened.
  constexpr int kCaps[] = {CAP_CHOWN,      CAP_DAC_OVERRIDE, CAP_FSETID,     CAP_FOWNER,  CAP_NET_RAW,
                           CAP_SETGID,     CAP_SETUID,       CAP_SETFCAP,    CAP_SETPCAP, CAP_NET_BIND_SERVICE,
                           CAP_SYS_CHROOT, CAP_KILL,         CAP_AUDIT_WRITE};
  uint64_t bits = 0;
  for (int c : kCaps) bits |= 1ULL << c;
  return bits;
}

std::vector<std::string> cgroupJoinFiles(const Cgroup& cgroup) {
  constexpr std::string_view kProcs = "/cgroup.procs";
  std::vector<std::string> files = cgroup.procsFiles();
  for (auto& f : files) {
    if (f.size() <= kProcs.size() || f.compare(f.size() - kProcs.size(), kProcs.size(), kProcs) != 0) continue;
    std::string tasks = f.substr(0, f.size() - kProcs.size()) + "/tasks";
    if (access(tasks.c_str(), W_OK) == 0) f = std::move(tasks);
  }
  return files;
}

Status killAndWaitInit(InitProcess& init, double timeout_seconds) {
  if (!init.pidfd) return okStatus();
  if (syscall(SYS_pidfd_send_signal, init.pidfd.get(), SIGKILL, nullptr, 0) < 0 && errno != ESRCH) {
    return Error::sys(errno, "kill sandbox init");
  }
  pollfd p{init.pidfd.get(), POLLIN, 0};
  int rc;
  do {
    rc = poll(&p, 1, static_cast<int>(timeout_seconds * 1000));
  } while (rc < 0 && errno == EINTR);
  if (rc == 0) return Error(ErrorCode::kTimeout, "sandbox init " + std::to_string(init.pid) + " did not exit");
  if (init.is_child) {
    siginfo_t info;
    while (waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(init.pidfd.get()), &info, WEXITED) < 0 &&
           errno == EINTR) {
    }
  }
  init.pidfd.reset();
  return okStatus();
}

nlohmann::json specToJson(const SandboxSpec& spec) {
  return {{"id", spec.id},
          {"image", spec.image},
          {"lower_dirs", spec.lower_dirs},
          {"memory_bytes", spec.memory_bytes},
          {"cpus", spec.cpus},
          {"pids", spec.pids},
          {"disk_bytes", spec.disk_bytes},
          {"env", spec.env},
          {"network", spec.network == NetworkMode::kHost ? "host" : "none"},
          {"upper_dir", spec.upper_dir}};
}

Result<SandboxSpec> specFromJson(const nlohmann::json& j) {
  try {
    SandboxSpec s;
    s.id = j.at("id").get<std::string>();
    s.image = j.value("image", "");
    s.lower_dirs = j.at("lower_dirs").get<std::vector<std::string>>();
    s.memory_bytes = j.value("memory_bytes", int64_t{0});
    s.cpus = j.value("cpus", 0.0);
    s.pids = j.value("pids", int64_t{0});
    s.disk_bytes = j.value("disk_bytes", int64_t{0});
    s.env = j.value("env", std::map<std::string, std::string>{});
    s.network = j.value("network", "none") == "host" ? NetworkMode::kHost : NetworkMode::kNone;
    s.upper_dir = j.value("upper_dir", "");
    return s;
  } catch (const nlohmann::json::exception& e) {
    return Error::invalid(std::string("bad sandbox spec in state: ") + e.what());
  }
}

ContainerSandbox::ContainerSandbox(std::shared_ptr<ContainerShared> shared, SandboxSpec spec, InitProcess init,
                                   UniqueFd root_fd, std::unique_ptr<Cgroup> cgroup, bool paused, int64_t oom_kills)
    : shared_(std::move(shared)),
      spec_(std::move(spec)),
      init_(std::move(init)),
      root_fd_(std::move(root_fd)),
      cgroup_(std::move(cgroup)),
      procs_files_(cgroupJoinFiles(*cgroup_)),
      state_(paused ? SandboxState::kPaused : SandboxState::kRunning),
      oom_seen_(oom_kills) {}

// Dropping the handle does not destroy the sandbox: it keeps running for a restarted agent to adopt.
ContainerSandbox::~ContainerSandbox() {
  {
    std::unique_lock lock(mu_);
    idle_.wait(lock, [&] { return users_ == 0; });
  }
  std::lock_guard lock(shared_->mu);
  shared_->live.erase(spec_.id);  // without a handle it counts as a leftover for listLeftovers()
}

ContainerSandbox::Use::~Use() {
  if (sb_ == nullptr) return;
  std::lock_guard lock(sb_->mu_);
  if (--sb_->users_ == 0) sb_->idle_.notify_all();
}

Result<ContainerSandbox::Use> ContainerSandbox::acquire(bool need_running) {
  std::lock_guard lock(mu_);
  if (destroyed_) return Error::notFound("sandbox " + spec_.id + " is destroyed");
  if (need_running && state_ == SandboxState::kPaused) {
    return Error(ErrorCode::kConflict, "sandbox " + spec_.id + " is paused");
  }
  ++users_;
  return Use(this);
}

SandboxState ContainerSandbox::state() const {
  std::lock_guard lock(mu_);
  if (destroyed_) return SandboxState::kStopped;
  if (init_.pidfd) {
    pollfd p{init_.pidfd.get(), POLLIN, 0};
    if (poll(&p, 1, 0) == 1) return SandboxState::kStopped;  // init died: the sandbox is gone
  }
  return state_;
}

Result<ExecResult> ContainerSandbox::exec(const ExecRequest& request) { return run(request, nullptr); }

Result<ExecResult> ContainerSandbox::execStream(const ExecRequest& request, ExecSink& sink) {
  return run(request, &sink);
}

Result<UniqueFd> ContainerSandbox::openForRead(const std::string& path) {
  DSEC_ASSIGN_OR_RETURN(Use use, acquire(false));
  return sandboxOpenForRead(root_fd_.get(), path);
}

Result<UniqueFd> ContainerSandbox::openForWrite(const std::string& path, uint32_t mode) {
  DSEC_ASSIGN_OR_RETURN(Use use, acquire(false));
  return sandboxOpenForWrite(root_fd_.get(), path, mode);
}

Result<FileStat> ContainerSandbox::stat(const std::string& path) {
  DSEC_ASSIGN_OR_RETURN(Use use, acquire(false));
  return sandboxStat(root_fd_.get(), path);
}

Result<std::vector<FileStat>> ContainerSandbox::listDir(const std::string& path) {
  DSEC_ASSIGN_OR_RETURN(Use use, acquire(false));
  return sandboxListDir(root_fd_.get(), path);
}

Status ContainerSandbox::remove(const std::string& path, bool recursive) {
  DSEC_ASSIGN_OR_RETURN(Use use, acquire(false));
  return sandboxRemove(root_fd_.get(), path, recursive);
}

Status ContainerSandbox::pause() {
  std::lock_guard lock(mu_);
  if (destroyed_) return Error::notFound("sandbox " + spec_.id + " is destroyed");
  if (state_ == SandboxState::kPaused) return okStatus();
  Status s = cgroup_->freeze();
  if (!s.ok()) return s.error().wrap("pause " + spec_.id);
  state_ = SandboxState::kPaused;
  return okStatus();
}

Status ContainerSandbox::resume() {
  std::lock_guard lock(mu_);
  if (destroyed_) return Error::notFound("sandbox " + spec_.id + " is destroyed");
  if (state_ == SandboxState::kRunning) return okStatus();
  Status s = cgroup_->thaw();
  if (!s.ok()) return s.error().wrap("resume " + spec_.id);
  state_ = SandboxState::kRunning;
  return okStatus();
}

Status ContainerSandbox::reclaimMemory() {
  DSEC_ASSIGN_OR_RETURN(Use use, acquire(false));
  return cgroup_->reclaim();
}

Status ContainerSandbox::destroy() {
  bool was_paused;
  {
    std::lock_guard lock(mu_);
    if (destroyed_) return okStatus();
    destroyed_ = true;
    was_paused = state_ == SandboxState::kPaused;
    state_ = SandboxState::kStopped;
  }
  // SIGKILL to the init makes the kernel kill its whole pid namespace; running execs see their command die
  // and return. A frozen task cannot die, so thaw after the signal is queued.
  if (init_.pidfd) (void)syscall(SYS_pidfd_send_signal, init_.pidfd.get(), SIGKILL, nullptr, 0);
  if (was_paused) (void)cgroup_->thaw();
  Status killed = killAndWaitInit(init_, 10);
  {
    std::unique_lock lock(mu_);
    idle_.wait(lock, [&] { return users_ == 0; });
  }
  root_fd_.reset();  // the last reference to the overlay and its upper: the memory goes back now
  // Normally the namespace died with its init and the cgroup is empty already; killAll (a freeze/kill/thaw
  // cycle on v1, which patches kernel text on every freeze) is only for stragglers.
  auto left = cgroup_->pids();
  Status emptied = left.ok() && left->empty() ? okStatus() : cgroup_->killAll();
  Status removed = cgroup_->remove();
  {
    std::lock_guard lock(shared_->mu);
    shared_->live.erase(spec_.id);
  }
  if (!killed.ok()) return killed.error().wrap("destroy " + spec_.id);
  if (!emptied.ok()) return emptied.error().wrap("destroy " + spec_.id);
  if (!removed.ok()) return removed.error().wrap("destroy " + spec_.id);
  DSEC_LOG(kDebug, "container") << "destroyed " << spec_.id;
  return okStatus();
}

Result<SandboxUsage> ContainerSandbox::usage() {
  DSEC_ASSIGN_OR_RETURN(Use use, acquire(false));
  DSEC_ASSIGN_OR_RETURN(CgroupStats st, cgroup_->stats());
  SandboxUsage u;
  u.memory_bytes = st.memory_current;
  u.pids = st.pids_current;
  u.cpu_usec = st.cpu_usage_usec;
  u.oom_kills = st.oom_kills;
  return u;
}

nlohmann::json ContainerSandbox::persistentState() const {
  std::lock_guard lock(mu_);
  return {{"backend", "container"},    {"id", spec_.id},
          {"init_pid", init_.pid},     {"init_start_time", init_.start_time},
          {"cgroup", cgroup_->name()}, {"paused", state_ == SandboxState::kPaused},
          {"spec", specToJson(spec_)}};
}

}  // namespace dsec::backends
