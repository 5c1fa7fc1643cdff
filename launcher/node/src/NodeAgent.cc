#include "dsec/launcher/node/NodeAgent.h"

#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>

#include "dsec/common/Directory.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Prometheus.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/node/CpuAllocator.h"
#include "dsec/launcher/node/DensityLoop.h"

namespace dsec::launcher {
namespace {

constexpr const char* kLog = "node";

int64_t physicalMemory() {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? int64_t{pages} * page : 0;
}

}  // namespace

std::string cgroupParentForRoot(const std::string& root) {
  char resolved[PATH_MAX];
  std::string path = ::realpath(root.c_str(), resolved) ? std::string(resolved) : root;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  if (path == "/var/lib/dsec") return "dsec";
  uint64_t h = 1469598103934665603ULL;  // FNV-1a: stable across builds and runs
  for (unsigned char c : path) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "dsec-%08x", static_cast<unsigned>(h ^ (h >> 32)));
  return buf;
}

double wallSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void SandboxRecord::touch() {
  last_active_unix.store(wallSeconds());
  last_active_mono.store(monotonicSeconds());
}

SandboxLease::SandboxLease(std::shared_ptr<SandboxRecord> record) : record_(std::move(record)) {}

SandboxLease::~SandboxLease() {
  if (!record_) return;
  record_->touch();
  record_->active.fetch_sub(1);
}

NodeAgent::NodeAgent(const NodeOptions& options, Metrics* metrics, NodeParts parts)
    : options_(options),
      metrics_(metrics),
      images_(std::move(parts.images)),
      state_(std::move(parts.state)),
      backend_(std::move(parts.backend)),
      machine_backends_(std::move(parts.machine_backends)),
      machine_unavailable_(std::move(parts.machine_unavailable)),
      machine_notes_(std::move(parts.machine_notes)),
      backend_has_cgroups_(parts.has_cgroups),
      backend_runs_processes_(parts.runs_processes),
      unavailable_reason_(std::move(parts.backend_unavailable)),
      // A name of the node's own even for a backend without cgroups: the density loop then samples a cgroup that
      // does not exist, never the host's root.
      cgroup_parent_(parts.cgroup_parent.empty() ? cgroupParentForRoot(options.root) : parts.cgroup_parent) {
  if (!parts.uses_host_resources) options_.density = hostIndependentDensityConfig(options_.density);
}

backends::Backend* NodeAgent::backendFor(backends::BackendKind kind) const {
  if (kind == backends::BackendKind::kContainer) return backend_.get();
  auto it = machine_backends_.find(kind);
  return it == machine_backends_.end() ? nullptr : it->second.get();
}

backends::Backend* NodeAgent::backendForState(const nlohmann::json& backend_state) const {
  if (backend_state.is_object() && backend_state.contains("backend") && backend_state["backend"].is_string()) {
    auto kind = backends::parseBackendKind(backend_state["backend"].get<std::string>());
    if (kind.ok() && *kind != backends::BackendKind::kContainer) {
      if (auto* b = backendFor(*kind)) return b;
    }
  }
  return backend_.get();
}

Result<std::unique_ptr<NodeAgent>> NodeAgent::start(const NodeOptions& options, Metrics* metrics) {
  return start(options, metrics, makeNodeParts(options));
}

