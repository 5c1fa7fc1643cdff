// What the node core reports about its sandboxes, itself and its sessions: plain values, no wire format. The
// API edge maps them to JSON (launcher/api NodeJson.h); the core never spells a field name.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dsec/backends/BackendKind.h"
#include "dsec/backends/Sandbox.h"
#include "dsec/launcher/node/CreateParams.h"
#include "dsec/launcher/node/ImageSource.h"
#include "dsec/launcher/node/Sessions.h"
#include "dsec/launcher/node/StateRecord.h"
#include "dsec/placement/Admission.h"
#include "dsec/placement/DensityController.h"

namespace dsec::launcher {

// The cores (and memory nodes) a sandbox is bound to; empty strings: the whole node.
struct CpuBooking {
  std::string cpuset;
  std::string mems;
};

// Something the node did to or saw in a sandbox, kept in a short history with the sandbox's info.
struct SandboxEvent {
  enum class Kind { kOomKill, kDensityAction };
  Kind kind = Kind::kOomKill;
  double unix_seconds = 0;
  std::string density_action;  // kDensityAction: placement::densityActionName of what was done
  std::string reason;          // kDensityAction: why
  int64_t oom_kills = 0;       // kOomKill: the sandbox's count so far
  std::string message;         // kOomKill: for the user
};

// What the density controller did to one sandbox; unset times: never.
struct SandboxDensity {
  std::optional<double> reclaimed_unix;
  int reclaims = 0;
  std::optional<double> paused_unix;
  int pauses = 0;
  std::optional<double> resumed_unix;
  std::vector<SandboxEvent> events;  // oldest first
};

struct SandboxInfo {
  std::string id;
  std::string node;
  CreateParams params;
  backends::SandboxState state = backends::SandboxState::kRunning;
  double created_unix = 0;
  double last_active_unix = 0;
  std::optional<PausedBy> paused_by;  // set while paused
  backends::SandboxUsage usage;       // zeros when the backend cannot say
  std::optional<CpuBooking> cpu;      // unset on a node without CPU QoS books
  std::optional<SandboxDensity> density;
};

// One action of the density controller, node-wide.
struct DensityActionRecord {
  uint64_t seq = 0;
  std::string action;   // placement::densityActionName
  std::string sandbox;  // "" for node-wide actions (admission)
  double unix_seconds = 0;
  std::string reason;
};

struct PressureInfo {
  std::string source;  // the PSI file read
  bool per_cgroup = false;
  bool available = false;
  double memory_some_avg10 = 0;
  double memory_full_avg10 = 0;
  double cpu_some_avg10 = 0;
};

// The density controller's state (docs/density.md); ratios and CPU figures rounded to two decimals.
struct DensityNodeInfo {
  bool overcommit = false;
  double memory_ratio = 1;
  double cpu_ratio = 1;
  bool admitting = true;
  placement::PressureLevel level = placement::PressureLevel::kCalm;
  std::string reason;
  int64_t memory_capacity_bytes = 0;
  int64_t memory_used_bytes = 0;
  int64_t memory_committed_bytes = 0;
  int64_t memory_admissible_bytes = 0;
  double cpus = 0;
  double cpu_committed = 0;
  double cpu_used = 0;
  PressureInfo pressure;
  int64_t oom_kills = 0;
  int64_t paused_sandboxes = 0;
  uint64_t refusals = 0;
  std::map<std::string, uint64_t> actions_total;  // every action name, 0 when never taken
  std::vector<DensityActionRecord> last_actions;  // oldest first
};

// CPU QoS books (docs/qos.md). When disabled only `disabled_reason` says anything.
struct CpuQosNodeInfo {
  bool enabled = false;
  std::string disabled_reason;
  bool exclusive_pool = false;
  int cores = 0;
  int numa_domains = 0;
  int dedicated_cores = 0;
  int free_dedicated_cores = 0;
  std::string shared_cpuset;
  int latency_sandboxes = 0;
  int batch_sandboxes = 0;
};

// What the node admits by (placement/Admission.h): its density controller's ratios and books, pressure, free
// dedicated cores and sandbox slots. GET /v1/node "admission"; the gateway places with it (docs/fleet.md).
struct AdmissionInfo {
  placement::NodeAdmission state;
  placement::PressureLevel level = placement::PressureLevel::kCalm;
  std::string reason;  // what holds the level above calm ("" when calm)
};

struct NodeCapacity {
  int64_t max_sandboxes = 0;
  int64_t free_sandboxes = 0;
  int64_t memory_bytes = 0;
  int64_t memory_committed_bytes = 0;
  int64_t cpus = 0;
};

struct NodeInfo {
  std::string node;
  std::string fleet;
  std::vector<backends::BackendKind> backends;                        // usable here, in the order the node offers them
  std::map<backends::BackendKind, std::string> unavailable_backends;  // with why not
  std::map<backends::BackendKind, std::string> backend_notes;         // how an available one runs here ("TCG: ...")
  NodeCapacity capacity;
  size_t sandboxes = 0;
  std::optional<DensityNodeInfo> density;
  std::optional<AdmissionInfo> admission;
  bool user_namespaces = true;
  std::string isolation_warning;  // "" when sandboxes are isolated as usual
  std::optional<CpuQosNodeInfo> qos;
  std::optional<SharedStoreInfo> layer_store;  // the shared layer store this node mounts from (docs/layer-store.md)
};

// A renewed session with the infos of its sandboxes (which stay paused until used).
struct AttachedSession {
  Session session;
  std::vector<SandboxInfo> sandboxes;
};

struct DeletedSession {
  std::string name;
  int destroyed = 0;  // sandboxes destroyed with it
};

}  // namespace dsec::launcher
