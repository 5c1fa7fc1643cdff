// The node agent: the registry of live sandboxes over its injected parts (NodeParts.h: a backend, an image source,
// a state store). It validates admission, creates and destroys sandboxes, saves each sandbox's record in the
// state store (StateRecord.h, so a restarted agent re-adopts it), and enforces absolute and idle timeouts from
// a reaper thread. It also holds the node's sessions (Sessions.h): the reaper pauses the
// sandboxes of a session whose lease lapsed and destroys them once its retention has passed.
//
// Locking: `mu_` guards only the registry map and the admission count; it is never held across a backend
// call, so concurrent creates run their slow parts in parallel. Each sandbox has its own mutex that
// serialises state changes (pause, resume, destroy, transparent resume); execs and file operations hold a
// lease (an activity count) instead, so many can run at once on one sandbox.
//
// Everything it reports is a typed value (Infos.h); the API edge decides how it looks on the wire.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dsec/backends/Sandbox.h"
#include "dsec/common/ProcessLimits.h"
#include "dsec/common/Result.h"
#include "dsec/fs3/LayerMounter.h"
#include "dsec/fs3/SharedStore.h"
#include "dsec/launcher/node/CreateParams.h"
#include "dsec/launcher/node/DensityLoop.h"
#include "dsec/launcher/node/Infos.h"
#include "dsec/launcher/node/JobOwnership.h"
#include "dsec/launcher/node/Metrics.h"
#include "dsec/launcher/node/NodeFncall.h"
#include "dsec/launcher/node/NodeParts.h"
#include "dsec/launcher/node/Sessions.h"
#include "dsec/launcher/node/Snapshots.h"
#include "dsec/launcher/node/StateRecord.h"
#include "dsec/placement/DensityController.h"

namespace dsec::launcher {

// The fleet name of `dsec serve` and `dsec-launch` when none is given (clients default to it too).
inline constexpr const char* kDefaultFleetName = "default";

// The machine backends (microvm, vm; docs/vm-backends.md).
struct VmNodeOptions {
  bool enabled = true;
  std::string kernel_dir;                      // "" : the guest kernel install-deps fetched
  std::string accel = "auto";                  // auto | kvm | tcg
  int64_t default_memory_bytes = 512ll << 20;  // guest RAM of a create that gives no memory limit
};

struct NodeOptions {
  std::string root;
  std::string node_name = "n0";
  std::string fleet_name = kDefaultFleetName;
  int64_t max_sandboxes = 4096;
  double reaper_interval_seconds = 1.0;
  std::string cgroup_parent;  // empty: cgroupParentForRoot(root)
  // A simulated node: makeNodeParts picks the simulated parts (NodeParts.h); sandboxes hold no processes, creates
  // are validated and admitted as on a real node, images are in memory and records are not kept (docs/fleet.md).
  bool simulate = false;
  FncallOptions fncall;  // the fncall backend (NodeFncall.h)
  VmNodeOptions vm;
  // The density controller (docs/density.md): density.overcommit = false is static limits (ratio 1.0).
  placement::DensityConfig density;
  int64_t memory_capacity_bytes = 0;  // 0: physical memory; else what admission and the controller count
  double density_interval_seconds = 1.0;
  // CPU QoS (docs/qos.md, CpuAllocator.h): false makes every sandbox plain (no SCHED_IDLE, no cpusets);
  // cpu_exclusive_pool moves batch sandboxes off the cores dedicated to latency ones.
  bool cpu_qos = true;
  bool cpu_exclusive_pool = true;
  // Every sandbox in a user namespace of its own (docs/security.md). false is an operator's explicit opt-out for
  // kernels without user namespaces or idmapped mounts: sandbox root is then host root; logged and shown in
  // /v1/node and `dsec doctor`.
  bool user_namespaces = true;
  // IPv4 blocks no sandbox reaches whatever its egress policy (besides the node itself, link-local and the
  // sandboxes' subnet, always): the fleet's gateways, the Slurm controller, other nodes' agents.
  std::vector<std::string> egress_never;
  // The Slurm job the agent runs in ("" outside Slurm; the programs pass SLURM_JOB_ID). It owns the sandboxes the
  // agent makes or re-adopts, and its epilog destroys them (JobOwnership.h). At start, records of any other job
  // are reaped, not adopted, except those of adopt_jobs: other jobs, still running, whose sandboxes this agent
  // takes over (a --join agent: the fleet's job).
  std::string slurm_job;
  std::vector<std::string> adopt_jobs;
  std::string job_registry_dir = kJobRegistryDir;  // where the job's claim is left for its epilog
  // Snapshots (Snapshots.h, docs/snapshots.md): where they are kept ("" = <root>/snapshots; a fleet passes its
  // shared <fleet root>/snapshots) and after how long the reaper removes them (0 = kept until deleted).
  std::string snapshot_dir;
  double snapshot_retention_seconds = 0;
  // The cluster's shared layer store (docs/layer-store.md): layers this node's store lacks are mounted from it on
  // demand, through a chunk cache of chunk_cache_bytes in <root>/chunk-cache. "" : none.
  // "http://HOST:PORT" names a chunk server (`dsec layer serve`). The edge that starts the node opens it as
  // shared_store (the node core speaks no HTTP); when that is null, makeNodeParts opens store_dir as a directory.
  std::string store_dir;
  std::shared_ptr<fs3::SharedStore> shared_store;
  int64_t chunk_cache_bytes = 8ll << 30;
};

struct ForkResult {
  SnapshotMeta snapshot;
  std::vector<SandboxInfo> sandboxes;
};

class CpuAllocator;
class CpuReservation;

// "dsec" for /var/lib/dsec, else "dsec-<8 hex of a hash of the root path>".
std::string cgroupParentForRoot(const std::string& root);

struct SandboxRecord {
  std::string id;
  CreateParams params;
  double created_unix = 0;
  std::atomic<double> last_active_unix{0};
  std::atomic<double> last_active_mono{0};
  std::atomic<int> active{0};  // execs and file operations in flight
  // params.timeout, for the reaper's look without the lock (setTimeout changes both under mu).
  std::atomic<double> timeout{0};