Result<std::unique_ptr<NodeAgent>> NodeAgent::start(const NodeOptions& options, Metrics* metrics, NodeParts parts) {
  if (!parts.images || !parts.state) return Error::invalid("a node needs an image source and a state store");
  // Thousands of sandboxes need more fds than a login shell's default; what cannot be raised is checked per create.
  for (const auto& note : raiseProcessLimits().notes) DSEC_LOG(kInfo, kLog) << note;
  std::unique_ptr<NodeAgent> agent(new NodeAgent(options, metrics, std::move(parts)));
  agent->node_memory_bytes_ = options.memory_capacity_bytes > 0 ? options.memory_capacity_bytes : physicalMemory();
  if (auto st = agent->state_->prepare(); !st.ok()) return st.error();
  DSEC_TRY(agent->claimDirectory());
  DSEC_TRY(agent->startSnapshots());
  agent->checkBackend();
  agent->sessions_ = std::make_unique<SessionTable>(options.root + "/state/sessions");
  agent->cpu_ = std::make_unique<CpuAllocator>(CpuAllocatorOptions{
      options.cpu_qos, options.cpu_exclusive_pool && agent->backend_has_cgroups_, agent->cgroup_parent_, ""});
  if (agent->backend_) DSEC_TRY(agent->adoptAll());
  agent->loadSessions();
  agent->startFncall();  // after adoptAll: leftover fncall workers of an earlier agent are reaped by then
  agent->density_ = std::make_unique<DensityLoop>(static_cast<DensityHost*>(agent.get()), agent->options_.density,
                                                  options.memory_capacity_bytes, options.density_interval_seconds,
                                                  agent->cgroup_parent_);
  agent->density_->start();
  agent->reaper_ = std::thread([a = agent.get()] { a->reaperLoop(); });
  return agent;
}

void NodeAgent::checkBackend() {
  if (backend_) {
    auto missing = backend_->missingFeatures();
    if (!missing.empty()) {
      std::string reason = "container backend unavailable, host lacks:";
      for (const auto& m : missing) reason += " " + m + ";";
      reason.pop_back();
      unavailable_reason_ = reason;
    }
  } else if (unavailable_reason_.empty()) {
    unavailable_reason_ = "no backend";
  }
  if (!unavailable_reason_.empty()) DSEC_LOG(kWarn, kLog) << unavailable_reason_ << " (creates will get 501)";
}

NodeAgent::~NodeAgent() { shutdown(false); }

void NodeAgent::shutdown(bool destroy_sandboxes) {
  {
    std::lock_guard lock(reaper_mu_);
    if (shut_down_) return;
    shut_down_ = true;
    stopping_ = true;
  }
  reaper_cv_.notify_all();
  if (reaper_.joinable()) reaper_.join();
  if (fncall_) fncall_->shutdown();  // fncall workers are never left for re-adoption
  if (density_) density_->stop();
  std::vector<std::string> ids;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, rec] : sandboxes_) ids.push_back(id);
  }
  if (destroy_sandboxes) {
    for (const auto& id : ids) (void)destroy(id, "node shutdown");
  } else if (!ids.empty()) {
    DSEC_LOG(kInfo, kLog) << "leaving " << ids.size() << " sandbox(es) running for the next agent";
  }
  bool none_left = false;
  {
    std::lock_guard lock(mu_);
    none_left = sandboxes_.empty();
    sandboxes_.clear();
  }
  if (none_left) removeEmptyCgroupParent(cgroup_parent_);
  // The job's claim stays for its epilog even when no sandbox is left: the layer mounts go only when the
  // image source does, and a rank killed soon after SIGTERM (mpirun does that) never gets there.
  // Done with the directory: the next agent (or the job's epilog) may take it.
  dir_lock_ = StateDirLock();
}

Status NodeAgent::claimDirectory() {
  // Simulated parts keep no records and run nothing: nothing to hold and nothing for an epilog.
  if (!backend_has_cgroups_) return okStatus();
  auto lock = StateDirLock::acquire(options_.root, options_.slurm_job);
  if (!lock.ok()) return lock.error().wrap("another agent (or a job's epilog) holds this node directory");
  dir_lock_ = std::move(*lock);
  char resolved[PATH_MAX];
  JobClaim claim;
  claim.job = options_.slurm_job;
  claim.host = currentHostName();
  claim.node = options_.node_name;
  claim.state_dir = ::realpath(options_.root.c_str(), resolved) ? std::string(resolved) : options_.root;
  claim.cgroup_parent = cgroup_parent_;
  claim.pid = ::getpid();
  dropOtherJobsClaims(options_.job_registry_dir, claim);
  if (options_.slurm_job.empty()) return okStatus();
  if (auto st = registerJobClaim(options_.job_registry_dir, claim); !st.ok()) {
    return st.error().wrap("recording what Slurm job " + claim.job + " owns here, for its epilog");
  }
  return okStatus();
}

