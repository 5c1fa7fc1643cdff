// Which Slurm job owns what on a node, and the clean-up when a job ends (docs/fleet.md, "Which job owns what").
//
// A node agent running inside a Slurm job (SLURM_JOB_ID) owns its node directory for as long as it runs, and
// with it every sandbox it makes or re-adopts: each sandbox's record names the job (StateRecord.h). The agent
// holds the directory with a lock (StateDirLock), so no second agent and no epilog ever works on it at the
// same time, and it leaves a claim in a node-local registry (/run/dsec/jobs/<job>/...) saying which directory,
// cgroup parent and node it used. When the job ends, however it ends (scancel, time limit, node failure, the
// agent killed beforehand), the job's epilog on each node runs cleanUpSlurmJob(): for every claim of the job it
// destroys the job's sandboxes (processes, cgroups; their network namespaces and veths go with their last
// process), removes their records and, once no sandbox is left there, the directory's layer mounts. It needs
// no agent: everything is found from the claims and the records.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"

namespace dsec::launcher {

// Node-local (a tmpfs, cleared at boot, when every sandbox is gone anyway).
inline constexpr const char* kJobRegistryDir = "/run/dsec/jobs";

// Exclusive hold of a node's state directory by one live process (an agent, or the epilog while it cleans).
// A flock on <dir>/agent.lock: the kernel drops it when the holder dies, however it dies.
class StateDirLock {
 public:
  // kConflict naming the holder (pid, job) when another process holds it; never waits.
  static Result<StateDirLock> acquire(const std::string& dir, const std::string& slurm_job);
  StateDirLock() = default;
  bool held() const { return static_cast<bool>(fd_); }

 private:
  UniqueFd fd_;
};

// An agent's claim: what the epilog of `job` cleans on `host`.
struct JobClaim {
  std::string job;
  std::string host;           // gethostname() of the agent (UTS namespace): which node's epilog cleans it
  std::string node;           // the agent's node name (for messages)
  std::string state_dir;      // the node directory (the agent's root): records under state/sandboxes, mnt/
  std::string cgroup_parent;  // where its sandboxes' cgroups live
  pid_t pid = 0;
};

std::string currentHostName();
// Writes (replaces) the claim under registry_dir/<job>/; a job id that is not a number is refused.
Status registerJobClaim(const std::string& registry_dir, const JobClaim& claim);
// Removes the claims of every other job on the same host and directory: an agent that holds the directory now has
// reaped (or taken over) what those jobs left there, so their epilogs have nothing to do on it.
void dropOtherJobsClaims(const std::string& registry_dir, const JobClaim& claim);

struct JobCleanupReport {
  int directories = 0;             // claims of the job on this host
  int sandboxes = 0;               // sandboxes of the job destroyed (from their records)
  int leftovers = 0;               // cgroups without a record (a create cut short, fncall workers) destroyed
  int mounts = 0;                  // layer mounts released
  std::vector<std::string> notes;  // what was left alone, and why (a live agent holds the directory, ...)
};

// Destroys everything job `job` holds on this host (claims whose host is `host`). Idempotent; the errors of
// single sandboxes are collected in the report's notes and the rest carries on. kInvalidArgument for a job id
// that is not a number.
Result<JobCleanupReport> cleanUpSlurmJob(const std::string& registry_dir, const std::string& job,
                                         const std::string& host);

// Removes <hierarchy>/<parent> in every cgroup hierarchy where it is empty (rmdir fails on a cgroup in use).
void removeEmptyCgroupParent(const std::string& parent);

}  // namespace dsec::launcher
