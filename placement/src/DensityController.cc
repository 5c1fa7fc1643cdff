#include "dsec/placement/DensityController.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

namespace dsec::placement {
namespace {

std::string fmt(const char* format, double a, double b = 0, double c = 0) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), format, a, b, c);
  return buf;
}

std::string mib(int64_t bytes) { return fmt("%.0f MiB", static_cast<double>(bytes) / (1 << 20)); }

// Highest level whose enter threshold `value` reaches (0..3).
int enterLevel(double value, const double (&enter)[3]) {
  int level = 0;
  for (int i = 0; i < 3; ++i) {
    if (value >= enter[i]) level = i + 1;
  }
  return level;
}

// Lower priority first: batch before latency, then the longest idle.
bool lowerPriorityFirst(const SandboxView* a, const SandboxView* b) {
  if (a->latency != b->latency) return !a->latency;
  if (a->idle_seconds != b->idle_seconds) return a->idle_seconds > b->idle_seconds;
  return a->id < b->id;
}

}  // namespace

const char* densityActionName(DensityActionKind kind) {
  switch (kind) {
    case DensityActionKind::kReclaim:
      return "reclaim";
    case DensityActionKind::kStopAdmitting:
      return "stop_admitting";
    case DensityActionKind::kPause:
      return "pause";
    case DensityActionKind::kResume:
      return "resume";
    case DensityActionKind::kReopenAdmission:
      return "reopen_admission";
  }
  return "?";
}

const char* pressureLevelName(PressureLevel level) {
  switch (level) {
    case PressureLevel::kCalm:
      return "calm";
    case PressureLevel::kReclaim:
      return "reclaim";
    case PressureLevel::kStopAdmitting:
      return "stop_admitting";
    case PressureLevel::kPause:
      return "pause";
  }
  return "?";
}

Result<PressureLevel> parsePressureLevel(const std::string& name) {
  for (auto level :
       {PressureLevel::kCalm, PressureLevel::kReclaim, PressureLevel::kStopAdmitting, PressureLevel::kPause}) {
    if (name == pressureLevelName(level)) return level;
  }
  return Error::invalid("unknown pressure level '" + name + "' (calm, reclaim, stop_admitting, pause)");
}

DensityController::DensityController(DensityConfig config) : config_(config) {
  if (config_.overcommit) {
    current_.memory_ratio = config_.memory_ratio_start;
    current_.cpu_ratio = config_.cpu_ratio_start;
  }
}

int DensityController::targetLevel(const NodeSample& s, std::string* reason) {
  const DensityConfig& c = config_;
  if (last_oom_kills_ >= 0 && s.oom_kills > last_oom_kills_) last_oom_t_ = s.t;
  last_oom_kills_ = s.oom_kills;
  double use = s.memory_capacity_bytes > 0
                   ? static_cast<double>(s.memory_used_bytes) / static_cast<double>(s.memory_capacity_bytes)
                   : 0;
  bool oom_recent = s.t - last_oom_t_ < c.oom_hold_seconds;

  // Going up is immediate: the highest level any signal enters.
  int up = enterLevel(use, c.use_enter);
  std::string why;
  if (up > 0) why = fmt("memory in use %.0f%% of ", use * 100) + mib(s.memory_capacity_bytes);
  if (s.psi_available) {
    int some = enterLevel(s.memory_some_avg10, c.psi_some_enter);
    int full = enterLevel(s.memory_full_avg10, c.psi_full_enter);
    if (some > up) why = fmt("memory PSI some avg10 %.1f%%", s.memory_some_avg10);
    up = std::max(up, some);
    if (full > up) why = fmt("memory PSI full avg10 %.1f%%", s.memory_full_avg10);
    up = std::max(up, full);
  }
  if (oom_recent && up < 2) {
    up = 2;
    why = fmt("OOM kill under the node's memory limit %.0f s ago", s.t - last_oom_t_);
  }
  raw_level_ = up;
  if (up > level_) {
    level_ = up;
    below_since_ = -1;
    *reason = why;
    return level_;
  }

  // Going down: one level at a time, after every signal stayed under the current level's leave threshold.
  if (level_ > 0) {
    int i = level_ - 1;
    bool below = use < c.use_leave[i] && !(oom_recent && level_ <= 2);
    if (s.psi_available) {
      below = below && s.memory_some_avg10 < c.psi_some_leave[i] && s.memory_full_avg10 < c.psi_full_leave[i];
    }
    if (!below) {
      below_since_ = -1;
    } else if (below_since_ < 0) {
      below_since_ = s.t;
    } else if (s.t - below_since_ >= c.release_hold_seconds) {
      --level_;
      below_since_ = level_ > 0 ? s.t : -1;
    }
  }
  if (level_ > 0) {
    *reason =
        !why.empty() ? why : fmt("releasing: memory in use %.0f%%, PSI some %.1f%%", use * 100, s.memory_some_avg10);
  }
  return level_;
}