  std::mutex mu;  // serialises pause/resume/destroy and the transparent resume
  bool destroyed = false;
  // Why the sandbox is paused while it is (kNone while it runs). Under mu.
  PausedBy paused_by = PausedBy::kNone;
  // Declared before `sandbox` so the sandbox handle goes first when the record dies.
  std::unique_ptr<fs3::ImageMount> mount;
  std::unique_ptr<backends::Sandbox> sandbox;

  void touch();
};

// Keeps a sandbox in use (not idle, not freed) while an exec or file operation runs.
class SandboxLease {
 public:
  explicit SandboxLease(std::shared_ptr<SandboxRecord> record);
  SandboxLease(SandboxLease&&) = default;
  SandboxLease& operator=(SandboxLease&&) = delete;
  SandboxLease(const SandboxLease&) = delete;
  ~SandboxLease();
  backends::Sandbox& sandbox() const { return *record_->sandbox; }
  const std::string& id() const { return record_->id; }

 private:
  std::shared_ptr<SandboxRecord> record_;
};

class NodeAgent : private DensityHost {
 public:
  // Over the parts options ask for (makeNodeParts), or over given ones.
  static Result<std::unique_ptr<NodeAgent>> start(const NodeOptions& options, Metrics* metrics);
  static Result<std::unique_ptr<NodeAgent>> start(const NodeOptions& options, Metrics* metrics, NodeParts parts);
  ~NodeAgent();
  NodeAgent(const NodeAgent&) = delete;
  NodeAgent& operator=(const NodeAgent&) = delete;

  // Stops the reaper. With destroy_sandboxes every sandbox is destroyed; otherwise they keep running and
  // their state files stay for the next agent. Idempotent.
  void shutdown(bool destroy_sandboxes);

