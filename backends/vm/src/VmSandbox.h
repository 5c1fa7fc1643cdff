// One microvm/vm sandbox as the node sees it: its QEMU (pid, pidfd, cgroup, uid lease), the monitor (QMP) and the
// guest agent's channel. Execs and file operations go to the agent; pause, resume and snapshots to the monitor.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "Qmp.h"
#include "UserNamespace.h"
#include "dsec/backends/BackendKind.h"
#include "dsec/backends/Sandbox.h"
#include "dsec/backends/vm/AgentChannel.h"
#include "dsec/backends/vm/VmBackend.h"
#include "dsec/common/Cgroup.h"

namespace dsec::backends::vm {

// What the backend and its sandboxes share (sandboxes keep it alive if the backend goes first).
struct VmShared {
  VmBackendOptions options;
  AccelChoice accel;
  int64_t tsc_khz = 0;
  std::string kernel;  // <kernel_dir>/vmlinux
  std::string initrd;  // the initramfs of that kernel (sharedInitramfs)
  std::string agent;   // dsec-guest-agent, for the initramfs of an image's own kernel
  std::unique_ptr<CgroupDriver> cgroups;
  std::unique_ptr<IdRangeAllocator> id_ranges;
};

// What a running QEMU is, for the sandbox and its persisted state.
struct VmMachine {
  std::string run_dir;
  pid_t pid = -1;
  uint64_t start_time = 0;  // /proc/<pid>/stat, so a reused pid is never taken for it
  UniqueFd pidfd;
  bool our_child = true;  // false once re-adopted by a later agent
  uint32_t host_base = 0;
  IdRangeHold lease;
  std::unique_ptr<Cgroup> cgroup;
  int64_t memory_bytes = 0;  // guest RAM
  int cpus = 1;
  bool ram_shared = true;      // RAM is the run dir's own file (a cold boot), not a snapshot's mapped privately
  std::string kernel_release;  // the image's own kernel it booted; "" : dsec's guest kernel
};

class VmSandbox : public Sandbox {
 public:
  VmSandbox(std::shared_ptr<VmShared> shared, SandboxSpec spec, VmMachine machine, QmpClient qmp,
            std::unique_ptr<AgentChannel> channel, SandboxState state);
  ~VmSandbox() override;

  const SandboxSpec& spec() const override { return spec_; }
  SandboxState state() const override { return state_.load(); }
  std::string backendName() const override { return backendKindName(shared_->options.kind); }

  Result<ExecResult> exec(const ExecRequest& request) override;
  Result<ExecResult> execStream(const ExecRequest& request, ExecSink& sink) override;
  bool supportsStdinFd() const override { return true; }
  Result<LongRunningProcess> spawn(const ExecRequest& request) override;
  Status setMemoryLimit(int64_t bytes) override;
  Status setEgress(const EgressPolicy& policy) override;
  Status setProtectedPaths(const std::vector<std::string>& paths) override;
  Result<std::vector<Violation>> violations() override;

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
  Result<SnapshotKind> snapshot(const std::string& dir) override;

  nlohmann::json persistentState() const override;

 private:
  // The agent's channel once the guest runs (a sandbox adopted while paused connects on resume).
  Result<AgentChannel*> channel();
  // Waits for file writes still streaming into the guest (openForWrite), so what follows sees them.
  Status waitWrites();
  Status stopped() const;

  std::shared_ptr<VmShared> shared_;
  SandboxSpec spec_;
  VmMachine machine_;
  std::mutex qmp_mu_;  // one monitor command at a time; also serialises pause/resume/snapshot/destroy
  std::optional<QmpClient> qmp_;
  std::mutex channel_mu_;
  std::unique_ptr<AgentChannel> channel_;
  std::atomic<SandboxState> state_;

  struct PendingWrite {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
    std::shared_ptr<Status> result;
  };
  std::mutex writes_mu_;
  std::vector<PendingWrite> writes_;
};

// The ports' sockets of a run dir, connected (QEMU listens on them from its start).
Result<std::vector<UniqueFd>> connectPorts(const std::string& run_dir, double timeout_seconds);
// Kills what is left of a machine (its cgroup's processes), waits, removes the cgroup and the run dir.
void teardownMachine(VmMachine& machine);

}  // namespace dsec::backends::vm
