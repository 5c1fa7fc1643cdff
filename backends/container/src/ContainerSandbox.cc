#include "ContainerSandbox.h"

#include <fcntl.h>
#include <linux/capability.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <string_view>

#include "CommandControl.h"
#include "SandboxFiles.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"

namespace dsec::backends {

uint64_t defaultSandboxCaps() {
  // Docker's default set without CAP_MKNOD (there is no device cgroup here to stop a device node of the host disk
  // from being created and opened) and without CAP_NET_RAW (raw and packet sockets name no destination the egress
  // policy's connect and send hooks could judge: a sandbox could send IP packets anywhere its link routes).
  constexpr int kCaps[] = {CAP_CHOWN,  CAP_DAC_OVERRIDE, CAP_FSETID,  CAP_FOWNER,           CAP_SETGID,
                           CAP_SETUID, CAP_SETFCAP,      CAP_SETPCAP, CAP_NET_BIND_SERVICE, CAP_SYS_CHROOT,
                           CAP_KILL,   CAP_AUDIT_WRITE};
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

std::string memoryControlDir(const Cgroup& cgroup) {
  for (const auto& f : cgroup.procsFiles()) {
    std::string dir = f.substr(0, f.rfind('/'));
    if (access((dir + "/memory.limit_in_bytes").c_str(), F_OK) == 0 ||
        access((dir + "/memory.max").c_str(), F_OK) == 0) {
      return dir;
    }
  }
  return "";
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
          {"network", networkModeName(spec.network)},
          {"egress", spec.egress.texts()},
          {"upper_dir", spec.upper_dir},
          {"read_only_root", spec.read_only_root}};
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
    DSEC_ASSIGN_OR_RETURN(s.network, parseNetworkMode(j.value("network", "none")));
    // Records from before egress policies: a link meant a route anywhere but the node.
    const auto egress = j.value("egress", std::vector<std::string>{"0.0.0.0/0"});
    DSEC_ASSIGN_OR_RETURN(s.egress, parseEgressPolicy(egress));
    s.upper_dir = j.value("upper_dir", "");
    s.read_only_root = j.value("read_only_root", false);
    return s;
  } catch (const nlohmann::json::exception& e) {
    return Error::invalid(std::string("bad sandbox spec in state: ") + e.what());
  }
}

ContainerSandbox::ContainerSandbox(std::shared_ptr<ContainerShared> shared, SandboxSpec spec, InitProcess init,
                                   std::unique_ptr<Cgroup> cgroup, bool paused, int64_t oom_kills,
                                   std::vector<std::string> protected_in_force)
    : shared_(std::move(shared)),
      spec_(std::move(spec)),
      owner_(init.host_root),
      init_(std::move(init)),
      cgroup_(std::move(cgroup)),
      procs_files_(cgroupJoinFiles(*cgroup_)),
      memory_dir_(memoryControlDir(*cgroup_)),
      state_(paused ? SandboxState::kPaused : SandboxState::kRunning),
      oom_seen_(oom_kills),
      protection_(std::make_unique<PathProtection>(std::move(protected_in_force))) {}