  Result<SandboxInfo> create(const CreateParams& requested);
  Result<SandboxInfo> info(const std::string& id);
  // The sandboxes whose labels include every one of `labels`.
  std::vector<SandboxInfo> list(const std::map<std::string, std::string>& labels);
  Status destroy(const std::string& id, const std::string& reason = "request");
  Result<SandboxInfo> pause(const std::string& id);
  Result<SandboxInfo> resume(const std::string& id);
  // Stages (NodeAgentPolicy.cc): the egress policy and protected paths replaced while the sandbox runs, and what
  // its processes were refused.
  Result<SandboxInfo> setEgress(const std::string& id, const backends::EgressPolicy& policy);
  Result<SandboxInfo> setProtectedPaths(const std::string& id, const std::vector<std::string>& paths);
  // The sandbox ends `seconds` from now (0: no timeout): its timeout becomes its age plus that.
  Result<SandboxInfo> setTimeout(const std::string& id, double seconds);
  Result<std::vector<backends::Violation>> violations(const std::string& id);
  // For exec and file operations: resumes a paused sandbox and counts as activity until the lease ends.
  Result<SandboxLease> use(const std::string& id);

  // Sessions (docs/api.md): PUT creates or renews, attach renews and lists the sandboxes' infos, DELETE
  // destroys the session's sandboxes.
  Result<Session> putSession(const std::string& name, const SessionSettings& settings);
  Result<Session> getSession(const std::string& name);
  std::vector<Session> listSessions();
  Result<AttachedSession> attachSession(const std::string& name, std::optional<double> lease);
  Result<DeletedSession> deleteSession(const std::string& name);
  SessionTable& sessions() { return *sessions_; }

  // Snapshots, restores and forks (NodeAgentSnapshots.cc, docs/snapshots.md). name "" is generated; processes asks
  // for memory and processes too, which only machine backends carry (a container's is kInvalidArgument).
  Result<SnapshotMeta> snapshot(const std::string& id, const std::string& name, bool processes);
  // One snapshot, then `count` restores with the source's parameters; a failure destroys the copies made.
  Result<ForkResult> fork(const std::string& id, int count, bool processes);
  Result<SandboxInfo> restore(const std::string& name, const RestoreOptions& options);
  std::vector<SnapshotMeta> listSnapshots();
  Result<SnapshotMeta> getSnapshot(const std::string& name);
  // Also removes its layer from this node's store when no sandbox here uses it; kConflict while another
  // snapshot is stacked on it.
  Status deleteSnapshot(const std::string& name);

  NodeInfo nodeInfo();
  Result<std::vector<LayerStatus>> layers();
  void renderGauges(std::string* out);

  const NodeOptions& options() const { return options_; }
  Metrics& metrics() { return *metrics_; }
  int64_t nodeMemoryBytes() const override { return node_memory_bytes_; }
  // Why the container backend cannot create sandboxes here ("" when it can).
  const std::string& unavailableReason() const { return unavailable_reason_; }
  size_t sandboxCount();
  // The fncall backend (POST /v1/call); null when unusable here, with the reason (NodeAgentFncall.cc).
  NodeFncall* fncall() { return fncall_.get(); }
  const std::string& fncallUnavailableReason() const { return fncall_unavailable_; }
  // The backend that makes sandboxes of `kind`: the container backend for containers, a machine backend for
  // microvm and vm; null when this node has none of that kind.
  backends::Backend* backendFor(backends::BackendKind kind) const;
  // The backend a state record's sandbox came from (its "backend" field names it; the container backend
  // otherwise, and for kinds this node no longer runs).
  backends::Backend* backendForState(const nlohmann::json& backend_state) const;

