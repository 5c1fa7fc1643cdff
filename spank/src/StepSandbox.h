// One sandbox per job step per node, made by slurmstepd (root) before the tasks start and destroyed when the
// step ends. Layers come from the node's layer store (mounted under <root>/mnt by fs3's LayerMounter), the
// sandbox from the container backend.
//
// Layer mounts made here are LEFT IN PLACE when the step ends. Each step has its own slurmstepd process, so
// an in-process reference count cannot know whether another step (or `dsec serve` on the same node) still
// uses a layer; unmounting under them would break their next sandbox. Mounts are cheap to keep (one
// read-only EROFS superblock per layer) and are reused by the next step; `dsec layer rm` or an agent's
// unmountUnused() clears them. Running sandboxes never depend on them staying: overlayfs holds private
// clones of its lower mounts.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "MountSource.h"
#include "SpankConfig.h"
#include "TaskJoin.h"
#include "TaskLockdown.h"
#include "dsec/backends/Sandbox.h"
#include "dsec/common/Result.h"

namespace dsec::spank {

struct StepIdentity {
  std::string node;  // short hostname of the node
  uint32_t job_id = 0;
  uint32_t step_id = 0;
};

constexpr uint32_t kBatchStep = 0xfffffffb;
constexpr uint32_t kExternStep = 0xfffffffc;
constexpr uint32_t kInteractiveStep = 0xfffffffa;

// "<node>-<job>.<step>" (step "batch", "extern", "interactive" for Slurm's special steps), at most 64
// characters: the sandbox id and its hostname.
std::string sandboxIdFor(const StepIdentity& step);
// Prefix shared by every sandbox of a job on a node ("<node>-<job>."), for the epilog's leftover sweep.
std::string sandboxPrefixFor(const std::string& node, uint32_t job_id);

class StepSandbox {
 public:
  // extra_mounts: added by the plugin itself (the batch script's directory), opened as root; the options'
  // mounts are opened with the job's credentials `job`.
  // alloc_memory_bytes: the step's Slurm memory allocation (0 = none), used unless --dsec-mem is given.
  static Result<std::unique_ptr<StepSandbox>> create(const PluginArgs& args, const StepOptions& options,
                                                     const StepIdentity& step, const JobCredentials& job,
                                                     int64_t alloc_memory_bytes,
                                                     const std::vector<MountSpec>& extra_mounts);
  ~StepSandbox();  // does not destroy: destroy() is explicit (the step end)

  const std::string& id() const { return id_; }
  const JoinTarget& joinTarget() const { return join_; }
  // What every task is held to once it joined (TaskLockdown.h).
  const TaskPolicy& taskPolicy() const { return policy_; }
  // Kills every process in the sandbox, removes its mounts and cgroup. Idempotent.
  Status destroy();

 private:
  StepSandbox() = default;
  std::string id_;
  JoinTarget join_;
  TaskPolicy policy_;
  std::unique_ptr<backends::Backend> backend_;
  std::unique_ptr<backends::Sandbox> sandbox_;
};

// Kills and removes sandboxes of a finished job left on this node (slurmstepd was killed before it could
// clean up). Returns how many it reaped.
Result<int> reapJobLeftovers(const PluginArgs& args, const std::string& node, uint32_t job_id);

}  // namespace dsec::spank