std::vector<std::shared_ptr<SandboxRecord>> NodeAgent::sampleRegistry(
    const std::function<void(int64_t memory, double cpus)>& with_sums) {
  std::vector<std::shared_ptr<SandboxRecord>> recs;
  int64_t memory = 0;
  double cpus = 0;
  std::lock_guard lock(mu_);
  recs.reserve(sandboxes_.size());
  for (const auto& [id, rec] : sandboxes_) {
    recs.push_back(rec);
    memory += rec->params.memory_bytes;
    cpus += rec->params.cpus;
  }
  with_sums(memory, cpus);
  return recs;
}

size_t NodeAgent::sandboxCount() {
  std::lock_guard lock(mu_);
  return sandboxes_.size();
}

std::shared_ptr<SandboxRecord> NodeAgent::find(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = sandboxes_.find(id);
  return it == sandboxes_.end() ? nullptr : it->second;
}

Status NodeAgent::persist(SandboxRecord& rec) {
  SandboxStateRecord record;
  record.id = rec.id;
  record.params = rec.params;
  record.created_unix = rec.created_unix;
  bool paused = rec.sandbox->state() == backends::SandboxState::kPaused;
  record.paused_by = paused ? rec.paused_by : PausedBy::kNone;
  record.backend_state = rec.sandbox->persistentState();
  if (cpu_) record.cpuset = cpu_->bookingOf(rec.id).cpuset;  // to book the same cores again after a restart
  record.slurm_job = options_.slurm_job;
  return state_->save(record);
}

backends::SandboxSpec NodeAgent::sandboxSpec(const SandboxRecord& rec, const CpuReservation& cores) const {
  const CreateParams& params = rec.params;
  backends::SandboxSpec spec;
  spec.id = rec.id;
  spec.image = params.image;
  if (rec.mount) {
    spec.lower_dirs = rec.mount->dirs();
    spec.lower_files = rec.mount->files();
  }
  spec.memory_bytes = params.memory_bytes;
  spec.cpus = params.cpus;
  spec.pids = params.pids;
  spec.disk_bytes = params.disk_bytes;
  spec.env = params.env;
  spec.network = params.network;
  spec.egress = params.egress;
  spec.protected_paths = params.protected_paths;
  spec.qos = params.qos;
  cores.applyTo(spec);
  return spec;
}

Result<CreateParams> NodeAgent::withBackendDefaults(const CreateParams& requested) const {
  if (requested.backend == backends::BackendKind::kContainer) return requested;
  const std::string name = backends::backendKindName(requested.backend);
  if (requested.backend == backends::BackendKind::kFncall) {
    return Error::invalid("fncall is not a sandbox backend: POST /v1/call runs code on it");
  }
  if (backendFor(requested.backend) == nullptr) {
    auto why = machine_unavailable_.find(requested.backend);
    return Error(ErrorCode::kUnsupported, name + " is not available on node " + options_.node_name + ": " +
                                              (why != machine_unavailable_.end() ? why->second : "no backend"));
  }
  CreateParams params = requested;
  // A VM's RAM is all of it at once: it counts as committed even when the create named no limit.
  if (params.memory_bytes == 0) params.memory_bytes = options_.vm.default_memory_bytes;
  return params;
}

Status NodeAgent::reserveCreateSlot() {
  if (!backend_ || !unavailable_reason_.empty()) return Error(ErrorCode::kUnsupported, unavailable_reason_);
  int64_t held = 0;
  {
    std::lock_guard lock(mu_);
    held = static_cast<int64_t>(sandboxes_.size()) + pending_creates_;
    if (held >= options_.max_sandboxes) {
      return Error(ErrorCode::kResourceExhausted, "node " + options_.node_name + " is full (" +
                                                      std::to_string(options_.max_sandboxes) + " sandboxes)");
    }
    ++pending_creates_;
  }
  if (!backend_runs_processes_) return okStatus();
  Status room = room_.check(held);
  if (!room.ok()) {
    releaseCreateSlot();
    return room.error().wrap("node " + options_.node_name + " cannot take another sandbox");
  }
  return okStatus();
}

