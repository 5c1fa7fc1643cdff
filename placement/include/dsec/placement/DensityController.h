// The node's density controller, as pure decision logic (docs/density.md). Fed one sample of the node and its
// sandboxes per tick, it keeps the overcommit ratios admission uses (memory and CPU: committed limits may
// reach capacity x ratio), a pressure level with hysteresis, and returns the actions to take, in order:
//   level 1 "reclaim":  reclaim memory of idle sandboxes;
//   level 2 "stop":     stop admitting new sandboxes;
//   level 3 "pause":    pause the lowest-priority idle sandboxes (batch before latency, longest idle first).
// As pressure falls it releases in reverse: density-paused sandboxes are resumed (last paused first), then
// admission reopens. Paused sandboxes also resume on their next request. It never destroys a sandbox.
// Nothing here touches the system: the node agent's DensityLoop samples and executes. Admission against the ratios
// is placement/Admission.h, the one rule the node and the fleet gateway share.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dsec/common/Result.h"

namespace dsec::placement {

struct DensityConfig {
  // false = static limits: both ratios fixed at 1.0 and no actions (the benchmark's baseline).
  bool overcommit = true;

  // Memory ratio: starts high enough for a calm node to take thousands of idle sandboxes, rises by
  // ratio_up per calm tick (after calm_hold_seconds of calm) to the bound, falls by ratio_down per tick at
  // level >= 2. While sandboxes hold a real share of the node (use_bound_min_fraction of capacity), it is
  // also kept under what their measured use allows: target_utilisation x committed / used.
  double memory_ratio_start = 8.0;
  double memory_ratio_min = 1.0;
  double memory_ratio_max = 32.0;
  double target_utilisation = 0.8;
  double use_bound_min_fraction = 0.25;
  // CPU is compressible (batch sandboxes run SCHED_IDLE), so its ratio starts at its bound and only falls
  // when the sandboxes themselves saturate the CPUs: their CPU use >= cpu_busy_fraction of the node while
  // CPU PSI some avg10 >= cpu_psi_some. Host CPU pressure from other work does not close admission.
  double cpu_ratio_start = 1024.0;
  double cpu_ratio_min = 2.0;
  double cpu_ratio_max = 1024.0;
  double cpu_busy_fraction = 0.85;
  double cpu_psi_some = 50.0;
  double ratio_up = 1.25;
  double ratio_down = 0.8;
  double calm_hold_seconds = 3.0;

  // Level thresholds, enter / leave (hysteresis), for levels 1, 2, 3.
  // Working-set fraction of capacity (memory the sandboxes hold, cache not counted).
  double use_enter[3] = {0.70, 0.85, 0.93};
  double use_leave[3] = {0.60, 0.78, 0.88};
  // Memory PSI, percent of time stalled, avg10.
  double psi_some_enter[3] = {10, 25, 40};
  double psi_some_leave[3] = {5, 15, 25};
  double psi_full_enter[3] = {5, 10, 20};
  double psi_full_leave[3] = {2, 5, 10};
  // An OOM kill caused by the node's own limit holds the level at >= 2 for this long.
  double oom_hold_seconds = 30;
  // The level falls one step at a time, after every signal stayed under the leave threshold this long.
  double release_hold_seconds = 5;

  // Candidates: a sandbox is idle once nothing ran in it for this long.
  double reclaim_min_idle_seconds = 30;
  double reclaim_again_seconds = 60;  // a sandbox is reclaimed at most this often
  int max_reclaims_per_tick = 16;
  double pause_min_idle_seconds = 60;
  int max_pauses_per_tick = 2;
  int max_resumes_per_tick = 4;
};

struct NodeSample {
  double t = 0;                        // monotonic seconds
  int64_t memory_capacity_bytes = 0;   // physical memory, or the configured capacity
  int64_t memory_used_bytes = 0;       // working set the controller judges (see DensityLoop)
  int64_t memory_committed_bytes = 0;  // sum of the sandboxes' memory limits
  double cpu_capacity = 0;             // CPUs
  double cpu_committed = 0;            // sum of the sandboxes' CPU limits
  double cpu_used = 0;                 // CPUs the sandboxes used over the last interval
  bool psi_available = false;
  double memory_some_avg10 = 0;  // percent
  double memory_full_avg10 = 0;
  double cpu_some_avg10 = 0;
  int64_t oom_kills = 0;  // cumulative OOM kills caused by the node's limit
};

struct SandboxView {
  std::string id;
  bool latency = false;      // qos latency (paused last)
  double idle_seconds = 0;   // since the last request or exec ended
  bool busy = false;         // a request or exec in flight: never a candidate
  int64_t memory_bytes = 0;  // in use
  bool paused = false;       // by anyone
  bool paused_by_density = false;
  std::string session;  // informational
};

enum class DensityActionKind { kReclaim, kStopAdmitting, kPause, kResume, kReopenAdmission };
const char* densityActionName(DensityActionKind kind);

struct DensityAction {
  DensityActionKind kind;
  std::string sandbox_id;  // empty for admission changes
  std::string reason;
};

enum class PressureLevel { kCalm = 0, kReclaim = 1, kStopAdmitting = 2, kPause = 3 };
const char* pressureLevelName(PressureLevel level);
Result<PressureLevel> parsePressureLevel(const std::string& name);

struct DensityDecision {
  double memory_ratio = 1;
  double cpu_ratio = 1;
  bool admitting = true;
  PressureLevel level = PressureLevel::kCalm;
  std::string reason;  // what holds the level above calm ("" when calm)
  std::vector<DensityAction> actions;
};

class DensityController {
 public:
  explicit DensityController(DensityConfig config = {});

  DensityDecision step(const NodeSample& sample, const std::vector<SandboxView>& sandboxes);
  const DensityDecision& current() const { return current_; }
  const DensityConfig& config() const { return config_; }

 private:
  int targetLevel(const NodeSample& s, std::string* reason);
  void moveRatios(const NodeSample& s);
  // Drops state about sandboxes that are gone and pauses that someone else undid; adopts density pauses made
  // by an earlier agent.
  void trackSandboxes(const std::vector<SandboxView>& sandboxes);
  // Reclaim actions for idle candidates (lowest priority first) not reclaimed too recently.
  void addReclaims(const NodeSample& s, const std::vector<const SandboxView*>& candidates, const std::string& reason);
  // Pause actions for idle candidates (lowest priority first).
  void addPauses(const std::vector<const SandboxView*>& candidates, const std::string& reason);

  DensityConfig config_;
  DensityDecision current_;
  int level_ = 0;
  int raw_level_ = 0;        // the level the current signals alone enter (no hysteresis)
  double below_since_ = -1;  // when every signal first stayed under the leave threshold of level_
  double calm_since_ = -1;
  double last_oom_t_ = -1e18;
  int64_t last_oom_kills_ = -1;
  bool have_sample_ = false;
  double last_t_ = 0;
  std::map<std::string, double> reclaimed_at_;  // id -> t of our last reclaim
  std::vector<std::string> paused_order_;       // ids we paused, oldest first
};

}  // namespace dsec::placement
