#include "dsec/launcher/node/DensityLoop.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "dsec/common/Logging.h"
#include "dsec/common/Prometheus.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/node/NodeAgent.h"

namespace dsec::launcher {
namespace {

using placement::DensityActionKind;

constexpr const char* kLog = "density";
constexpr size_t kMaxEvents = 16;       // per sandbox, newest kept
constexpr size_t kMaxLastActions = 32;  // on /v1/node
// Per tick, at most this many sandboxes get their cgroup stats read (round robin): 1000s of idle sandboxes
// must not turn the loop into a file-reading storm. Idleness comes from the registry and costs nothing.
constexpr size_t kStatsPerTick = 256;

double round2(double v) { return std::round(v * 100) / 100; }

SandboxEvent densityEvent(const std::string& action, const std::string& reason, double now_wall) {
  SandboxEvent event;
  event.kind = SandboxEvent::Kind::kDensityAction;
  event.unix_seconds = now_wall;
  event.density_action = action;
  event.reason = reason;
  return event;
}

}  // namespace

DensityLoop::Ticket::~Ticket() {
  if (!loop_) return;
  std::lock_guard lock(loop_->mu_);
  loop_->pending_memory_ -= memory_;
  loop_->pending_cpus_ -= cpus_;
}

void DensityLoop::Ticket::commit() {
  if (!loop_) return;
  std::lock_guard lock(loop_->mu_);
  loop_->pending_memory_ -= memory_;
  loop_->pending_cpus_ -= cpus_;
  loop_->committed_memory_ += memory_;
  loop_->committed_cpus_ += cpus_;
  loop_ = nullptr;
}

DensityLoop::DensityLoop(DensityHost* host, const placement::DensityConfig& config, int64_t memory_capacity_bytes,
                         double interval_seconds, const std::string& cgroup_parent)
    : host_(host),
      config_(config),
      capacity_(memory_capacity_bytes > 0 ? memory_capacity_bytes : host->nodeMemoryBytes()),
      capacity_overridden_(memory_capacity_bytes > 0),
      cpus_(static_cast<double>(std::max<long>(1, sysconf(_SC_NPROCESSORS_ONLN)))),
      interval_(interval_seconds > 0 ? interval_seconds : 1.0),
      paths_(resolvePressurePaths(cgroup_parent)),
      controller_(config) {
  decision_ = controller_.current();
  psi_source_ = paths_.memory_psi;
}

DensityLoop::~DensityLoop() { stop(); }

void DensityLoop::start() {
  tick();
  thread_ = std::thread([this] { run(); });
  DSEC_LOG(kInfo, kLog) << (config_.overcommit ? "overcommit under the density controller" : "static limits")
                        << ": memory capacity " << formatBytes(capacity_) << ", " << cpus_ << " CPUs, pressure from "
                        << psi_source_;
}

void DensityLoop::stop() {
  {
    std::lock_guard lock(thread_mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void DensityLoop::run() {
  std::unique_lock lock(thread_mu_);
  while (!stopping_) {
    cv_.wait_for(lock, std::chrono::duration<double>(interval_));
    if (stopping_) break;
    lock.unlock();
    tick();
    lock.lock();
  }
}

placement::NodeAdmission DensityLoop::admissionLocked() const {
  placement::NodeAdmission state;
  state.admitting = decision_.admitting;
  state.memory_ratio = decision_.memory_ratio;
  state.cpu_ratio = decision_.cpu_ratio;
  state.memory_capacity_bytes = capacity_;
  state.memory_committed_bytes = committed_memory_ + pending_memory_;
  state.cpus = cpus_;
  state.cpu_committed = committed_cpus_ + pending_cpus_;
  return state;  // dedicated cores and sandbox slots are the agent's books (NodeAgent::nodeInfo fills them)
}

AdmissionInfo DensityLoop::admissionInfo() {
  std::lock_guard lock(mu_);
  return AdmissionInfo{admissionLocked(), decision_.level, decision_.reason};
}

Result<DensityLoop::Ticket> DensityLoop::admit(const CreateParams& params) {
  std::lock_guard lock(mu_);
  // The rule the gateway places with (placement/Admission.h), on the node's own books: the final word.
  placement::AdmissionRequest request{params.memory_bytes, params.cpus, params.qos == backends::CpuQos::kLatency};
  std::string why = placement::checkAdmission(admissionLocked(), request, decision_.reason);
  if (!why.empty()) {
    ++refusals_total_;
    return Error(ErrorCode::kResourceExhausted, "node " + host_->nodeName() + " cannot admit it: " + why);
  }
  pending_memory_ += params.memory_bytes;
  pending_cpus_ += params.cpus;
  return Ticket(this, params.memory_bytes, params.cpus);
}

void DensityLoop::tick() {
  double now = monotonicSeconds();
  placement::NodeSample s;
  s.t = now;
  s.memory_capacity_bytes = capacity_;
  s.cpu_capacity = cpus_;
  auto recs = host_->sampleRegistry([&](int64_t memory, double cpus) {
    s.memory_committed_bytes = memory;
    s.cpu_committed = cpus;
    std::lock_guard loop_lock(mu_);
    committed_memory_ = memory;
    committed_cpus_ = cpus;
  });
  std::string mem_psi;
  sampleNode(now, &s, &mem_psi);
  std::map<std::string, std::pair<int64_t, int64_t>> fresh;  // id -> memory, oom kills
  std::vector<placement::SandboxView> views = viewSandboxes(recs, now, &fresh);

  std::vector<std::pair<std::string, int64_t>> ooms;  // id, kills now
  std::vector<placement::DensityAction> actions;
  {
    std::lock_guard lock(mu_);
    psi_source_ = mem_psi;
    for (auto& v : views) {
      auto& per = per_sandbox_[v.id];
      auto it = fresh.find(v.id);
      if (it != fresh.end()) {
        per.memory_bytes = it->second.first;
        if (it->second.second > per.oom_seen) {
          ooms.emplace_back(v.id, it->second.second);
          per.oom_seen = it->second.second;
        }
      }
      v.memory_bytes = per.memory_bytes;
    }
    decision_ = controller_.step(s, views);
    last_sample_ = s;
    actions = decision_.actions;
  }
  for (const auto& [id, kills] : ooms) reportOomKill(id, kills);
  std::map<std::string, std::shared_ptr<SandboxRecord>> by_id;
  for (const auto& rec : recs) by_id[rec->id] = rec;
  for (const auto& a : actions) {
    auto it = by_id.find(a.sandbox_id);
    execute(a, it == by_id.end() ? nullptr : it->second);
  }
}

void DensityLoop::sampleNode(double now, placement::NodeSample* sample, std::string* memory_psi_source) {
  placement::NodeSample& s = *sample;
  auto parent = readParentCgroupStats(paths_);
  // Memory in use: with a configured capacity, what the sandboxes hold (their parent cgroup's working set);
  // else the node's own view (MemTotal - MemAvailable: everything, reclaimable cache excluded).
  if (capacity_overridden_) {
    if (parent.ok()) s.memory_used_bytes = parent->working_set_bytes();
  } else if (auto mi = readMemInfo(); mi.ok()) {
    s.memory_used_bytes = mi->used_bytes();
  }
  if (parent.ok()) {
    s.oom_kills = parent->oom_kills;
    if (last_cpu_t_ >= 0 && now > last_cpu_t_ && parent->cpu_usec >= last_cpu_usec_) {
      s.cpu_used = static_cast<double>(parent->cpu_usec - last_cpu_usec_) / 1e6 / (now - last_cpu_t_);
    }
    last_cpu_usec_ = parent->cpu_usec;
    last_cpu_t_ = now;
  }
  // v2: the sandboxes' own PSI once their parent exists; v1/hybrid: the host's.
  std::string mem_psi = paths_.memory_psi, cpu_psi = paths_.cpu_psi;
  if (paths_.psi_per_cgroup && !(parent.ok() && parent->exists)) {
    mem_psi = "/proc/pressure/memory";
    cpu_psi = "/proc/pressure/cpu";
  }
  if (auto psi = readPsi(mem_psi); psi.ok()) {
    s.psi_available = true;
    s.memory_some_avg10 = psi->some.avg10;
    s.memory_full_avg10 = psi->full.avg10;
  }
  if (auto psi = readPsi(cpu_psi); psi.ok()) s.cpu_some_avg10 = psi->some.avg10;
  *memory_psi_source = mem_psi;
}

std::vector<placement::SandboxView> DensityLoop::viewSandboxes(
    const std::vector<std::shared_ptr<SandboxRecord>>& recs, double now,
    std::map<std::string, std::pair<int64_t, int64_t>>* fresh) {
  std::vector<placement::SandboxView> views;
  views.reserve(recs.size());
  size_t n = recs.size(), budget = std::min(n, kStatsPerTick);
  size_t first = n ? scan_cursor_ % n : 0;
  for (size_t k = 0; k < n; ++k) {
    const auto& rec = recs[k];
    std::unique_lock rec_lock(rec->mu, std::try_to_lock);
    if (!rec_lock.owns_lock() || rec->destroyed || !rec->sandbox) continue;
    placement::SandboxView v;
    v.id = rec->id;
    v.latency = rec->sandbox->spec().qos == backends::CpuQos::kLatency;
    v.busy = rec->active.load() > 0;
    v.idle_seconds = std::max(0.0, now - rec->last_active_mono.load());
    auto state = rec->sandbox->state();
    if (state == backends::SandboxState::kStopped) continue;
    v.paused = state == backends::SandboxState::kPaused;
    v.paused_by_density = v.paused && rec->paused_by == PausedBy::kDensity;
    v.session = rec->params.session;
    bool scan = (k + n - first) % n < budget;
    if (scan) {
      if (auto u = rec->sandbox->usage(); u.ok()) (*fresh)[rec->id] = {u->memory_bytes, u->oom_kills};
    }
    views.push_back(std::move(v));
  }
  scan_cursor_ = n ? (first + budget) % n : 0;
  return views;
}

void DensityLoop::reportOomKill(const std::string& id, int64_t kills) {
  double now_wall = wallSeconds();
  std::shared_ptr<SandboxRecord> rec = host_->findRecord(id);
  int64_t limit = rec ? rec->params.memory_bytes : 0;
  DSEC_LOG(kWarn, kLog) << "sandbox " << id << " had a process OOM-killed (" << kills << " in total, limit "
                        << formatBytes(limit) << ")";
  SandboxEvent event;
  event.kind = SandboxEvent::Kind::kOomKill;
  event.unix_seconds = now_wall;
  event.oom_kills = kills;
  event.message = "a process was killed by the kernel's OOM killer: the sandbox reached its memory limit of " +
                  std::to_string(limit) + " bytes";
  addEvent(id, std::move(event));
  std::lock_guard lock(mu_);
  ++oom_events_total_;
}

void DensityLoop::execute(const placement::DensityAction& a, const std::shared_ptr<SandboxRecord>& rec) {
  double now_wall = wallSeconds();
  const std::string name = placement::densityActionName(a.kind);
  if (a.kind == DensityActionKind::kStopAdmitting || a.kind == DensityActionKind::kReopenAdmission) {
    DSEC_LOG(kInfo, kLog) << (a.kind == DensityActionKind::kStopAdmitting ? "stopped admitting: " : "admitting again: ")
                          << a.reason;
    logAction(a);
    return;
  }
  if (!rec) return;
  bool done = false;
  {
    std::lock_guard lock(rec->mu);
    if (rec->destroyed) return;
    auto state = rec->sandbox->state();
    switch (a.kind) {
      case DensityActionKind::kReclaim:
        if (auto st = rec->sandbox->reclaimMemory(); !st.ok()) {
          DSEC_LOG(kDebug, kLog) << "reclaiming " << rec->id << ": " << st.error().toString();
        }
        done = true;
        break;
      case DensityActionKind::kPause:
        // Re-checked under the record's lock: a request may have arrived since the sample.
        if (state != backends::SandboxState::kRunning || rec->active.load() > 0) break;
        if (auto st = rec->sandbox->pause(); !st.ok()) {
          DSEC_LOG(kWarn, kLog) << "pausing " << rec->id << ": " << st.error().toString();
          break;
        }
        rec->paused_by = PausedBy::kDensity;
        if (auto st = host_->saveRecord(*rec); !st.ok()) {
          DSEC_LOG(kWarn, kLog) << "persisting " << rec->id << ": " << st.error().toString();
        }
        // Frozen processes cannot touch their pages, so what the kernel pushes out now stays out until resume.
        (void)rec->sandbox->reclaimMemory();
        done = true;
        break;
      case DensityActionKind::kResume:
        if (state != backends::SandboxState::kPaused || rec->paused_by != PausedBy::kDensity) break;
        if (auto st = rec->sandbox->resume(); !st.ok()) {
          DSEC_LOG(kWarn, kLog) << "resuming " << rec->id << ": " << st.error().toString();
          break;
        }
        rec->paused_by = PausedBy::kNone;
        if (auto st = host_->saveRecord(*rec); !st.ok()) {
          DSEC_LOG(kWarn, kLog) << "persisting " << rec->id << ": " << st.error().toString();
        }
        done = true;
        break;
      default:
        break;
    }
  }
  if (!done) return;
  if (a.kind == DensityActionKind::kReclaim) {
    DSEC_LOG(kDebug, kLog) << name << " " << rec->id << " (" << a.reason << ")";
  } else {
    DSEC_LOG(kInfo, kLog) << name << " " << rec->id << " (" << a.reason << ")";
  }
  {
    std::lock_guard lock(mu_);
    auto& per = per_sandbox_[rec->id];
    if (a.kind == DensityActionKind::kReclaim) {
      per.reclaimed_unix = now_wall;
      ++per.reclaims;
    } else if (a.kind == DensityActionKind::kPause) {
      per.paused_unix = now_wall;
      per.reclaimed_unix = now_wall;
      ++per.pauses;
      ++per.reclaims;
    } else {
      per.resumed_unix = now_wall;
    }
  }
  addEvent(rec->id, densityEvent(name, a.reason, now_wall));
  logAction(a);
}

void DensityLoop::logAction(const placement::DensityAction& a) {
  double now_wall = wallSeconds();
  std::lock_guard lock(mu_);
  const std::string name = placement::densityActionName(a.kind);
  ++actions_total_[name];
  last_actions_.push_back(DensityActionRecord{++action_seq_, name, a.sandbox_id, now_wall, a.reason});
  while (last_actions_.size() > kMaxLastActions) last_actions_.pop_front();
}

void DensityLoop::addEvent(const std::string& id, SandboxEvent event) {
  std::lock_guard lock(mu_);
  auto& events = per_sandbox_[id].events;
  events.push_back(std::move(event));
  while (events.size() > kMaxEvents) events.pop_front();
}

SandboxDensity DensityLoop::sandboxDensity(const std::string& id) {
  std::lock_guard lock(mu_);
  SandboxDensity d;
  auto it = per_sandbox_.find(id);
  if (it == per_sandbox_.end()) return d;
  const PerSandbox& p = it->second;
  if (p.reclaimed_unix > 0) d.reclaimed_unix = p.reclaimed_unix;
  d.reclaims = p.reclaims;
  if (p.paused_unix > 0) d.paused_unix = p.paused_unix;
  d.pauses = p.pauses;
  if (p.resumed_unix > 0) d.resumed_unix = p.resumed_unix;
  d.events.assign(p.events.begin(), p.events.end());
  return d;
}

void DensityLoop::forget(const std::string& id) {
  std::lock_guard lock(mu_);
  per_sandbox_.erase(id);
}

DensityNodeInfo DensityLoop::nodeInfo() {
  std::lock_guard lock(mu_);
  const placement::NodeSample& s = last_sample_;
  DensityNodeInfo info;
  for (const char* a : {"reclaim", "stop_admitting", "pause", "resume", "reopen_admission"}) {
    auto it = actions_total_.find(a);
    info.actions_total[a] = it == actions_total_.end() ? 0 : it->second;
  }
  int64_t paused =
      static_cast<int64_t>(info.actions_total["pause"]) - static_cast<int64_t>(info.actions_total["resume"]);
  info.overcommit = config_.overcommit;
  info.memory_ratio = round2(decision_.memory_ratio);
  info.cpu_ratio = round2(decision_.cpu_ratio);
  info.admitting = decision_.admitting;
  info.level = decision_.level;
  info.reason = decision_.reason;
  info.memory_capacity_bytes = capacity_;
  info.memory_used_bytes = s.memory_used_bytes;
  info.memory_committed_bytes = s.memory_committed_bytes;
  info.memory_admissible_bytes = static_cast<int64_t>(decision_.memory_ratio * static_cast<double>(capacity_));
  info.cpus = cpus_;
  info.cpu_committed = round2(s.cpu_committed);
  info.cpu_used = round2(s.cpu_used);
  info.pressure = {psi_source_,         paths_.psi_per_cgroup && psi_source_ == paths_.memory_psi,
                   s.psi_available,     s.memory_some_avg10,
                   s.memory_full_avg10, s.cpu_some_avg10};
  info.oom_kills = s.oom_kills;
  info.paused_sandboxes = std::max<int64_t>(0, paused);
  info.refusals = refusals_total_;
  info.last_actions.assign(last_actions_.begin(), last_actions_.end());
  return info;
}

void DensityLoop::renderMetrics(std::string* out) {
  std::lock_guard lock(mu_);
  const placement::NodeSample& s = last_sample_;
  auto gauge = [out](const char* name, const char* help, const std::string& value) {
    prometheus::gauge(out, name, help, value);
  };
  using prometheus::number;
  gauge("dsec_density_memory_ratio", "Memory overcommit ratio admission uses (committed <= ratio x capacity).",
        number(decision_.memory_ratio));
  gauge("dsec_density_cpu_ratio", "CPU overcommit ratio admission uses.", number(decision_.cpu_ratio));
  gauge("dsec_density_admitting", "1 while the node admits new sandboxes, 0 while pressure holds admission closed.",
        number(decision_.admitting));
  gauge("dsec_density_level", "Pressure level: 0 calm, 1 reclaim, 2 stop admitting, 3 pause.",
        number(static_cast<int>(decision_.level)));
  gauge("dsec_density_memory_capacity_bytes", "Memory capacity admission counts against.", number(capacity_));
  gauge("dsec_density_memory_used_bytes", "Memory in use the controller judges (working set).",
        number(s.memory_used_bytes));
  prometheus::family(out, "dsec_density_psi", "gauge", "Pressure stall information, avg10 percent.");
  prometheus::sample(out, "dsec_density_psi", {{"resource", "memory"}, {"kind", "some"}}, number(s.memory_some_avg10));
  prometheus::sample(out, "dsec_density_psi", {{"resource", "memory"}, {"kind", "full"}}, number(s.memory_full_avg10));
  prometheus::sample(out, "dsec_density_psi", {{"resource", "cpu"}, {"kind", "some"}}, number(s.cpu_some_avg10));
  prometheus::family(out, "dsec_density_actions_total", "counter", "Actions the density controller took.");
  for (const char* a : {"reclaim", "stop_admitting", "pause", "resume", "reopen_admission"}) {
    auto it = actions_total_.find(a);
    prometheus::sample(out, "dsec_density_actions_total", {{"action", a}},
                       number(it == actions_total_.end() ? 0 : it->second));
  }
  prometheus::counter(out, "dsec_density_refusals_total", "Creates refused by admission (429 capacity).",
                      refusals_total_);
  prometheus::counter(out, "dsec_sandbox_oom_events_total", "OOM kills seen inside sandboxes (reported in their info).",
                      oom_events_total_);
}

}  // namespace dsec::launcher