void NodeAgent::releaseCreateSlot() {
  std::lock_guard lock(mu_);
  --pending_creates_;
}

Status NodeAgent::checkCreatable(const CreateParams& params) {
  if (!params.session.empty()) DSEC_TRY(sessions_->checkJoinable(params.session));
  return images_->check(params.layers);
}

Status NodeAgent::startSandbox(SandboxRecord& rec, const CpuReservation& cores) {
  const CreateParams& params = rec.params;
  auto mount = images_->acquire(params.layers);
  if (!mount.ok()) return mount.error().wrap("mounting image " + params.image);
  rec.mount = std::move(*mount);

  auto sandbox = makeSandbox(rec, sandboxSpec(rec, cores));  // a machine snapshot's restore, else create
  if (!sandbox.ok()) {
    Error e = explainLimitError(sandbox.error(), static_cast<int64_t>(sandboxCount()));
    DSEC_LOG(kWarn, kLog) << "create " << rec.id << " failed: " << e.toString();
    return e.wrap("creating sandbox " + rec.id);
  }
  rec.sandbox = std::move(*sandbox);
  if (auto st = persist(rec); !st.ok()) {
    (void)rec.sandbox->destroy();
    return st.error().wrap("persisting sandbox state");
  }
  if (!params.session.empty()) {
    // After the sandbox's own state file, so a crash in between leaves a member the restart's reconcile adds.
    if (auto st = sessions_->addSandbox(params.session, rec.id); !st.ok()) {
      (void)rec.sandbox->destroy();
      (void)state_->remove(rec.id);
      return st.error();
    }
  }
  return okStatus();
}

Result<SandboxInfo> NodeAgent::create(const CreateParams& requested) {
  double t0 = monotonicSeconds();
  auto fail = [this](const Error& e) -> Error {
    metrics_->create_failures_total++;
    return e;
  };
  auto completed = withBackendDefaults(requested);
  if (!completed.ok()) return fail(completed.error());
  const CreateParams& params = *completed;
  if (auto st = reserveCreateSlot(); !st.ok()) return fail(st.error());
  struct SlotGuard {
    NodeAgent* agent;
    ~SlotGuard() { agent->releaseCreateSlot(); }
  } slot{this};
  auto admitted = density_->admit(params);  // committed memory/CPUs vs capacity x ratio, and pressure
  if (!admitted.ok()) return fail(admitted.error());
  if (auto st = checkCreatable(params); !st.ok()) return fail(st.error());

  auto rec = std::make_shared<SandboxRecord>();
  rec->id = options_.node_name + "-" + randomHex(16);
  rec->params = params;
  rec->timeout = params.timeout;
  rec->created_unix = wallSeconds();
  rec->touch();
  // Dedicated cores (latency) or the shared pool (batch); given back if the create fails (CpuAllocator.h).
  auto cores = cpu_->reserve(rec->id, params.qos, params.cpus);
  if (!cores.ok()) return fail(cores.error());
  if (auto st = startSandbox(*rec, *cores); !st.ok()) return fail(st.error());

  SandboxInfo info = infoOf(*rec);
  {
    std::lock_guard lock(mu_);
    sandboxes_[rec->id] = rec;
  }
  cores->commit();
  admitted->commit();  // counted as committed by the density loop until its next registry sample
  double elapsed = monotonicSeconds() - t0;
  metrics_->creates_total++;
  metrics_->create_seconds.observe(elapsed);
  DSEC_LOG(kDebug, kLog) << "created " << rec->id << " (" << params.image << ") in " << elapsed * 1000 << " ms";
  return info;
}

