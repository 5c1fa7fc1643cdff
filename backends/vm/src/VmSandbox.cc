#include "VmSandbox.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "QemuCommand.h"
#include "VmLaunch.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"

namespace dsec::backends::vm {
namespace {

constexpr const char* kLog = "vm";
// A monitor command on a healthy QEMU answers in milliseconds; a loaded TCG host may take a while.
constexpr double kMonitorTimeout = 30;
// File writes still streaming into the guest when another operation comes: how long it waits for them.
constexpr double kWriteWaitSeconds = 600;

Result<UniqueFd> connectOne(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) return Error::invalid("socket path too long: " + path);
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return Error::sys(errno, "socket");
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Error::sys(errno, "connect " + path);
  }
  return fd;
}

}  // namespace

Result<std::vector<UniqueFd>> connectPorts(const std::string& run_dir, double timeout_seconds) {
  const double deadline = monotonicSeconds() + timeout_seconds;
  std::vector<UniqueFd> ports;
  for (int p = 0; p < kAgentPorts; ++p) {
    while (true) {
      auto fd = connectOne(portSocketPath(run_dir, p));
      if (fd.ok()) {
        ports.push_back(std::move(fd).value());
        break;
      }
      if (monotonicSeconds() >= deadline) return fd.error().wrap("the guest agent's port " + std::to_string(p));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  return ports;
}

void teardownMachine(VmMachine& m) {
  if (m.cgroup) {
    if (auto st = m.cgroup->killAll(); !st.ok()) DSEC_LOG(kWarn, kLog) << "kill QEMU: " << st.error().toString();
  } else if (m.pidfd) {
    (void)::syscall(SYS_pidfd_send_signal, m.pidfd.get(), SIGKILL, nullptr, 0);
  }
  if (m.pidfd) {
    if (!waitExited(m.pidfd.get(), 30)) DSEC_LOG(kWarn, kLog) << "QEMU " << m.pid << " did not exit after SIGKILL";
  }
  if (m.our_child) reapChild(m.pid);
  m.pidfd.reset();
  if (m.cgroup) {
    if (auto st = m.cgroup->remove(); !st.ok()) DSEC_LOG(kWarn, kLog) << "remove cgroup: " << st.error().toString();
    m.cgroup.reset();
  }
  if (!m.run_dir.empty()) {
    if (auto st = removeTree(m.run_dir); !st.ok()) DSEC_LOG(kWarn, kLog) << st.error().toString();
  }
  m.lease.reset();  // after QEMU is gone: its uid comes free only now
}

VmSandbox::VmSandbox(std::shared_ptr<VmShared> shared, SandboxSpec spec, VmMachine machine, QmpClient qmp,
                     std::unique_ptr<AgentChannel> channel, SandboxState state)
    : shared_(std::move(shared)),
      spec_(std::move(spec)),
      machine_(std::move(machine)),
      qmp_(std::move(qmp)),
      channel_(std::move(channel)),
      state_(state) {}

VmSandbox::~VmSandbox() {
  // The sandbox lives on (its QEMU runs) when the agent goes without destroying it; only threads of ours end.
  {
    std::lock_guard lock(channel_mu_);
    if (channel_) channel_->close();
  }
  std::lock_guard lock(writes_mu_);
  for (auto& w : writes_) {
    if (w.thread.joinable()) w.thread.join();
  }
}

Status VmSandbox::stopped() const { return Error(ErrorCode::kConflict, "sandbox " + spec_.id + " was destroyed"); }

Result<AgentChannel*> VmSandbox::channel() {
  if (state_.load() == SandboxState::kStopped) return stopped().error();
  std::lock_guard lock(channel_mu_);
  if (!channel_) {
    DSEC_ASSIGN_OR_RETURN(auto ports, connectPorts(machine_.run_dir, 10));
    DSEC_ASSIGN_OR_RETURN(channel_, AgentChannel::connect(std::move(ports), 30));
  }
  return channel_.get();
}

Status VmSandbox::waitWrites() {
  std::vector<PendingWrite> finished;
  {
    std::lock_guard lock(writes_mu_);
    finished.swap(writes_);
  }
  Status first = okStatus();
  const double deadline = monotonicSeconds() + kWriteWaitSeconds;
  for (auto& w : finished) {
    while (!w.done->load() && monotonicSeconds() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (!w.done->load()) {
      // Still streaming: keep it for the next caller rather than block forever.
      std::lock_guard lock(writes_mu_);
      writes_.push_back(std::move(w));
      continue;
    }
    w.thread.join();
    if (!w.result->ok() && first.ok()) first = *w.result;
  }
  if (!first.ok()) DSEC_LOG(kWarn, kLog) << spec_.id << ": a file write failed: " << first.error().toString();
  return okStatus();
}

Result<ExecResult> VmSandbox::exec(const ExecRequest& request) {
  DSEC_TRY(waitWrites());
  DSEC_ASSIGN_OR_RETURN(AgentChannel * ch, channel());
  return ch->exec(request, nullptr);
}

Result<ExecResult> VmSandbox::execStream(const ExecRequest& request, ExecSink& sink) {
  DSEC_TRY(waitWrites());
  DSEC_ASSIGN_OR_RETURN(AgentChannel * ch, channel());
  return ch->exec(request, &sink);
}

Result<LongRunningProcess> VmSandbox::spawn(const ExecRequest&) {
  return Error(ErrorCode::kUnsupported, "a " + backendName() + " sandbox's processes are not the node's children");
}

Status VmSandbox::setMemoryLimit(int64_t bytes) {
  if (bytes == machine_.memory_bytes) return okStatus();
  return Error(ErrorCode::kUnsupported,
               "a " + backendName() + " sandbox's memory is its machine's RAM, fixed at create");
}

Status VmSandbox::setEgress(const EgressPolicy&) {
  return Error(ErrorCode::kConflict,
               "sandbox " + spec_.id + " has no network (" + backendName() + " sandboxes have none yet)");
}

Status VmSandbox::setProtectedPaths(const std::vector<std::string>& paths) {
  if (paths.empty()) return okStatus();
  return Error(ErrorCode::kUnsupported, "protected paths are not available in " + backendName() + " sandboxes");
}

Result<std::vector<Violation>> VmSandbox::violations() { return std::vector<Violation>{}; }

Result<UniqueFd> VmSandbox::openForRead(const std::string& path) {
  DSEC_TRY(waitWrites());
  DSEC_ASSIGN_OR_RETURN(AgentChannel * ch, channel());
  // The bytes land in an unnamed file of the run dir (the guest's disk limit bounds them) that the caller reads.
  UniqueFd copy(::open(machine_.run_dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
  if (!copy) return Error::sys(errno, "a temporary file for " + path);
  DSEC_TRY(ch->readFile(path, copy.get()));
  if (::lseek(copy.get(), 0, SEEK_SET) < 0) return Error::sys(errno, "lseek");
  return copy;
}

Result<UniqueFd> VmSandbox::openForWrite(const std::string& path, uint32_t mode) {
  DSEC_TRY(waitWrites());
  DSEC_ASSIGN_OR_RETURN(AgentChannel * ch, channel());
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Error::sys(errno, "pipe");
  UniqueFd read_end(fds[0]), write_end(fds[1]);
  (void)::fcntl(write_end.get(), F_SETPIPE_SZ, 1 << 20);
  // A thread streams the pipe into the guest until the caller closes its end; the next operation on the sandbox
  // waits for it (waitWrites), so whatever reads the file afterwards sees all of it.
  PendingWrite w;
  w.done = std::make_shared<std::atomic<bool>>(false);
  w.result = std::make_shared<Status>(okStatus());
  w.thread = std::thread([ch, path, mode, in = std::move(read_end), done = w.done, result = w.result]() mutable {
    *result = ch->writeFile(path, mode, in.get());
    in.reset();  // a writer still writing gets EPIPE: the file did not land
    done->store(true);
  });
  std::lock_guard lock(writes_mu_);
  writes_.push_back(std::move(w));
  return write_end;
}

Result<FileStat> VmSandbox::stat(const std::string& path) {
  DSEC_TRY(waitWrites());
  DSEC_ASSIGN_OR_RETURN(AgentChannel * ch, channel());
  return ch->stat(path);
}

Result<std::vector<FileStat>> VmSandbox::listDir(const std::string& path) {
  DSEC_TRY(waitWrites());
  DSEC_ASSIGN_OR_RETURN(AgentChannel * ch, channel());
  return ch->listDir(path);
}

Status VmSandbox::remove(const std::string& path, bool recursive) {
  DSEC_TRY(waitWrites());
  DSEC_ASSIGN_OR_RETURN(AgentChannel * ch, channel());
  return ch->remove(path, recursive);
}

Status VmSandbox::pause() {
  std::lock_guard lock(qmp_mu_);
  if (state_.load() == SandboxState::kStopped) return stopped();
  if (state_.load() == SandboxState::kPaused) return okStatus();
  DSEC_TRY(qmp_->execute("stop", nullptr, kMonitorTimeout));
  state_.store(SandboxState::kPaused);
  return okStatus();
}

Status VmSandbox::resume() {
  std::lock_guard lock(qmp_mu_);
  if (state_.load() == SandboxState::kStopped) return stopped();
  if (state_.load() == SandboxState::kRunning) return okStatus();
  DSEC_TRY(qmp_->execute("cont", nullptr, kMonitorTimeout));
  state_.store(SandboxState::kRunning);
  return okStatus();
}

Status VmSandbox::reclaimMemory() {
  if (state_.load() == SandboxState::kRunning) {
    // The guest drops its caches; free page reporting hands the freed pages back (the RAM file's holes).
    if (auto ch = channel(); ch.ok()) {
      if (auto st = (*ch)->reclaim(); !st.ok()) DSEC_LOG(kDebug, kLog) << spec_.id << ": " << st.error().toString();
    }
  }
  if (machine_.cgroup) (void)machine_.cgroup->reclaim();
  return okStatus();
}

Status VmSandbox::destroy() {
  std::lock_guard lock(qmp_mu_);
  if (state_.exchange(SandboxState::kStopped) == SandboxState::kStopped && !machine_.cgroup) return okStatus();
  {
    std::lock_guard channel_lock(channel_mu_);
    if (channel_) channel_->close();
  }
  teardownMachine(machine_);
  {
    std::lock_guard writes_lock(writes_mu_);
    for (auto& w : writes_) {
      if (w.thread.joinable()) w.thread.join();
    }
    writes_.clear();
  }
  qmp_.reset();
  return okStatus();
}

Result<SandboxUsage> VmSandbox::usage() {
  if (state_.load() == SandboxState::kStopped) return stopped().error();
  SandboxUsage u;
  if (machine_.cgroup) {
    DSEC_ASSIGN_OR_RETURN(auto s, machine_.cgroup->stats());
    u.memory_bytes = s.memory_current;
    u.cpu_usec = s.cpu_usage_usec;
    u.oom_kills = s.oom_kills;
  }
  if (state_.load() == SandboxState::kRunning) {
    if (auto ch = channel(); ch.ok()) {
      if (auto g = (*ch)->usage(); g.ok()) u.pids = g->pids;
    }
  }
  return u;
}

nlohmann::json VmSandbox::persistentState() const {
  return nlohmann::json{{"backend", backendName()},
                        {"id", spec_.id},
                        {"image", spec_.image},
                        {"run_dir", machine_.run_dir},
                        {"pid", machine_.pid},
                        {"start_time", machine_.start_time},
                        {"host_base", machine_.host_base},
                        {"memory_bytes", machine_.memory_bytes},
                        {"cpus", machine_.cpus},
                        {"ram_shared", machine_.ram_shared},
                        {"kernel_release", machine_.kernel_release},
                        {"disk_bytes", spec_.disk_bytes},
                        {"pids", spec_.pids},
                        {"lower_files", spec_.lower_files},
                        {"paused", state_.load() == SandboxState::kPaused}};
}

}  // namespace dsec::backends::vm
