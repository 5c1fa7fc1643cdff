// The density controller's decisions: replayed memory-pressure traces recorded on a real machine
// (tests/placement/traces/*.trace, recorded with record_trace.py) and synthetic edge cases.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>

#include "dsec/placement/Admission.h"
#include "dsec/placement/DensityController.h"

namespace dsec::placement {
namespace {

struct TraceRow {
  std::map<std::string, double> num;
  std::string phase;
};

// Columns are named by the "# t phase ..." header line.
std::vector<TraceRow> loadTrace(const std::string& name) {
  std::ifstream in(std::string(DSEC_TRACE_DIR) + "/" + name);
  EXPECT_TRUE(in.good()) << "missing trace " << name;
  std::vector<std::string> cols;
  std::vector<TraceRow> rows;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# t ", 0) == 0) {
      std::istringstream hs(line.substr(2));
      std::string c;
      while (hs >> c) cols.push_back(c);
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    TraceRow row;
    for (const auto& c : cols) {
      std::string v;
      ls >> v;
      if (c == "phase") {
        row.phase = v;
      } else {
        row.num[c] = std::stod(v);
      }
    }
    rows.push_back(row);
  }
  EXPECT_FALSE(rows.empty()) << name;
  return rows;
}

// The trace's cgroup plays the node: its limit is the capacity, its working set the memory in use.
NodeSample sampleOf(const TraceRow& r, int64_t committed) {
  NodeSample s;
  s.t = r.num.at("t");
  s.memory_capacity_bytes = static_cast<int64_t>(r.num.at("cg_limit_bytes"));
  s.memory_used_bytes = static_cast<int64_t>(r.num.at("cg_workingset_bytes"));
  s.memory_committed_bytes = committed;
  s.cpu_capacity = 2;
  s.cpu_committed = 8;
  s.cpu_used = 0.1;
  s.psi_available = true;
  s.memory_some_avg10 = r.num.at("cg_some_avg10");
  s.memory_full_avg10 = r.num.at("cg_full_avg10");
  s.cpu_some_avg10 = r.num.at("host_cpu_some_avg10");  // the loaded host's: must not close admission
  s.oom_kills = static_cast<int64_t>(r.num.at("cg_oom_kills"));
  return s;
}

SandboxView view(const std::string& id, double idle_seconds, bool busy = false, bool latency = false) {
  SandboxView v;
  v.id = id;
  v.idle_seconds = idle_seconds;
  v.busy = busy;
  v.latency = latency;
  v.memory_bytes = 8 << 20;
  return v;
}

struct Logged {
  double t;
  DensityActionKind kind;
  std::string id;
};

struct Replay {
  std::vector<Logged> log;
  std::vector<DensityDecision> decisions;
  std::vector<std::string> phases;
};

// Six sandboxes: four idle batch (different idle times), one idle latency, one busy. Paused state follows
// the controller's own actions, as the node agent would apply them.
Replay replay(const std::vector<TraceRow>& rows, const DensityConfig& config) {
  DensityController ctl(config);
  std::vector<SandboxView> sb = {
      view("b-old", 400),   view("b-mid", 300), view("b-new", 200), view("b-young", 100), view("lat", 500, false, true),
      view("busy", 0, true)};
  Replay out;
  double t0 = rows.front().num.at("t");
  for (const auto& r : rows) {
    double dt = r.num.at("t") - t0;
    for (auto& v : sb) {
      if (!v.busy) v.idle_seconds += dt;
    }
    t0 = r.num.at("t");
    auto d = ctl.step(sampleOf(r, 4 * static_cast<int64_t>(r.num.at("cg_limit_bytes"))), sb);
    for (const auto& a : d.actions) {
      out.log.push_back({r.num.at("t"), a.kind, a.sandbox_id});
      for (auto& v : sb) {
        if (v.id != a.sandbox_id) continue;
        if (a.kind == DensityActionKind::kPause) v.paused = v.paused_by_density = true;
        if (a.kind == DensityActionKind::kResume) v.paused = v.paused_by_density = false;
      }
    }
    out.decisions.push_back(d);
    out.phases.push_back(r.phase);
  }
  return out;
}

double firstT(const Replay& r, DensityActionKind kind) {
  for (const auto& l : r.log) {
    if (l.kind == kind) return l.t;
  }
  return -1;
}

// Position of the first action of a kind in the whole replay (actions of one tick are ordered too).
int firstIndex(const Replay& r, DensityActionKind kind) {
  for (size_t i = 0; i < r.log.size(); ++i) {
    if (r.log[i].kind == kind) return static_cast<int>(i);
  }
  return -1;
}

int count(const Replay& r, DensityActionKind kind) {
  int n = 0;
  for (const auto& l : r.log) n += l.kind == kind;
  return n;
}

// What holds for every replay: bounds, never the busy sandbox, batch paused before latency (longest idle
// first), admission closed exactly between stop and reopen, and every pause undone once the trace is calm.
void checkInvariants(const Replay& r, const DensityConfig& c, bool calm_at_end = true) {
  bool admitting = true;
  size_t di = 0;
  for (const auto& d : r.decisions) {
    EXPECT_GE(d.memory_ratio, c.memory_ratio_min);
    EXPECT_LE(d.memory_ratio, c.memory_ratio_max);
    EXPECT_GE(d.cpu_ratio, c.cpu_ratio_min);
    EXPECT_LE(d.cpu_ratio, c.cpu_ratio_max);
    for (const auto& a : d.actions) {
      EXPECT_NE(a.sandbox_id, "busy") << densityActionName(a.kind);
      if (a.kind == DensityActionKind::kStopAdmitting) {
        EXPECT_TRUE(admitting);
        admitting = false;
      }
      if (a.kind == DensityActionKind::kReopenAdmission) {
        EXPECT_FALSE(admitting);
        admitting = true;
      }
    }
    EXPECT_EQ(d.admitting, admitting) << "decision " << di;
    ++di;
  }
  std::vector<std::string> paused;
  for (const auto& l : r.log) {
    if (l.kind == DensityActionKind::kPause) paused.push_back(l.id);
  }
  std::vector<std::string> expected_order = {"b-old", "b-mid", "b-new", "b-young", "lat"};
  for (size_t i = 0; i < paused.size() && i < expected_order.size(); ++i) EXPECT_EQ(paused[i], expected_order[i]);
  if (!calm_at_end) return;
  EXPECT_TRUE(r.decisions.back().admitting);
  EXPECT_EQ(count(r, DensityActionKind::kPause), count(r, DensityActionKind::kResume));
  EXPECT_EQ(r.decisions.back().level, PressureLevel::kCalm);
}

// Thresholds scaled to a 2-CPU VM whose recorded stalls stay modest (the hog competes for CPU too). The
// traces exercise the PSI and OOM paths: the working-set thresholds are out of reach here (a cgroup that just
// wrote a file holds it as active cache, which replaying cannot reclaim) and are tested synthetically.
DensityConfig traceConfig() {
  DensityConfig c;
  for (int i = 0; i < 3; ++i) c.use_enter[i] = c.use_leave[i] = 2.0;
  c.psi_some_enter[0] = 4, c.psi_some_enter[1] = 8, c.psi_some_enter[2] = 11;
  c.psi_some_leave[0] = 2, c.psi_some_leave[1] = 5, c.psi_some_leave[2] = 8;
  c.release_hold_seconds = 3;
  c.oom_hold_seconds = 15;
  return c;
}

TEST(DensityTraceTest, ThrashThenOomActsInOrderAndReleasesInReverse) {
  auto rows = loadTrace("thrash-oom.trace");
  DensityConfig c = traceConfig();
  Replay r = replay(rows, c);
  checkInvariants(r, c);
  int reclaim = firstIndex(r, DensityActionKind::kReclaim), stop = firstIndex(r, DensityActionKind::kStopAdmitting),
      pause = firstIndex(r, DensityActionKind::kPause), resume = firstIndex(r, DensityActionKind::kResume),
      reopen = firstIndex(r, DensityActionKind::kReopenAdmission);
  ASSERT_GE(reclaim, 0) << "no reclaim";
  ASSERT_GE(stop, 0) << "no stop";
  ASSERT_GE(pause, 0) << "no pause";
  EXPECT_LT(reclaim, stop);
  EXPECT_LT(stop, pause);
  EXPECT_LT(pause, resume);
  EXPECT_LT(resume, reopen);
  // Nothing happens while the recording was calm, everything is released by its end.
  for (size_t i = 0; i < r.decisions.size(); ++i) {
    if (r.phases[i] == "calm" || r.phases[i] == "fill") {
      EXPECT_EQ(r.decisions[i].level, PressureLevel::kCalm) << i;
      EXPECT_TRUE(r.decisions[i].actions.empty()) << i;
    }
  }
  // The ratio rose while calm and fell under pressure.
  EXPECT_GT(r.decisions[10].memory_ratio, c.memory_ratio_start);
  double at_stop = 0, lowest = 1e9;
  for (size_t i = 0; i < r.decisions.size(); ++i) {
    if (!r.decisions[i].admitting) lowest = std::min(lowest, r.decisions[i].memory_ratio);
    if (at_stop == 0 && !r.decisions[i].admitting) at_stop = r.decisions[i].memory_ratio;
  }
  EXPECT_LT(lowest, at_stop);
  // The loaded host's CPU PSI (~98% here) did not move the CPU ratio down: the sandboxes were not busy.
  for (const auto& d : r.decisions) EXPECT_GE(d.cpu_ratio, c.cpu_ratio_start);
}

TEST(DensityTraceTest, SlowRampStepsUpAndDownThroughTheLevels) {
  auto rows = loadTrace("slow-ramp.trace");
  DensityConfig c = traceConfig();
  Replay r = replay(rows, c);
  checkInvariants(r, c);
  ASSERT_GE(firstT(r, DensityActionKind::kReclaim), 0);
  // Levels never skip down: each release goes one level at a time.
  for (size_t i = 1; i < r.decisions.size(); ++i) {
    int a = static_cast<int>(r.decisions[i - 1].level), b = static_cast<int>(r.decisions[i].level);
    EXPECT_GE(b, a - 1) << "at row " << i;
  }
  ASSERT_GE(firstIndex(r, DensityActionKind::kStopAdmitting), 0);
  ASSERT_GE(firstIndex(r, DensityActionKind::kPause), 0);
  EXPECT_LT(firstIndex(r, DensityActionKind::kReclaim), firstIndex(r, DensityActionKind::kStopAdmitting));
  EXPECT_LT(firstIndex(r, DensityActionKind::kStopAdmitting), firstIndex(r, DensityActionKind::kPause));
  // Stop and pause came at distinct moments: the stalls rose through the levels, not at once.
  EXPECT_LT(firstT(r, DensityActionKind::kStopAdmitting), firstT(r, DensityActionKind::kPause));
}

TEST(DensityTraceTest, DefaultThresholdsOnTheSameTraces) {
  // With the defaults, the recorded thrash (PSI ~11%) is worth reclaiming; the OOM under the limit stops
  // admission; neither is bad enough to pause anyone. (The trace ends before the 30 s OOM hold and the
  // release holds have all passed, so it need not end calm.)
  DensityConfig c;
  Replay r = replay(loadTrace("thrash-oom.trace"), c);
  checkInvariants(r, c, false);
  EXPECT_GE(firstT(r, DensityActionKind::kReclaim), 0);
  EXPECT_GE(firstT(r, DensityActionKind::kStopAdmitting), 0);
  EXPECT_LT(firstT(r, DensityActionKind::kReclaim), firstT(r, DensityActionKind::kStopAdmitting));
  EXPECT_EQ(firstIndex(r, DensityActionKind::kPause), -1);
}

// --- synthetic cases ---

NodeSample calm(double t) {
  NodeSample s;
  s.t = t;
  s.memory_capacity_bytes = 1 << 30;
  s.memory_used_bytes = 100 << 20;
  s.memory_committed_bytes = 4LL << 30;
  s.cpu_capacity = 2;
  s.cpu_committed = 16;
  s.psi_available = true;
  return s;
}

std::vector<SandboxView> idle(int n, double idle_s) {
  std::vector<SandboxView> out;
  for (int i = 0; i < n; ++i) out.push_back(view("s" + std::to_string(i), idle_s + i));
  return out;
}

TEST(DensityControllerTest, StaticModeNeverActs) {
  DensityConfig c;
  c.overcommit = false;
  DensityController ctl(c);
  NodeSample s = calm(0);
  s.memory_some_avg10 = 90;
  s.memory_used_bytes = s.memory_capacity_bytes;
  auto d = ctl.step(s, idle(3, 1000));
  EXPECT_EQ(d.memory_ratio, 1.0);
  EXPECT_EQ(d.cpu_ratio, 1.0);
  EXPECT_TRUE(d.admitting);
  EXPECT_TRUE(d.actions.empty());
  EXPECT_EQ(d.level, PressureLevel::kPause);  // still reported
}

TEST(DensityControllerTest, RatioRisesWhileCalmUpToItsBound) {
  DensityConfig c;
  DensityController ctl(c);
  double prev = c.memory_ratio_start;
  for (int t = 0; t < 60; ++t) {
    auto d = ctl.step(calm(t), idle(2, 10));
    EXPECT_GE(d.memory_ratio, prev);
    prev = d.memory_ratio;
    if (t < c.calm_hold_seconds) {
      EXPECT_EQ(d.memory_ratio, c.memory_ratio_start);
    }
  }
  EXPECT_EQ(prev, c.memory_ratio_max);
}

TEST(DensityControllerTest, MeasuredUseBoundsTheRatio) {
  DensityController ctl;
  NodeSample s = calm(0);
  s.memory_used_bytes = s.memory_capacity_bytes / 2;       // half the node really used
  s.memory_committed_bytes = s.memory_capacity_bytes / 2;  // by sandboxes that use their whole limit
  auto d = ctl.step(s, {});
  EXPECT_EQ(d.memory_ratio, 1.0);  // 0.8 x committed / used = 0.8, clamped to the minimum
  s.t = 1;
  s.memory_committed_bytes = 5LL * s.memory_capacity_bytes;  // 10x their use
  d = ctl.step(s, {});
  EXPECT_EQ(d.memory_ratio, 1.0);  // the bound allows 8, but the ratio only climbs back while calm
  for (int t = 2; t < 40; ++t) {
    s.t = t;
    d = ctl.step(s, {});
  }
  EXPECT_NEAR(d.memory_ratio, 8.0, 1e-9);
}

TEST(DensityControllerTest, HysteresisDoesNotFlap) {
  DensityConfig c;
  DensityController ctl(c);
  int changes = 0;
  PressureLevel prev = PressureLevel::kCalm;
  for (int t = 0; t < 40; ++t) {
    NodeSample s = calm(t);
    s.memory_some_avg10 = t % 2 ? 11 : 8;  // around the level-1 enter threshold, above its leave threshold
    auto d = ctl.step(s, idle(2, 100));
    if (d.level != prev) ++changes;
    prev = d.level;
  }
  EXPECT_EQ(changes, 1);
  EXPECT_EQ(prev, PressureLevel::kReclaim);
}

TEST(DensityControllerTest, ReleasesOneLevelPerHold) {
  DensityConfig c;
  DensityController ctl(c);
  NodeSample s = calm(0);
  s.memory_some_avg10 = 60;
  auto sb = idle(3, 1000);
  auto d = ctl.step(s, sb);
  ASSERT_EQ(d.level, PressureLevel::kPause);
  ASSERT_EQ(d.actions.size(), 3u + 1u + 2u);  // 3 reclaims, stop, 2 pauses (max per tick)
  EXPECT_EQ(d.actions[0].kind, DensityActionKind::kReclaim);
  EXPECT_EQ(d.actions[3].kind, DensityActionKind::kStopAdmitting);
  EXPECT_EQ(d.actions[4].kind, DensityActionKind::kPause);
  EXPECT_EQ(d.actions[4].sandbox_id, "s2");  // longest idle first
  EXPECT_EQ(d.actions[5].sandbox_id, "s1");
  std::vector<std::string> paused = {"s2", "s1"}, resumed;
  auto apply = [&](const DensityDecision& dd) {
    for (const auto& a : dd.actions) {
      for (auto& v : sb) {
        if (v.id != a.sandbox_id) continue;
        if (a.kind == DensityActionKind::kPause) v.paused = v.paused_by_density = true;
        if (a.kind == DensityActionKind::kResume) v.paused = v.paused_by_density = false;
      }
      if (a.kind == DensityActionKind::kResume) resumed.push_back(a.sandbox_id);
    }
  };
  apply(d);
  std::vector<PressureLevel> levels;
  for (int t = 1; t < 40; ++t) {
    NodeSample q = calm(t);
    d = ctl.step(q, sb);
    levels.push_back(d.level);
    for (const auto& a : d.actions) {
      // Level 3 holds for release_hold_seconds, but the signals are calm: nobody more is paused.
      EXPECT_NE(a.kind, DensityActionKind::kPause) << a.sandbox_id;
    }
    apply(d);
  }
  // 3 -> 2 -> 1 -> 0, each after release_hold_seconds.
  std::vector<PressureLevel> distinct;
  for (auto l : levels) {
    if (distinct.empty() || distinct.back() != l) distinct.push_back(l);
  }
  EXPECT_EQ(distinct, (std::vector<PressureLevel>{PressureLevel::kPause, PressureLevel::kStopAdmitting,
                                                  PressureLevel::kReclaim, PressureLevel::kCalm}));
  EXPECT_EQ(paused, (std::vector<std::string>{"s2", "s1"}));
  EXPECT_EQ(resumed, (std::vector<std::string>{"s1", "s2"}));  // last paused first
  EXPECT_TRUE(d.admitting);
}

TEST(DensityControllerTest, NeverTouchesBusyOrRecentlyActiveSandboxes) {
  DensityConfig c;
  DensityController ctl(c);
  std::vector<SandboxView> sb = {view("busy", 5000, true), view("fresh", 1)};
  for (int t = 0; t < 20; ++t) {
    NodeSample s = calm(t);
    s.memory_some_avg10 = 80;
    auto d = ctl.step(s, sb);
    for (const auto& a : d.actions) EXPECT_TRUE(a.sandbox_id.empty()) << densityActionName(a.kind) << a.sandbox_id;
    EXPECT_FALSE(d.admitting);
  }
}

TEST(DensityControllerTest, RequestResumedSandboxIsNotResumedAgain) {
  DensityController ctl;
  auto sb = idle(1, 1000);
  NodeSample s = calm(0);
  s.memory_some_avg10 = 60;
  auto d = ctl.step(s, sb);
  ASSERT_EQ(d.actions.back().kind, DensityActionKind::kPause);
  // A request resumed it transparently; then the pressure goes.
  sb[0].idle_seconds = 0;
  for (int t = 1; t < 40; ++t) {
    d = ctl.step(calm(t), sb);
    for (const auto& a : d.actions) EXPECT_NE(a.kind, DensityActionKind::kResume);
  }
}

TEST(DensityControllerTest, OomUnderTheNodeLimitStopsAdmissionForAWhile) {
  DensityConfig c;
  DensityController ctl(c);
  NodeSample s = calm(0);
  ctl.step(s, {});
  s.t = 1;
  s.oom_kills = 1;
  auto d = ctl.step(s, {});
  EXPECT_FALSE(d.admitting);
  EXPECT_NE(d.reason.find("OOM"), std::string::npos) << d.reason;
  double reopened = -1;
  for (int t = 2; t < 60 && reopened < 0; ++t) {
    s.t = t;
    d = ctl.step(s, {});
    if (d.admitting) reopened = t;
  }
  EXPECT_GE(reopened, 1 + c.oom_hold_seconds);
}

TEST(DensityControllerTest, WithoutPsiUseAloneDrivesTheLevel) {
  DensityController ctl;
  NodeSample s = calm(0);
  s.psi_available = false;
  s.memory_some_avg10 = 99;  // ignored
  EXPECT_EQ(ctl.step(s, {}).level, PressureLevel::kCalm);
  s.t = 1;
  s.memory_used_bytes = s.memory_capacity_bytes * 9 / 10;
  auto d = ctl.step(s, {});
  EXPECT_EQ(d.level, PressureLevel::kStopAdmitting);
  EXPECT_NE(d.reason.find("memory in use 90%"), std::string::npos) << d.reason;
}

TEST(DensityControllerTest, CpuRatioFallsOnlyWhenSandboxesSaturateTheCpus) {
  DensityConfig c;
  DensityController ctl(c);
  NodeSample s = calm(0);
  s.cpu_some_avg10 = 95;  // host busy with other work
  s.cpu_used = 0.2;
  EXPECT_EQ(ctl.step(s, {}).cpu_ratio, c.cpu_ratio_start);
  s.cpu_used = 1.9;  // the sandboxes use 95% of 2 CPUs
  for (int t = 1; t < 5; ++t) {
    s.t = t;
    ctl.step(s, {});
  }
  EXPECT_LT(ctl.current().cpu_ratio, c.cpu_ratio_start);
}

TEST(DensityControllerTest, AdmissionNamesWhy) {
  NodeAdmission node;
  node.memory_ratio = 2;
  node.cpu_ratio = 4;
  node.memory_capacity_bytes = 1 << 30;
  node.memory_committed_bytes = 1536LL << 20;
  node.cpus = 2;
  node.cpu_committed = 7.5;
  EXPECT_EQ(checkAdmission(node, {512 << 20, 0.5}), "");
  std::string mem = checkAdmission(node, {513 << 20, 0.5});
  EXPECT_NE(mem.find("memory: 1536 MiB committed + 513 MiB asked > 2.00 x 1024 MiB"), std::string::npos) << mem;
  std::string cpu = checkAdmission(node, {1 << 20, 1});
  EXPECT_NE(cpu.find("cpus: 7.50 committed + 1.00 asked > 4.00 x 2 CPUs"), std::string::npos) << cpu;
  // Unlimited (0) counts nothing.
  EXPECT_EQ(checkAdmission(node, {0, 0}), "");
  // Latency sandboxes need whole dedicated cores where they are counted (at least one).
  node.free_dedicated_cores = 1;
  EXPECT_EQ(checkAdmission(node, {1 << 20, 0.25, true}), "");
  node.cpu_committed = 0;
  EXPECT_EQ(checkAdmission(node, {1 << 20, 1.5, true}), "latency sandbox needs 2 dedicated cores, 1 free");
  node.free_sandboxes = 0;
  EXPECT_EQ(admissionRefusal(node, {1 << 20, 0.5}), AdmissionRefusal::kSandboxes);
  node.admitting = false;
  std::string closed = checkAdmission(node, {1 << 20, 0}, "memory PSI some avg10 30.0%");
  EXPECT_NE(closed.find("admission is closed (memory PSI some avg10 30.0%)"), std::string::npos) << closed;
}

TEST(DensityControllerTest, IdleSandboxesKeepTheCpuRatioAtItsBound) {
  // Idle sandboxes use no CPU: the ratio stays at 1024, so a 1-CPU node admits a thousand sandboxes of the
  // default 1 CPU (memory permitting) and never the 8 x cores of a static ratio.
  DensityController ctl;
  NodeSample s;
  s.cpu_capacity = 1;
  s.memory_capacity_bytes = 4LL << 30;
  s.cpu_committed = 30;
  for (int t = 0; t < 10; ++t) {
    s.t = t;
    ctl.step(s, {});
  }
  NodeAdmission node;
  node.memory_ratio = ctl.current().memory_ratio;
  node.cpu_ratio = ctl.current().cpu_ratio;
  node.cpus = 1;
  node.cpu_committed = 30;
  node.memory_capacity_bytes = 4LL << 30;
  node.memory_committed_bytes = 30 * (512LL << 20);
  EXPECT_EQ(node.cpu_ratio, 1024);
  EXPECT_EQ(checkAdmission(node, {512LL << 20, 1}), "");
}

}  // namespace
}  // namespace dsec::placement