SandboxInfo NodeAgent::infoLocked(SandboxRecord& rec) {
  SandboxInfo info;
  info.id = rec.id;
  info.node = options_.node_name;
  info.params = rec.params;
  info.state = rec.sandbox->state();
  info.created_unix = rec.created_unix;
  info.last_active_unix = rec.last_active_unix.load();
  if (info.state == backends::SandboxState::kPaused) info.paused_by = rec.paused_by;
  if (auto usage = rec.sandbox->usage(); usage.ok()) info.usage = *usage;
  if (cpu_) info.cpu = cpu_->bookingOf(rec.id);
  if (density_) info.density = density_->sandboxDensity(rec.id);
  return info;
}

SandboxInfo NodeAgent::infoOf(SandboxRecord& rec) {
  std::lock_guard rec_lock(rec.mu);
  return infoLocked(rec);
}

Result<SandboxInfo> NodeAgent::info(const std::string& id) {
  auto rec = find(id);
  if (!rec) return Error::notFound("no sandbox " + id);
  std::lock_guard lock(rec->mu);
  if (rec->destroyed) return Error::notFound("no sandbox " + id);
  return infoLocked(*rec);
}

std::vector<SandboxInfo> NodeAgent::list(const std::map<std::string, std::string>& labels) {
  std::vector<std::shared_ptr<SandboxRecord>> recs;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, rec] : sandboxes_) {
      if (labelsMatch(rec->params.labels, labels)) recs.push_back(rec);
    }
  }
  std::vector<SandboxInfo> out;
  out.reserve(recs.size());
  for (const auto& rec : recs) {
    std::lock_guard lock(rec->mu);
    if (!rec->destroyed) out.push_back(infoLocked(*rec));
  }
  return out;
}

Status NodeAgent::destroy(const std::string& id, const std::string& reason) {
  return destroyIfDue(id, [&](SandboxRecord&) { return reason; });
}

Status NodeAgent::destroyIfDue(const std::string& id, const std::function<std::string(SandboxRecord&)>& due) {
  auto rec = find(id);
  if (!rec) return Error::notFound("no sandbox " + id);
  std::string reason;
  {
    std::lock_guard lock(rec->mu);
    if (rec->destroyed) return Error::notFound("no sandbox " + id);
    reason = due(*rec);
    if (reason.empty()) return Error(ErrorCode::kConflict, "sandbox " + id + " is no longer due to be destroyed");
    // Execs in flight are killed with the sandbox; their leases keep the record (not the sandbox) alive.
    if (auto st = rec->sandbox->destroy(); !st.ok()) {
      DSEC_LOG(kError, kLog) << "destroy " << id << " failed: " << st.error().toString();
      return st.error().wrap("destroying sandbox " + id);
    }
    rec->destroyed = true;
    rec->mount.reset();
  }
  {
    std::lock_guard lock(mu_);
    sandboxes_.erase(id);
  }
  if (auto st = state_->remove(id); !st.ok())
    DSEC_LOG(kWarn, kLog) << "removing the record of " << id << ": " << st.error().toString();
  if (!rec->params.session.empty()) sessions_->removeSandbox(rec->params.session, id);
  if (density_) density_->forget(id);
  if (cpu_) cpu_->release(id);
  metrics_->destroys_total++;
  if (reason == "request") {
    DSEC_LOG(kDebug, kLog) << "destroyed " << id;
  } else {
    DSEC_LOG(kInfo, kLog) << "destroyed " << id << " (" << reason << ")";
  }
  return okStatus();
}

Result<SandboxInfo> NodeAgent::pause(const std::string& id) {
  auto rec = find(id);
  if (!rec) return Error::notFound("no sandbox " + id);
  std::lock_guard lock(rec->mu);
  if (rec->destroyed) return Error::notFound("no sandbox " + id);
  if (rec->sandbox->state() != backends::SandboxState::kPaused) {
    DSEC_TRY(rec->sandbox->pause());
    rec->paused_by = PausedBy::kUser;
    if (auto st = persist(*rec); !st.ok())
      DSEC_LOG(kWarn, kLog) << "persisting " << id << ": " << st.error().toString();
  }
  return infoLocked(*rec);
}