// Dropping the handle does not destroy the sandbox: it keeps running for a restarted agent to adopt.
ContainerSandbox::~ContainerSandbox() {
  {
    std::unique_lock lock(mu_);
    idle_.wait(lock, [&] { return users_ == 0; });
  }
  shared_->join_fds->forget(spec_.id);
  {
    std::lock_guard policy(policy_mu_);
    forgetFileWatch();  // its record goes with this handle
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

Result<UniqueFd> ContainerSandbox::openRoot() const {
  UniqueFd root(open(("/proc/" + std::to_string(init_.pid) + "/root").c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  const int open_errno = errno;
  // A pid is reused only once its process is gone: init still alive now means the root opened was its.
  pollfd p{init_.pidfd.get(), POLLIN, 0};
  if (!init_.pidfd || poll(&p, 1, 0) != 0) return Error::notFound("sandbox " + spec_.id + " is gone: its init exited");
  if (!root) return Error::sys(open_errno, "open the root of sandbox " + spec_.id);
  return root;
}

Result<ExecResult> ContainerSandbox::exec(const ExecRequest& request) { return run(request, nullptr); }

Result<ExecResult> ContainerSandbox::execStream(const ExecRequest& request, ExecSink& sink) {
  return run(request, &sink);
}

Result<UniqueFd> ContainerSandbox::openForRead(const std::string& path) {
  DSEC_ASSIGN_OR_RETURN(Use use, acquire(false));
  DSEC_ASSIGN_OR_RETURN(FileRoute route, fileRoute(path));
  return sandboxOpenForRead(route.root.get(), route.path);
}

Result<UniqueFd> ContainerSandbox::openForWrite(const std::string& path, uint32_t mode) {
  DSEC_ASSIGN_OR_RETURN(Use use, acquire(false));
  DSEC_ASSIGN_OR_RETURN(FileRoute route, fileRoute(path));
  return sandboxOpenForWrite(route.root.get(), route.path, mode, owner_);
}

Result<FileStat> ContainerSandbox::stat(const std::string& path) {
  DSEC_ASSIGN_OR_RETURN(Use use, acquire(false));
  DSEC_ASSIGN_OR_RETURN(FileRoute route, fileRoute(path));
  return sandboxStat(route.root.get(), route.path);
}

Result<std::vector<FileStat>> ContainerSandbox::listDir(const std::string& path) {
  DSEC_ASSIGN_OR_RETURN(Use use, acquire(false));
  DSEC_ASSIGN_OR_RETURN(FileRoute route, fileRoute(path));
  return sandboxListDir(route.root.get(), route.path);
}

Status ContainerSandbox::remove(const std::string& path, bool recursive) {
  DSEC_ASSIGN_OR_RETURN(Use use, acquire(false));
  DSEC_ASSIGN_OR_RETURN(FileRoute route, fileRoute(path));
  return sandboxRemove(route.root.get(), route.path, recursive);
}

Status ContainerSandbox::pause() {
  std::lock_guard lock(mu_);
  if (destroyed_) return Error::notFound("sandbox " + spec_.id + " is destroyed");
  if (state_ == SandboxState::kPaused) return okStatus();
  hangUpTerminalsLocked();  // killed before the freeze, which would hold them (and their sessions) for ever
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
  reapSpawned(10);
  Status killed = killAndWaitInit(init_, 10);
  {
    std::unique_lock lock(mu_);
    idle_.wait(lock, [&] { return users_ == 0; });
  }
  shared_->join_fds->forget(spec_.id);  // no command is being started any more (no users)
  protection_->release();
  // Normally the namespace died with its init and the cgroup is empty already; killAll (a freeze/kill/thaw
  // cycle on v1, which patches kernel text on every freeze) is only for stragglers.
  auto left = cgroup_->pids();
  Status emptied = left.ok() && left->empty() ? okStatus() : cgroup_->killAll();
  Status removed = cgroup_->remove();
  // Only a sandbox known to be gone gives its host id range back, and its egress policy: until its processes are
  // gone the policy must hold (a namespace missing from the filter's map is let through).
  if (killed.ok() && emptied.ok()) {
    init_.lease.reset();
    forgetEgress();
  }
  {
    std::lock_guard policy(policy_mu_);
    forgetFileWatch();
  }
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

namespace {

Status writeControl(const std::string& path, const std::string& value) {
  UniqueFd fd(open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd) return Error::sys(errno, "open " + path);
  ssize_t n;
  do {
    n = write(fd.get(), value.data(), value.size());
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Error::sys(errno, "write " + value + " to " + path);
  return okStatus();
}

}  // namespace

// Written here rather than through Cgroup::setLimits, which rewrites every limit (CPU weight, quota, pids)
// and would undo what the node's QoS set; only the memory files are touched.
Status ContainerSandbox::setMemoryLimit(int64_t bytes) {
  if (bytes < 0) return Error::invalid("memory limit must not be negative");
  DSEC_ASSIGN_OR_RETURN(Use use, acquire(false));
  if (memory_dir_.empty()) return Error(ErrorCode::kUnsupported, "sandbox " + spec_.id + " has no memory controller");
  std::lock_guard lock(memory_mu_);
  Status s = okStatus();
  if (access((memory_dir_ + "/memory.max").c_str(), F_OK) == 0) {  // v2
    s = writeControl(memory_dir_ + "/memory.max", bytes > 0 ? std::to_string(bytes) : "max");
  } else {
    // v1: memory.memsw.limit_in_bytes (memory+swap) must stay >= memory.limit_in_bytes, so lowering writes the
    // memory limit first and raising the memsw limit first; EINVAL on the first try means the other order.
    const std::string value = bytes > 0 ? std::to_string(bytes) : "-1";
    const std::string memsw = memory_dir_ + "/memory.memsw.limit_in_bytes";
    const bool has_memsw = access(memsw.c_str(), F_OK) == 0;
    s = writeControl(memory_dir_ + "/memory.limit_in_bytes", value);
    if (s.ok() && has_memsw) {
      s = writeControl(memsw, value);
    } else if (!s.ok() && has_memsw && s.error().sysErrno() == EINVAL) {
      s = writeControl(memsw, value);
      if (s.ok()) s = writeControl(memory_dir_ + "/memory.limit_in_bytes", value);
    }
    // Socket buffers follow the memory limit (Cgroup v1 charges them only under a TCP limit of their own).
    const std::string tcp = memory_dir_ + "/memory.kmem.tcp.limit_in_bytes";
    if (s.ok() && access(tcp.c_str(), F_OK) == 0) s = writeControl(tcp, value);
  }
  if (!s.ok() && s.error().sysErrno() == EBUSY) {
    // v1 refuses a limit below what it cannot reclaim of the current usage.
    return Error(ErrorCode::kResourceExhausted,
                 "sandbox " + spec_.id + " uses more memory than the new limit of " + std::to_string(bytes) + " bytes",
                 EBUSY);
  }
  if (!s.ok()) return s.error().wrap("set memory limit of " + spec_.id);
  return okStatus();
}

void ContainerSandbox::keepSpawned(int pidfd) {
  UniqueFd copy(fcntl(pidfd, F_DUPFD_CLOEXEC, 3));
  std::lock_guard lock(mu_);
  // Forget those their owner reaped already (waitid then has no such child).
  std::erase_if(spawned_, [](const UniqueFd& fd) {
    siginfo_t info{};
    return waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(fd.get()), &info, WEXITED | WNOHANG | WNOWAIT) <
               0 &&
           errno == ECHILD;
  });
  if (copy) spawned_.push_back(std::move(copy));
}

void ContainerSandbox::reapSpawned(double timeout_seconds) {
  std::vector<UniqueFd> fds;
  {
    std::lock_guard lock(mu_);
    fds.swap(spawned_);
  }
  const double deadline = monotonicSeconds() + timeout_seconds;
  for (auto& fd : fds) {
    // The init's death kills them (the kernel zaps the pid namespace); wait for that, then reap.
    (void)syscall(SYS_pidfd_send_signal, fd.get(), SIGKILL, nullptr, 0);
    pollfd p{fd.get(), POLLIN, 0};
    double left = deadline - monotonicSeconds();
    (void)poll(&p, 1, left <= 0 ? 0 : static_cast<int>(left * 1000) + 1);
    siginfo_t info{};
    while (waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(fd.get()), &info, WEXITED | WNOHANG) < 0 &&
           errno == EINTR) {
    }
  }
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
  return {{"backend", backendKindName(BackendKind::kContainer)},
          {"id", spec_.id},
          {"init_pid", init_.pid},
          {"init_start_time", init_.start_time},
          {"cgroup", cgroup_->name()},
          {"paused", state_ == SandboxState::kPaused},
          {"user_namespace", owner_.has_value()},
          {"host_root", owner_.value_or(0)},
          {"egress", egress_.texts()},
          {"egress_resolver", resolver_ip4_},
          {"egress_address", address_ip4_},
          {"protected_paths", protection_->paths()},
          {"spec", specToJson(spec_)}};
}

}  // namespace dsec::backends