void DensityController::moveRatios(const NodeSample& s) {
  const DensityConfig& c = config_;
  DensityDecision& d = current_;
  bool calm_long = level_ == 0 && calm_since_ >= 0 && s.t - calm_since_ >= c.calm_hold_seconds;
  if (level_ >= 2) {
    d.memory_ratio = std::max(c.memory_ratio_min, d.memory_ratio * c.ratio_down);
  } else if (calm_long) {
    d.memory_ratio = std::min(c.memory_ratio_max, d.memory_ratio * c.ratio_up);
  }
  // While sandboxes hold a real share of the node, stay under what their measured use allows.
  if (s.memory_capacity_bytes > 0 && s.memory_used_bytes > 0 &&
      static_cast<double>(s.memory_used_bytes) >=
          c.use_bound_min_fraction * static_cast<double>(s.memory_capacity_bytes)) {
    double bound =
        c.target_utilisation * static_cast<double>(s.memory_committed_bytes) / static_cast<double>(s.memory_used_bytes);
    d.memory_ratio = std::min(d.memory_ratio, std::max(c.memory_ratio_min, bound));
  }
  bool cpu_saturated = s.cpu_capacity > 0 && s.cpu_used >= c.cpu_busy_fraction * s.cpu_capacity && s.psi_available &&
                       s.cpu_some_avg10 >= c.cpu_psi_some;
  if (cpu_saturated) {
    d.cpu_ratio = std::max(c.cpu_ratio_min, d.cpu_ratio * c.ratio_down);
  } else if (calm_long) {
    d.cpu_ratio = std::min(c.cpu_ratio_max, d.cpu_ratio * c.ratio_up);
  }
}

DensityDecision DensityController::step(const NodeSample& s, const std::vector<SandboxView>& sandboxes) {
  const DensityConfig& c = config_;
  DensityDecision& d = current_;
  d.actions.clear();
  int before = level_;
  std::string reason;
  int level = targetLevel(s, &reason);
  d.level = static_cast<PressureLevel>(level);
  d.reason = reason;
  if (level == 0) {
    if (calm_since_ < 0) calm_since_ = s.t;
  } else {
    calm_since_ = -1;
  }
  have_sample_ = true;
  last_t_ = s.t;
  if (!c.overcommit) {
    // Static limits: ratios stay 1.0, admission only by committed limits, no actions.
    d.memory_ratio = d.cpu_ratio = 1.0;
    d.admitting = true;
    return d;
  }
  moveRatios(s);
  trackSandboxes(sandboxes);

  std::vector<const SandboxView*> candidates;
  for (const auto& v : sandboxes) {
    if (!v.busy) candidates.push_back(&v);
  }
  std::sort(candidates.begin(), candidates.end(), lowerPriorityFirst);

  // Level >= 1: reclaim the idle first (cheap and invisible to them).
  if (level >= 1) addReclaims(s, candidates, reason);
  // Level >= 2: stop admitting (once, on the way up).
  if (level >= 2 && before < 2) d.actions.push_back({DensityActionKind::kStopAdmitting, "", reason});
  // Level 3: pause the lowest-priority idle sandboxes, only while the signals themselves are that high (not
  // while the level is merely held on the way down).
  if (level >= 3 && raw_level_ >= 3) addPauses(candidates, reason);
  // Release in reverse: below level 3 resume what we paused (last paused first), below 2 reopen admission.
  if (level < 3) {
    for (int n = 0; n < c.max_resumes_per_tick && !paused_order_.empty(); ++n) {
      d.actions.push_back({DensityActionKind::kResume, paused_order_.back(), "pressure fell"});
      paused_order_.pop_back();
    }
  }
  if (level < 2 && before >= 2) d.actions.push_back({DensityActionKind::kReopenAdmission, "", "pressure fell"});
  d.admitting = level < 2;
  return d;
}

void DensityController::trackSandboxes(const std::vector<SandboxView>& sandboxes) {
  // Forget sandboxes that are gone, and pauses someone else undid (a request resumed it, or the user did).
  std::set<std::string> present, still_ours;
  for (const auto& v : sandboxes) {
    present.insert(v.id);
    if (v.paused && v.paused_by_density) still_ours.insert(v.id);
  }
  for (auto it = reclaimed_at_.begin(); it != reclaimed_at_.end();) {
    it = present.count(it->first) ? std::next(it) : reclaimed_at_.erase(it);
  }
  std::erase_if(paused_order_, [&](const std::string& id) { return !still_ours.count(id); });
  for (const auto& id : still_ours) {
    // Paused by density in an earlier agent's life: ours to resume too.
    if (std::find(paused_order_.begin(), paused_order_.end(), id) == paused_order_.end()) paused_order_.push_back(id);
  }
}

void DensityController::addReclaims(const NodeSample& s, const std::vector<const SandboxView*>& candidates,
                                    const std::string& reason) {
  const DensityConfig& c = config_;
  int n = 0;
  for (const SandboxView* v : candidates) {
    if (n >= c.max_reclaims_per_tick) break;
    if (v->idle_seconds < c.reclaim_min_idle_seconds) continue;
    auto it = reclaimed_at_.find(v->id);
    if (it != reclaimed_at_.end() && s.t - it->second < c.reclaim_again_seconds) continue;
    reclaimed_at_[v->id] = s.t;
    current_.actions.push_back({DensityActionKind::kReclaim, v->id, fmt("idle %.0f s; ", v->idle_seconds) + reason});
    ++n;
  }
}

void DensityController::addPauses(const std::vector<const SandboxView*>& candidates, const std::string& reason) {
  const DensityConfig& c = config_;
  int n = 0;
  for (const SandboxView* v : candidates) {
    if (n >= c.max_pauses_per_tick) break;
    if (v->paused || v->idle_seconds < c.pause_min_idle_seconds) continue;
    current_.actions.push_back(
        {DensityActionKind::kPause, v->id,
         std::string(v->latency ? "latency" : "batch") + fmt(", idle %.0f s; ", v->idle_seconds) + reason});
    paused_order_.push_back(v->id);
    ++n;
  }
}

}  // namespace dsec::placement