Result<SandboxInfo> NodeAgent::setTimeout(const std::string& id, double seconds) {
  if (!(seconds >= 0)) return Error::invalid("timeout must be >= 0 seconds");
  auto rec = find(id);
  if (!rec) return Error::notFound("no sandbox " + id);
  std::lock_guard lock(rec->mu);
  if (rec->destroyed) return Error::notFound("no sandbox " + id);
  rec->params.timeout = seconds == 0 ? 0 : std::max(wallSeconds() - rec->created_unix, 0.0) + seconds;
  rec->timeout = rec->params.timeout;
  if (auto st = persist(*rec); !st.ok()) DSEC_LOG(kWarn, kLog) << "persisting " << id << ": " << st.error().toString();
  return infoLocked(*rec);
}

Result<SandboxInfo> NodeAgent::resume(const std::string& id) {
  auto rec = find(id);
  if (!rec) return Error::notFound("no sandbox " + id);
  std::lock_guard lock(rec->mu);
  if (rec->destroyed) return Error::notFound("no sandbox " + id);
  if (rec->sandbox->state() == backends::SandboxState::kPaused) {
    DSEC_TRY(rec->sandbox->resume());
    rec->paused_by = PausedBy::kNone;
    if (auto st = persist(*rec); !st.ok())
      DSEC_LOG(kWarn, kLog) << "persisting " << id << ": " << st.error().toString();
  }
  rec->touch();
  return infoLocked(*rec);
}

Result<SandboxLease> NodeAgent::use(const std::string& id) {
  auto rec = find(id);
  if (!rec) return Error::notFound("no sandbox " + id);
  std::lock_guard lock(rec->mu);
  if (rec->destroyed) return Error::notFound("no sandbox " + id);
  auto state = rec->sandbox->state();
  if (state == backends::SandboxState::kPaused) {
    // Transparent resume, also of a sandbox paused because its session's lease lapsed.
    DSEC_TRY(rec->sandbox->resume());
    if (rec->paused_by == PausedBy::kLease)
      DSEC_LOG(kInfo, kLog) << "resumed " << id << " (paused by its session's lease)";
    rec->paused_by = PausedBy::kNone;
    if (auto st = persist(*rec); !st.ok())
      DSEC_LOG(kWarn, kLog) << "persisting " << id << ": " << st.error().toString();
  } else if (state == backends::SandboxState::kStopped) {
    return Error(ErrorCode::kConflict, "sandbox " + id + " has stopped (its init exited)");
  }
  rec->active.fetch_add(1);
  rec->touch();
  return SandboxLease(rec);
}

void NodeAgent::reaperLoop() {
  std::unique_lock lock(reaper_mu_);
  while (!stopping_) {
    reaper_cv_.wait_for(lock, std::chrono::duration<double>(options_.reaper_interval_seconds));
    if (stopping_) break;
    lock.unlock();
    reapSessions();
    reapExpired();
    reapSnapshots();
    lock.lock();
  }
}

// A session whose lease ran out is the trainer's absence, not its sandboxes' idleness: they are kept for the
// reattach even on a tick that comes before the one that pauses them (a late reaper thread, a failed pause).
bool NodeAgent::sessionNotRenewed(const std::string& session, double now_wall) {
  if (session.empty()) return false;
  auto s = sessions_->get(session);
  return s.ok() && (s->lapsed() || s->expires_unix <= now_wall);
}

std::string NodeAgent::expiryReasonLocked(SandboxRecord& rec, double now_wall, double now_mono) {
  const CreateParams& p = rec.params;
  if (p.timeout > 0 && now_wall - rec.created_unix >= p.timeout) {
    return "timeout of " + std::to_string(p.timeout) + " s reached";
  }
  if (p.idle_timeout <= 0 || rec.active.load() != 0 || now_mono - rec.last_active_mono.load() < p.idle_timeout) {
    return "";
  }
  bool paused_by_lease = rec.paused_by == PausedBy::kLease && rec.sandbox->state() == backends::SandboxState::kPaused;
  if (paused_by_lease || sessionNotRenewed(p.session, now_wall)) return "";
  return "idle for " + std::to_string(p.idle_timeout) + " s";
}

