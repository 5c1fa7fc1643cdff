// One container sandbox as seen by the agent: its init (pid, start time, pidfd) and its cgroup.
//
// The agent's fds per idle sandbox (a node holds thousands; docs/density.md): one, the init's pidfd, which names
// the sandbox's PID 1 without the races of a pid (kill, death, the namespaces commands join, adoption). Nothing
// else is held per sandbox: the host id range's lease is a lock taken through a file description shared by all the
// agent's sandboxes (UserNamespace.h); the root for the file API is opened per operation through /proc/<init>/root;
// the cgroup files a command joins are kept only for the most recently used sandboxes (JoinFdCache.h); spawn()ed
// processes' pidfds only while they run.
#pragma once

#include <linux/filter.h>
#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "EgressFilter.h"
#include "EgressNetwork.h"
#include "FileWatch.h"
#include "JoinFdCache.h"
#include "NodeResolver.h"
#include "PathProtection.h"
#include "Spawn.h"
#include "UserNamespace.h"
#include "ViolationLog.h"
#include "dsec/backends/BackendKind.h"
#include "dsec/backends/Sandbox.h"
#include "dsec/backends/container/ContainerBackend.h"
#include "dsec/backends/container/SandboxPolicy.h"
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
  std::unique_ptr<IdRangeAllocator> id_ranges;  // set when sandboxes get user namespaces
  std::string userns_problem;                   // what the kernel lacks for them ("" = nothing)
  bool userns_owned_by_root = false;            // the kernel lets only root make them (UserNamespace.h)
  std::string spawner_path;
  std::unique_ptr<Spawner> spawner;       // starts every command inside a sandbox
  std::unique_ptr<EgressNetwork> egress;  // network egress links and the node's rules (prepared on first use)
  std::unique_ptr<JoinFdCache> join_fds;  // the cgroup files of the sandboxes that ran a command most recently
  std::mutex mu;
  std::set<std::string> live;  // ids created or adopted by this process and not destroyed
  // Egress policies (SandboxEgress.cc): the BPF filter, started with the first sandbox that has a network link,
  // and where its refusals go (each sandbox's record, by its network namespace's cookie).
  std::mutex egress_mu;
  std::unique_ptr<EgressFilter> egress_filter;
  std::unique_ptr<NodeResolver> resolver;  // the sandboxes' DNS resolver, started with the filter
  // On a v1 host, the cgroup2 directory of this agent's egress programs, where its spawner (and so every command)
  // lives: <unified>/<parent>/agent-<pid>-<hex>. "" on v2 (each sandbox's own cgroup carries them).
  std::string egress_agent_dir;
  std::mutex logs_mu;
  std::map<uint64_t, std::weak_ptr<ViolationLog>> logs_by_netns;
  std::map<uint32_t, uint64_t> netns_by_address;  // a sandbox's eth0 address -> its cookie (the resolver's clients)
  // Refused writes to protected paths (SandboxFileWatch.cc): the watch, started with the first sandbox that has
  // protected paths, or why it could not be (then not tried again).
  std::mutex filewatch_mu;
  std::unique_ptr<FileWatch> filewatch;
  std::string filewatch_problem;
  ~ContainerShared();  // stops the resolver's, the filter's and the watch's threads before the logs they write to go
};

// The started egress filter and resolver (SandboxEgress.cc); kUnsupported naming what the host lacks.
Result<EgressFilter*> startedEgressFilter(ContainerShared& shared);
// The address the started resolver listens on (host order).
uint32_t resolverAddress(ContainerShared& shared);
// On a v1 host, removes the egress directories of earlier agents that no process is left in.
void removeStaleEgressDirs(ContainerShared& shared);
// The started file watch (SandboxFileWatch.cc); kUnsupported, said once in the log, when the host cannot run it.
Result<FileWatch*> startedFileWatch(ContainerShared& shared);

struct InitProcess {
  pid_t pid = -1;
  uint64_t start_time = 0;
  UniqueFd pidfd;
  bool is_child = false;              // created by this process (then it must be reaped with waitid)
  std::optional<uint32_t> host_root;  // host uid/gid of the sandbox's root when it has a user namespace
  // The agent's hold on that range: let go only once init is reaped (then every process of its pid namespace is
  // gone), never merely because init's lock went with init's files on the way out.
  IdRangeHold lease;
};

class CommandControl;

class ContainerSandbox : public Sandbox {
 public:
  ContainerSandbox(std::shared_ptr<ContainerShared> shared, SandboxSpec spec, InitProcess init,
                   std::unique_ptr<Cgroup> cgroup, bool paused, int64_t oom_kills,
                   std::vector<std::string> protected_in_force = {});
  ~ContainerSandbox() override;

  const SandboxSpec& spec() const override { return spec_; }
  SandboxState state() const override;
  std::string backendName() const override { return backendKindName(BackendKind::kContainer); }

