// One container sandbox as seen by the agent: its init (pid, start time, pidfd), its root (an O_PATH fd
// through /proc/<init>/root, used by the file API and as the chroot of every exec) and its cgroup.
#pragma once

#include <linux/filter.h>
#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "dsec/backends/Sandbox.h"
#include "dsec/backends/container/ContainerBackend.h"
#include "dsec/common/Cgroup.h"

namespace dsec::backends {

// What the backend and its sandboxes share; sandboxes keep it alive if the backend goes first (an agent
// "restart" in tests destroys the backend while sandboxes live on).
struct ContainerShared {
  ContainerBackendOptions options;
  std::unique_ptr<CgroupDriver> cgroups;
  std::vector<sock_filter> seccomp;
  std::string scratch_dir;  // empty host dir every init mounts its root on (inside its own mount namespace)
  uint64_t keep_caps = 0;
  std::mutex mu;
  std::set<std::string> live;  // ids created or adopted by this process and not destroyed
};

struct InitProcess {
  pid_t pid = -1;
  uint64_t start_time = 0;
  UniqueFd pidfd;
  bool is_child = false;  // created by this process (then it must be reaped with waitid)
};

class ContainerSandbox : public Sandbox {
 public:
  ContainerSandbox(std::shared_ptr<ContainerShared> shared, SandboxSpec spec, InitProcess init, UniqueFd root_fd,
                   std::unique_ptr<Cgroup> cgroup, bool paused, int64_t oom_kills);
  ~ContainerSandbox() override;

  const SandboxSpec& spec() const override { return spec_; }
  SandboxState state() const override;
  std::string backendName() const override { return "container"; }

  Result<ExecResult> exec(const ExecRequest& request) override;
  Result<ExecResult> execStream(const ExecRequest& request, ExecSink& sink) override;
  bool supportsStdinFd() const override { return true; }

  Result<UniqueFd> openForRead(const std::string& path) override;
  Result<UniqueFd> openForWrite(const std::string& path, uint32_t mode) override;
  Result<FileStat> stat(const std::string& path) override;
  Result<std::vector<FileStat>> listDir(const std::string& path) override;
  Status remove(const std::string& path, bool recursive) override;

  Status pause() override;
  Status resume() override;
  Status reclaimMemory() override;
  Status destroy() override;
  Result<SandboxUsage> usage() override;
  nlohmann::json persistentState() const override;

 private:
  // Keeps the init pidfd and root fd open while an exec or file operation uses them.
  class Use {
   public:
    explicit Use(ContainerSandbox* sb) : sb_(sb) {}
    Use(Use&& other) noexcept : sb_(std::exchange(other.sb_, nullptr)) {}
    ~Use();

   private:
    ContainerSandbox* sb_;
  };
  // kNotFound once destroyed; kConflict when paused and the caller needs it running.
  Result<Use> acquire(bool need_running);
  Result<ExecResult> run(const ExecRequest& request, ExecSink* sink);

  std::shared_ptr<ContainerShared> shared_;
  SandboxSpec spec_;
  InitProcess init_;
  UniqueFd root_fd_;
  std::unique_ptr<Cgroup> cgroup_;
  std::vector<std::string> procs_files_;

  mutable std::mutex mu_;
  std::condition_variable idle_;
  SandboxState state_ = SandboxState::kRunning;
  bool destroyed_ = false;
  int users_ = 0;
  // OOM kills of the cgroup already reported (or there before adoption).
  std::atomic<int64_t> oom_seen_{0};
};

// The files a freshly cloned (single-threaded) child writes "0" into to join the sandbox cgroup. On cgroup v1
// that is `tasks`: it moves just the writing thread (for a new child, the whole process) and so skips the
// global threadgroup rwsem a `cgroup.procs` write takes, whose write side waits for an RCU grace period
// whenever it was idle (most of the join's cost and all of its multi-millisecond tail). v2 keeps cgroup.procs.
std::vector<std::string> cgroupJoinFiles(const Cgroup& cgroup);
// Kills an init (SIGKILL through its pidfd; the kernel then kills its whole pid namespace) and waits until
// it is gone, reaping it when it is our child.
Status killAndWaitInit(InitProcess& init, double timeout_seconds);
// The default capability set of sandbox processes (Docker's default minus MKNOD).
uint64_t defaultSandboxCaps();
nlohmann::json specToJson(const SandboxSpec& spec);
Result<SandboxSpec> specFromJson(const nlohmann::json& json);

}  // namespace dsec::backends