void NodeAgent::reapExpired() {
  std::vector<std::shared_ptr<SandboxRecord>> recs;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, rec] : sandboxes_) recs.push_back(rec);
  }
  const double now_wall = wallSeconds(), now_mono = monotonicSeconds();
  for (const auto& rec : recs) {
    // Most records are far from both limits: skip them without their lock (the idle timeout and creation never
    // change; the timeout is read from its atomic copy).
    const CreateParams& p = rec->params;
    const double timeout = rec->timeout.load();
    bool maybe_timed_out = timeout > 0 && now_wall - rec->created_unix >= timeout;
    bool maybe_idle = p.idle_timeout > 0 && now_mono - rec->last_active_mono.load() >= p.idle_timeout;
    if (!maybe_timed_out && !maybe_idle) continue;
    // Decided under the record's lock, where use() takes it: a use that resumes the sandbox and marks it active
    // either comes first (and it is not due) or finds it destroyed, never in between.
    Status st = destroyIfDue(
        rec->id, [&](SandboxRecord& locked) { return expiryReasonLocked(locked, now_wall, monotonicSeconds()); });
    if (st.ok()) metrics_->reaped_total++;
  }
}

NodeInfo NodeAgent::nodeInfo() {
  NodeInfo info;
  info.node = options_.node_name;
  info.fleet = options_.fleet_name;
  if (unavailable_reason_.empty()) {
    info.backends.push_back(backends::BackendKind::kContainer);
  } else {
    info.unavailable_backends[backends::BackendKind::kContainer] = unavailable_reason_;
  }
  for (auto kind : {backends::BackendKind::kMicrovm, backends::BackendKind::kVm}) {
    if (machine_backends_.count(kind) != 0) {
      info.backends.push_back(kind);
    } else {
      auto why = machine_unavailable_.find(kind);
      info.unavailable_backends[kind] = why != machine_unavailable_.end() ? why->second : "not available on this node";
    }
  }
  for (const auto& [kind, note] : machine_notes_) info.backend_notes[kind] = note;
  int64_t committed = 0, free_slots = 0;
  {
    std::lock_guard lock(mu_);
    info.sandboxes = sandboxes_.size();
    for (const auto& [id, rec] : sandboxes_) committed += rec->params.memory_bytes;
    free_slots = options_.max_sandboxes - static_cast<int64_t>(sandboxes_.size()) - pending_creates_;
  }
  info.capacity.max_sandboxes = options_.max_sandboxes;
  info.capacity.free_sandboxes = std::max<int64_t>(0, options_.max_sandboxes - static_cast<int64_t>(info.sandboxes));
  info.capacity.memory_bytes = node_memory_bytes_;
  info.capacity.memory_committed_bytes = committed;
  info.capacity.cpus = static_cast<int64_t>(sysconf(_SC_NPROCESSORS_ONLN));
  if (density_) info.density = density_->nodeInfo();
  info.user_namespaces = options_.user_namespaces;
  if (!options_.user_namespaces) {
    info.isolation_warning = "user namespaces are off (operator opt-out): sandbox root is host root";
  }
  if (cpu_) info.qos = cpu_->nodeInfo();
  if (density_) {
    // Everything a create is admitted by (reserveCreateSlot, the density loop, the CPU QoS books), in one place.
    info.admission = density_->admissionInfo();
    info.admission->state.free_sandboxes = std::max<int64_t>(0, free_slots);
    info.admission->state.free_dedicated_cores =
        info.qos ? (info.qos->enabled ? info.qos->free_dedicated_cores : 0) : -1;
  }
  addFncallInfo(&info);
  info.layer_store = images_->sharedStore();
  return info;
}

Result<std::vector<LayerStatus>> NodeAgent::layers() { return images_->layers(); }