  Result<ExecResult> exec(const ExecRequest& request) override;
  Result<ExecResult> execStream(const ExecRequest& request, ExecSink& sink) override;
  bool supportsStdinFd() const override { return true; }
  Result<LongRunningProcess> spawn(const ExecRequest& request) override;
  Status setMemoryLimit(int64_t bytes) override;
  // Puts the sandbox under the egress filter with its policy (create, adopt): address_ip4 is its eth0's (its
  // queries come from there), resolver_ip4 the resolver its /etc/resolv.conf names; host order.
  // adopted: its processes may be under an earlier agent's programs (moved under ours on a v1 host).
  Status enforceEgress(const EgressPolicy& policy, uint32_t address_ip4, uint32_t resolver_ip4,
                       bool adopted = false);                                // SandboxEgress.cc
  Status setEgress(const EgressPolicy& policy) override;                     // SandboxEgress.cc
  Status setProtectedPaths(const std::vector<std::string>& paths) override;  // ProtectedPaths.cc
  // Puts an adopted sandbox's protected paths back under the file watch (SandboxFileWatch.cc).
  void rewatchProtectedPaths();
  Result<std::vector<Violation>> violations() override;  // SandboxPolicyOps.cc

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
  // Keeps the init pidfd open while an exec or file operation uses it.
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
  // The sandbox's root (O_PATH), for one file operation (under a Use).
  Result<UniqueFd> openRoot() const;
  // Where one file operation resolves path (under a Use): the sandbox's root, or, for a path protection is in
  // the way of, a writable clone of the mount that holds it (ProtectedPaths.cc).
  Result<FileRoute> fileRoute(const std::string& path);
  Result<ExecResult> run(const ExecRequest& request, ExecSink* sink);
  // Sets result.oom_killed when the cgroup counted an OOM kill that no earlier exec reported.
  void noteOomKill(ExecResult& result);
  void keepSpawned(int pidfd);
  void reapSpawned(double timeout_seconds);
  // What exec and spawn share: the command started in the sandbox (same namespaces, cgroup, caps, seccomp)
  // with the given stdio fds.
  struct CommandStdio {
    int stdin_fd = -1, stdout_fd = -1, stderr_fd = -1;
  };
  Result<SpawnedCommand> startCommand(const ExecRequest& request, const CommandStdio& stdio);
  // Terminal execs running now: a pause or destroy hangs them up (their command's group is killed), so a
  // terminal never hangs on a frozen or vanished sandbox.
  void trackTerminal(const std::shared_ptr<CommandControl>& control);
  void hangUpTerminalsLocked();  // under mu_

  std::shared_ptr<ContainerShared> shared_;
  SandboxSpec spec_;
  // Files the API creates inside belong to the sandbox's root (host id host_root); nullopt: host root.
  std::optional<uint32_t> owner_;
  InitProcess init_;
  std::unique_ptr<Cgroup> cgroup_;
  // The cgroup's files a new command writes "0" into to join it (opened through shared_->join_fds: host files,
  // never passed on to anything inside).
  std::vector<std::string> procs_files_;
  // The memory controller's directory (found from the cgroup's procs files) for setMemoryLimit; "" = none.
  std::string memory_dir_;
  std::mutex memory_mu_;  // one limit change at a time (v1 writes two files in a value-dependent order)

  mutable std::mutex mu_;
  std::condition_variable idle_;
  SandboxState state_ = SandboxState::kRunning;
  bool destroyed_ = false;
  int users_ = 0;
  // Copies of the pidfds of spawn()ed processes: they are the agent's children, and the sandbox's init cannot
  // finish dying before they are reaped, so destroy() reaps those their owner has not (under mu_).
  std::vector<UniqueFd> spawned_;
  std::vector<std::weak_ptr<CommandControl>> terminals_;  // under mu_
  // OOM kills of the cgroup already reported (or there before adoption).
  std::atomic<int64_t> oom_seen_{0};
  // What its processes were refused; shared with whatever reports refusals (egress filter, resolver).
  std::shared_ptr<ViolationLog> violations_ = std::make_shared<ViolationLog>();
  std::mutex policy_mu_;  // one policy change at a time
  // Under the egress filter (enforceEgress): its network namespace's cookie (0 = not), the resolver it may query
  // and the policy in force now (spec_.egress is the one it was created with). Under policy_mu_.
  uint64_t netns_cookie_ = 0;
  uint32_t address_ip4_ = 0;
  uint32_t resolver_ip4_ = 0;
  EgressPolicy egress_;
  void forgetEgress();
  // Protected paths in force (the list changes at runtime; spec_ keeps the one it was created with).
  std::unique_ptr<PathProtection> protection_;
  // Under the file watch while it has protected paths (SandboxFileWatch.cc): its mount namespace's inode (0 = not
  // known yet). Under policy_mu_.
  uint32_t mntns_ = 0;
  void watchProtectedPaths();
  void forgetFileWatch();
};

// The files a freshly cloned (single-threaded) child writes "0" into to join the sandbox cgroup. On cgroup v1
// that is `tasks`: it moves just the writing thread (for a new child, the whole process) and so skips the
// global threadgroup rwsem a `cgroup.procs` write takes, whose write side waits for an RCU grace period
// whenever it was idle (most of the join's cost and all of its multi-millisecond tail). v2 keeps cgroup.procs.
std::vector<std::string> cgroupJoinFiles(const Cgroup& cgroup);
// Kills an init (SIGKILL through its pidfd; the kernel then kills its whole pid namespace) and waits until
// it is gone, reaping it when it is our child.
Status killAndWaitInit(InitProcess& init, double timeout_seconds);
// The directory of the cgroup's memory controller (v1 memory hierarchy or the v2 directory); "" if none.
std::string memoryControlDir(const Cgroup& cgroup);
nlohmann::json specToJson(const SandboxSpec& spec);
Result<SandboxSpec> specFromJson(const nlohmann::json& json);

}  // namespace dsec::backends