 private:
  // DensityHost: what the density loop samples and saves.
  std::vector<std::shared_ptr<SandboxRecord>> sampleRegistry(
      const std::function<void(int64_t memory, double cpus)>& with_sums) override;
  std::shared_ptr<SandboxRecord> findRecord(const std::string& id) override { return find(id); }
  Status saveRecord(SandboxRecord& record) override { return persist(record); }
  const std::string& nodeName() const override { return options_.node_name; }
  NodeAgent(const NodeOptions& options, Metrics* metrics, NodeParts parts);
  void checkBackend();
  Status adoptAll();                  // fails only on records it must not touch (a newer dsec's)
  bool adoptOne(StoredState& entry);  // false: reaped instead
  int reapLeftovers();
  void reaperLoop();
  void reapExpired();
  void reapSessions();
  // Freezes a sandbox of a lapsed session and reclaims its memory (paused_by "lease").
  void pauseForLease(const std::string& id, const std::string& session);
  void loadSessions();
  bool sessionNotRenewed(const std::string& session, double now_wall);
  // Why the reaper destroys rec now (its timeout, its idle timeout), or "" (rec.mu held).
  std::string expiryReasonLocked(SandboxRecord& rec, double now_wall, double now_mono);
  // destroy() when due(rec), called under the record's lock, names a reason; kConflict when it names none.
  Status destroyIfDue(const std::string& id, const std::function<std::string(SandboxRecord&)>& due);
  // Holds the node directory and, inside a Slurm job, leaves the job's claim for its epilog.
  Status claimDirectory();
  bool ownedByThisJob(const std::string& slurm_job) const;
  std::shared_ptr<SandboxRecord> find(const std::string& id);
  Status persist(SandboxRecord& record);
  // The steps of a create (NodeAgent.cc). A slot counts the create against max_sandboxes while it runs; it is
  // refused naming the limit when the agent's open files or the host's pids have no room for another sandbox.
  // A create's params with what its backend needs filled in (a VM's memory), or why the backend is not here.
  Result<CreateParams> withBackendDefaults(const CreateParams& requested) const;
  Status reserveCreateSlot();
  void releaseCreateSlot();
  Status checkCreatable(const CreateParams& params);  // its session may take a sandbox, its image is here
  // Mounts, creates and records the sandbox and adds it to its session; undoes what it did when one fails.
  Status startSandbox(SandboxRecord& record, const CpuReservation& cores);
  SandboxInfo infoLocked(SandboxRecord& record);
  SandboxInfo infoOf(SandboxRecord& record);  // takes the record's mutex
  backends::SandboxSpec sandboxSpec(const SandboxRecord& record, const CpuReservation& cores) const;
  // Snapshots (NodeAgentSnapshots.cc): the store, the reaper's retention and orphan-layer pass, and the backend
  // call of a create (a machine snapshot's restore, else create).
  Status startSnapshots();
  void reapSnapshots();
  Result<std::unique_ptr<backends::Sandbox>> makeSandbox(const SandboxRecord& record,
                                                         const backends::SandboxSpec& spec);
  Result<CreateParams> restoreParams(const SnapshotMeta& meta, const RestoreOptions& options);
  std::unique_ptr<SnapshotStore> snapshots_;
  std::atomic<double> snapshots_reaped_mono_{0};

  NodeOptions options_;
  Metrics* metrics_;
  StateDirLock dir_lock_;  // real parts only; released when the agent shuts down
  int64_t node_memory_bytes_ = 0;
  std::unique_ptr<ImageSource> images_;
  std::unique_ptr<StateStore> state_;
  std::unique_ptr<backends::Backend> backend_;
  std::map<backends::BackendKind, std::unique_ptr<backends::Backend>> machine_backends_;
  std::map<backends::BackendKind, std::string> machine_unavailable_;
  std::map<backends::BackendKind, std::string> machine_notes_;
  bool backend_has_cgroups_ = true;
  bool backend_runs_processes_ = true;
  std::string unavailable_reason_;
  std::string cgroup_parent_;
  std::unique_ptr<SessionTable> sessions_;
  // After the mounter and backend its workers use, so it goes first (NodeAgentFncall.cc).
  void startFncall();
  void addFncallInfo(NodeInfo* info) const;
  std::unique_ptr<NodeFncall> fncall_;
  std::string fncall_unavailable_;
  std::unique_ptr<DensityLoop> density_;
  std::unique_ptr<CpuAllocator> cpu_;  // CPU QoS: dedicated cores of latency sandboxes (CpuAllocator.h)

  // The limits the agent cannot raise (ProcessLimits.h): one fd per idle container sandbox (its init's pidfd,
  // ContainerSandbox.h) plus 4096 for connections, commands in flight and the cgroup files kept for recent
  // commands; 512 pids left to the rest of the host.
  SandboxRoom room_{1, 4096, 512};

  std::mutex mu_;
  std::map<std::string, std::shared_ptr<SandboxRecord>> sandboxes_;
  int64_t pending_creates_ = 0;

  std::mutex reaper_mu_;
  std::condition_variable reaper_cv_;
  bool stopping_ = false;
  bool shut_down_ = false;
  std::thread reaper_;
};

// Seconds since the epoch, and RFC 3339 UTC of such a time.
double wallSeconds();

}  // namespace dsec::launcher