void NodeAgent::renderGauges(std::string* out) {
  int64_t running = 0, paused = 0, stopped = 0, committed = 0, paused_by_lease = 0;
  std::vector<std::shared_ptr<SandboxRecord>> recs;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, rec] : sandboxes_) recs.push_back(rec);
  }
  for (const auto& rec : recs) {
    std::lock_guard lock(rec->mu);
    if (rec->destroyed) continue;
    committed += rec->params.memory_bytes;
    switch (rec->sandbox->state()) {
      case backends::SandboxState::kRunning:
        ++running;
        break;
      case backends::SandboxState::kPaused:
        ++paused;
        if (rec->paused_by == PausedBy::kLease) ++paused_by_lease;
        break;
      case backends::SandboxState::kStopped:
        ++stopped;
        break;
    }
  }
  int64_t mounts = images_->mountedLayers();
  using prometheus::number;
  prometheus::family(out, "dsec_sandboxes", "gauge", "Live sandboxes by state.");
  prometheus::sample(out, "dsec_sandboxes", {{"state", "running"}}, number(running));
  prometheus::sample(out, "dsec_sandboxes", {{"state", "paused"}}, number(paused));
  prometheus::sample(out, "dsec_sandboxes", {{"state", "stopped"}}, number(stopped));
  prometheus::gauge(out, "dsec_layer_mounts", "Layers mounted on this node.", mounts);
  prometheus::gauge(out, "dsec_node_memory_committed_bytes", "Sum of live sandboxes' memory limits.", committed);
  prometheus::gauge(out, "dsec_node_memory_bytes", "Physical memory of the node.", node_memory_bytes_);
  prometheus::family(out, "dsec_sessions", "gauge", "Sessions by state.");
  prometheus::sample(out, "dsec_sessions", {{"state", "active"}}, number(sessions_->countActive()));
  prometheus::sample(out, "dsec_sessions", {{"state", "lapsed"}}, number(sessions_->countLapsed()));
  prometheus::counter(out, "dsec_session_lapses_total", "Session leases that lapsed.", sessions_->lapsesTotal());
  prometheus::gauge(out, "dsec_sandboxes_paused_by_lease", "Sandboxes paused because their session's lease lapsed.",
                    paused_by_lease);
  prometheus::family(out, "dsec_violations_total", "counter",
                     "What sandboxes' processes were refused (egress connects and sends, DNS names, protected files).");
  for (auto kind : backends::kViolationKinds) {
    prometheus::sample(out, "dsec_violations_total", {{"kind", backends::violationKindName(kind)}},
                       number(backends::violationsTotal(kind)));
  }
  if (auto shared = images_->sharedStore()) {
    const fs3::ChunkCacheStats& c = shared->cache;
    prometheus::counter(out, "dsec_chunk_cache_hits_total", "Reads of on-demand layers served by the chunk cache.",
                        c.hits);
    prometheus::counter(out, "dsec_chunk_cache_misses_total", "Chunks fetched from the shared layer store.", c.misses);
    prometheus::counter(out, "dsec_chunk_fetched_bytes_total", "Bytes fetched from the shared layer store.",
                        c.bytes_fetched);
    prometheus::counter(out, "dsec_chunk_cache_evictions_total", "Chunks evicted from the chunk cache.", c.evictions);
    prometheus::counter(out, "dsec_chunk_corrupt_total", "Chunks that failed their sha256 (never used).", c.corrupt);
    prometheus::counter(out, "dsec_chunk_fetch_errors_total", "Chunk fetches that failed after their retries.",
                        c.fetch_errors);
    prometheus::gauge(out, "dsec_chunk_cache_bytes", "Bytes of chunks in the node's chunk cache.", c.bytes_cached);
    prometheus::counter(out, "dsec_chunk_prefetched_total",
                        "Chunks fetched ahead of their sandboxes by recorded prefetch.",
                        shared->prefetch.chunks_prefetched);
  }
  if (density_) density_->renderMetrics(out);
  if (fncall_) fncall_->renderMetrics(out);
}

}  // namespace dsec::launcher
