#include "dsec/launcher/node/NodeAgent.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <set>

#include "dsec/backends/container/ContainerBackend.h"
#include "dsec/common/Directory.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Prometheus.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/node/CpuAllocator.h"
#include "dsec/launcher/node/DensityLoop.h"
#include "dsec/launcher/node/SimulatedBackend.h"

namespace dsec::launcher {
namespace {

using nlohmann::json;

constexpr const char* kLog = "node";

json paramsToJson(const CreateParams& p) {
  return json{{"image", p.image},
              {"backend", p.backend},
              {"cpus", p.cpus},
              {"memory", p.memory_bytes},
              {"disk", p.disk_bytes},
              {"pids", p.pids},
              {"timeout", p.timeout},
              {"idle_timeout", p.idle_timeout},
              {"network", backends::networkModeName(p.network)},
              {"env", p.env},
              {"labels", p.labels},
              {"session", p.session.empty() ? json(nullptr) : json(p.session)},
              {"qos", backends::cpuQosName(p.qos)}};
}

// The inverse of paramsToJson for a state file written by an earlier agent (trusted, but still checked).
Result<CreateParams> paramsFromState(const json& j) {
  CreateParams p;
  try {
    p.image = j.at("image").get<std::string>();
    auto layers = fs3::parseImageRef(p.image);
    if (!layers.ok()) return layers.error();
    p.layers = *layers;
    p.backend = j.value("backend", "container");
    p.cpus = j.value("cpus", 0.0);
    p.memory_bytes = j.value("memory", int64_t{0});
    p.disk_bytes = j.value("disk", int64_t{0});
    p.pids = j.value("pids", int64_t{0});
    p.timeout = j.value("timeout", 0.0);
    p.idle_timeout = j.value("idle_timeout", 0.0);
    auto network = backends::parseNetworkMode(j.value("network", "none"));
    if (!network.ok()) return network.error();
    p.network = *network;
    p.env = j.value("env", std::map<std::string, std::string>{});
    p.labels = j.value("labels", std::map<std::string, std::string>{});
    if (j.contains("session") && j["session"].is_string()) p.session = j["session"].get<std::string>();
    p.qos = j.value("qos", "batch") == "latency" ? backends::CpuQos::kLatency : backends::CpuQos::kBatch;
  } catch (const json::exception& e) {
    return Error::invalid(std::string("bad state file: ") + e.what());
  }
  return p;
}

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

std::string rfc3339(double unix_seconds) {
  time_t t = static_cast<time_t>(unix_seconds);
  struct tm tm;
  gmtime_r(&t, &tm);
  char buf[32];
  strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
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

NodeAgent::NodeAgent(const NodeOptions& options, Metrics* metrics)
    : options_(options), metrics_(metrics), store_(options.root) {}

Result<std::unique_ptr<NodeAgent>> NodeAgent::start(const NodeOptions& options, Metrics* metrics) {
  std::unique_ptr<NodeAgent> agent(new NodeAgent(options, metrics));
  agent->node_memory_bytes_ = options.memory_capacity_bytes > 0 ? options.memory_capacity_bytes : physicalMemory();
  auto made = makeDirs(agent->stateDir(), 0700);
  if (!made.ok()) return made.error().wrap("creating the state directory");
  agent->mounter_ = std::make_unique<fs3::LayerMounter>(&agent->store_);

  backends::ContainerBackendOptions backend_options;
  backend_options.cgroup_parent =
      options.cgroup_parent.empty() ? cgroupParentForRoot(options.root) : options.cgroup_parent;
  backend_options.cpu_qos = options.cpu_qos;
  if (!options.user_namespaces) {
    backend_options.user_namespace = backends::UserNamespaceMode::kOff;
    DSEC_LOG(kWarn, kLog) << "user namespaces are off by the operator's choice: sandbox root is host root "
                             "(with reduced capabilities, no_new_privs and seccomp); see docs/security.md";
  }
  agent->cgroup_parent_ = backend_options.cgroup_parent;
  // A simulated node needs no kernel features: its sandboxes are records only (SimulatedBackend.h).
  auto backend = options.simulate ? Result<std::unique_ptr<backends::Backend>>(makeSimulatedBackend())
                                  : backends::makeContainerBackend(backend_options);
  if (!backend.ok()) {
    agent->unavailable_reason_ = "container backend unavailable: " + backend.error().message();
  } else {
    auto missing = (*backend)->missingFeatures();
    if (!missing.empty()) {
      std::string reason = "container backend unavailable, host lacks:";
      for (const auto& m : missing) reason += " " + m + ";";
      reason.pop_back();
      agent->unavailable_reason_ = reason;
    }
    agent->backend_ = std::move(*backend);
  }
  if (!agent->unavailable_reason_.empty()) {
    DSEC_LOG(kWarn, kLog) << agent->unavailable_reason_ << " (creates will get 501)";
  }
  agent->sessions_ = std::make_unique<SessionTable>(options.root + "/state/sessions");
  // A simulated node books cores but moves no cgroups (it has none).
  agent->cpu_ = std::make_unique<CpuAllocator>(
      CpuAllocatorOptions{options.cpu_qos, options.cpu_exclusive_pool && !options.simulate, agent->cgroup_parent_, ""});
  if (agent->backend_) agent->adoptAll();
  agent->loadSessions();
  agent->startFncall();  // after adoptAll: leftover fncall workers of an earlier agent are reaped by then
  agent->density_ = std::make_unique<DensityLoop>(agent.get(), options.density, options.memory_capacity_bytes,
                                                  options.density_interval_seconds, agent->cgroup_parent_);
  agent->density_->start();
  agent->reaper_ = std::thread([a = agent.get()] { a->reaperLoop(); });
  return agent;
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
  if (none_left) removeEmptyCgroupParent();
}

void NodeAgent::removeEmptyCgroupParent() {
  // The backend creates <hierarchy>/<parent> on demand; with no sandbox left it is an empty directory per
  // hierarchy. rmdir only succeeds on an empty cgroup, so a sandbox of another agent is never touched.
  const std::string& parent = cgroup_parent_;
  if (parent.empty() || parent.find('/') != std::string::npos) return;
  (void)::rmdir(("/sys/fs/cgroup/" + parent).c_str());
  auto listed = listDirectory("/sys/fs/cgroup");
  const auto* hierarchies = listed.ifOk();  // (shutdown runs from the destructor: nothing here may throw)
  if (hierarchies == nullptr) return;
  for (const auto& h : *hierarchies) {
    if (h.name[0] != '.') (void)::rmdir(("/sys/fs/cgroup/" + h.name + "/" + parent).c_str());
  }
}

std::string NodeAgent::stateDir() const { return options_.root + "/state/sandboxes"; }
std::string NodeAgent::statePath(const std::string& id) const { return stateDir() + "/" + id + ".json"; }

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
  // A simulated node keeps its records in memory only: a state file per create (an ext4 inode allocation)
  // was a third of the CPU of `dsec bench gateway`, and records without processes have nothing to re-adopt.
  if (options_.simulate) return okStatus();
  json state = paramsToJson(rec.params);
  state["id"] = rec.id;
  state["created_unix"] = rec.created_unix;
  state["paused"] = rec.sandbox->state() == backends::SandboxState::kPaused;
  state["paused_by"] = state["paused"].get<bool>() && !rec.paused_by.empty() ? json(rec.paused_by) : json(nullptr);
  state["backend_state"] = rec.sandbox->persistentState();
  if (cpu_) cpu_->annotate(rec.id, rec.params.qos, &state);  // "cpuset" to re-reserve after a restart
  return writeStateFile(statePath(rec.id), state.dump());
}

Result<json> NodeAgent::create(const CreateParams& params) {
  double t0 = monotonicSeconds();
  if (!backend_ || !unavailable_reason_.empty()) {
    metrics_->create_failures_total++;
    return Error(ErrorCode::kUnsupported, unavailable_reason_);
  }
  {
    std::lock_guard lock(mu_);
    if (static_cast<int64_t>(sandboxes_.size()) + pending_creates_ >= options_.max_sandboxes) {
      metrics_->create_failures_total++;
      return Error(ErrorCode::kResourceExhausted, "node " + options_.node_name + " is full (" +
                                                      std::to_string(options_.max_sandboxes) + " sandboxes)");
    }
    ++pending_creates_;
  }
  auto admitted = density_->admit(params);  // committed memory/CPUs vs capacity x ratio, and pressure
  if (!admitted.ok()) {
    std::lock_guard lock(mu_);
    --pending_creates_;
    metrics_->create_failures_total++;
    return admitted.error();
  }
  struct PendingGuard {
    NodeAgent* agent;
    ~PendingGuard() {
      std::lock_guard lock(agent->mu_);
      --agent->pending_creates_;
    }
  } pending_guard{this};
  auto fail = [this](const Error& e) -> Error {
    metrics_->create_failures_total++;
    return e;
  };

  if (!params.session.empty()) {
    if (auto st = sessions_->checkJoinable(params.session); !st.ok()) return fail(st.error());
  }
  // A simulated node has no layer store to check or mount from (the request was still validated in full).
  if (auto st = options_.simulate ? okStatus() : store_.checkImage(params.layers); !st.ok()) return fail(st.error());
  auto rec = std::make_shared<SandboxRecord>();
  rec->id = options_.node_name + "-" + randomHex(16);
  rec->params = params;
  rec->created_unix = wallSeconds();
  rec->touch();
  // Dedicated cores (latency) or the shared pool (batch); given back if the create fails (CpuAllocator.h).
  auto cores = cpu_->reserve(rec->id, params.qos, params.cpus);
  if (!cores.ok()) return fail(cores.error());

  if (!options_.simulate) {
    auto mount = mounter_->acquire(params.layers);
    if (!mount.ok()) return fail(mount.error().wrap("mounting image " + params.image));
    rec->mount = std::move(*mount);
  }

  backends::SandboxSpec spec;
  spec.id = rec->id;
  spec.image = params.image;
  if (rec->mount) spec.lower_dirs = rec->mount->dirs();
  spec.memory_bytes = params.memory_bytes;
  spec.cpus = params.cpus;
  spec.pids = params.pids;
  spec.disk_bytes = params.disk_bytes;
  spec.env = params.env;
  spec.network = params.network;
  spec.qos = params.qos;
  cores->applyTo(spec);
  auto sandbox = backend_->create(spec);
  if (!sandbox.ok()) {
    DSEC_LOG(kWarn, kLog) << "create " << rec->id << " failed: " << sandbox.error().toString();
    return fail(sandbox.error().wrap("creating sandbox " + rec->id));
  }
  rec->sandbox = std::move(*sandbox);
  if (auto st = persist(*rec); !st.ok()) {
    (void)rec->sandbox->destroy();
    return fail(st.error().wrap("persisting sandbox state"));
  }
  if (!params.session.empty()) {
    // After the sandbox's own state file, so a crash in between leaves a member the restart's reconcile adds.
    if (auto st = sessions_->addSandbox(params.session, rec->id); !st.ok()) {
      (void)rec->sandbox->destroy();
      ::unlink(statePath(rec->id).c_str());
      return fail(st.error());
    }
  }
  json info;
  {
    std::lock_guard rec_lock(rec->mu);
    info = infoLocked(*rec);
  }
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

json NodeAgent::infoLocked(SandboxRecord& rec) {
  const CreateParams& p = rec.params;
  json j = paramsToJson(p);
  j["id"] = rec.id;
  j["node"] = options_.node_name;
  j["state"] = backends::sandboxStateName(rec.sandbox->state());
  j["created"] = rfc3339(rec.created_unix);
  j["created_unix"] = rec.created_unix;
  j["last_active_unix"] = rec.last_active_unix.load();
  bool paused = rec.sandbox->state() == backends::SandboxState::kPaused;
  j["paused_by"] = paused ? json(rec.paused_by.empty() ? "user" : rec.paused_by) : json(nullptr);
  json usage = {{"memory_bytes", 0}, {"pids", 0}, {"cpu_usec", 0}, {"oom_kills", 0}};
  if (auto u = rec.sandbox->usage(); u.ok()) {
    usage = {
        {"memory_bytes", u->memory_bytes}, {"pids", u->pids}, {"cpu_usec", u->cpu_usec}, {"oom_kills", u->oom_kills}};
  }
  j["usage"] = usage;
  if (cpu_) cpu_->annotate(rec.id, p.qos, &j);  // "qos", "cpuset", "cpuset_mems"
  if (density_) density_->annotate(rec, &j);
  return j;
}

Result<json> NodeAgent::info(const std::string& id) {
  auto rec = find(id);
  if (!rec) return Error::notFound("no sandbox " + id);
  std::lock_guard lock(rec->mu);
  if (rec->destroyed) return Error::notFound("no sandbox " + id);
  return infoLocked(*rec);
}

json NodeAgent::list(const std::map<std::string, std::string>& labels) {
  std::vector<std::shared_ptr<SandboxRecord>> recs;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, rec] : sandboxes_) {
      if (labelsMatch(rec->params.labels, labels)) recs.push_back(rec);
    }
  }
  json out = json::array();
  for (const auto& rec : recs) {
    std::lock_guard lock(rec->mu);
    if (!rec->destroyed) out.push_back(infoLocked(*rec));
  }
  return json{{"sandboxes", out}};
}

Status NodeAgent::destroy(const std::string& id, const std::string& reason) {
  auto rec = find(id);
  if (!rec) return Error::notFound("no sandbox " + id);
  {
    std::lock_guard lock(rec->mu);
    if (rec->destroyed) return Error::notFound("no sandbox " + id);
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
  if (::unlink(statePath(id).c_str()) != 0 && errno != ENOENT) {
    DSEC_LOG(kWarn, kLog) << "removing state of " << id << ": " << strerror(errno);
  }
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

Result<json> NodeAgent::pause(const std::string& id) {
  auto rec = find(id);
  if (!rec) return Error::notFound("no sandbox " + id);
  std::lock_guard lock(rec->mu);
  if (rec->destroyed) return Error::notFound("no sandbox " + id);
  if (rec->sandbox->state() != backends::SandboxState::kPaused) {
    DSEC_TRY(rec->sandbox->pause());
    rec->paused_by = "user";
    if (auto st = persist(*rec); !st.ok())
      DSEC_LOG(kWarn, kLog) << "persisting " << id << ": " << st.error().toString();
  }
  return infoLocked(*rec);
}

Result<json> NodeAgent::resume(const std::string& id) {
  auto rec = find(id);
  if (!rec) return Error::notFound("no sandbox " + id);
  std::lock_guard lock(rec->mu);
  if (rec->destroyed) return Error::notFound("no sandbox " + id);
  if (rec->sandbox->state() == backends::SandboxState::kPaused) {
    DSEC_TRY(rec->sandbox->resume());
    rec->paused_by.clear();
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
    if (rec->paused_by == "lease") DSEC_LOG(kInfo, kLog) << "resumed " << id << " (paused by its session's lease)";
    rec->paused_by.clear();
    if (auto st = persist(*rec); !st.ok())
      DSEC_LOG(kWarn, kLog) << "persisting " << id << ": " << st.error().toString();
  } else if (state == backends::SandboxState::kStopped) {
    return Error(ErrorCode::kConflict, "sandbox " + id + " has stopped (its init exited)");
  }
  rec->active.fetch_add(1);
  rec->touch();
  return SandboxLease(rec);
}

void NodeAgent::adoptAll() {
  auto listed = listStateFiles(stateDir());
  if (!listed.ok()) return;
  const std::vector<std::string>& files = *listed;
  int adopted = 0, reaped = 0;
  for (const auto& name : files) {
    std::string path = stateDir() + "/" + name;
    std::string id = name.substr(0, name.size() - 5);
    auto text = readFile(path);
    json state;
    if (text.ok()) {
      state = json::parse(*text, nullptr, false);
    }
    if (!text.ok() || state.is_discarded() || !state.is_object()) {
      DSEC_LOG(kWarn, kLog) << "unreadable state file " << path << ", removing it";
      ::unlink(path.c_str());
      continue;
    }
    json backend_state = state.value("backend_state", json::object());
    auto params = paramsFromState(state);
    std::string why;
    std::unique_ptr<fs3::ImageMount> mount;
    std::unique_ptr<backends::Sandbox> sandbox;
    if (!params.ok()) {
      why = params.error().message();
    } else if (state.value("id", "") != id) {
      why = "state file names a different id";
    } else {
      auto m = mounter_->acquire(params->layers);
      if (!m.ok()) {
        why = m.error().toString();
      } else {
        mount = std::move(*m);
        auto sb = backend_->adopt(backend_state);
        if (!sb.ok()) {
          why = sb.error().toString();
        } else {
          sandbox = std::move(*sb);
        }
      }
    }
    if (!sandbox) {
      DSEC_LOG(kInfo, kLog) << "cannot adopt " << id << " (" << why << "), reaping it";
      if (auto st = backend_->reap(backend_state); !st.ok()) {
        DSEC_LOG(kWarn, kLog) << "reaping " << id << ": " << st.error().toString();
      }
      ::unlink(path.c_str());
      ++reaped;
      continue;
    }
    auto rec = std::make_shared<SandboxRecord>();
    rec->id = id;
    rec->params = std::move(*params);
    rec->created_unix = state.value("created_unix", wallSeconds());
    rec->touch();
    rec->mount = std::move(mount);
    rec->sandbox = std::move(sandbox);
    if (rec->sandbox->state() == backends::SandboxState::kPaused) {
      rec->paused_by = state.contains("paused_by") && state["paused_by"].is_string()
                           ? state["paused_by"].get<std::string>()
                           : "user";
    }
    {
      std::lock_guard lock(mu_);
      sandboxes_[id] = rec;
    }
    json recorded = state.value("cpuset", json(nullptr));
    if (auto st = cpu_->readopt(id, rec->params.qos, rec->params.cpus,
                                recorded.is_string() ? recorded.get<std::string>() : "");
        !st.ok()) {
      DSEC_LOG(kWarn, kLog) << "re-adopted " << id << " without its cores: " << st.error().toString();
    }
    ++adopted;
  }
  std::set<std::string> known;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, rec] : sandboxes_) known.insert(id);
  }
  if (auto leftovers = backend_->listLeftovers(); leftovers.ok()) {
    for (const auto& id : *leftovers) {
      if (known.count(id)) continue;
      DSEC_LOG(kInfo, kLog) << "reaping leftover sandbox " << id;
      if (auto st = backend_->reapLeftover(id); !st.ok()) {
        DSEC_LOG(kWarn, kLog) << "reaping leftover " << id << ": " << st.error().toString();
      }
      ++reaped;
    }
  } else {
    DSEC_LOG(kWarn, kLog) << "listing leftovers: " << leftovers.error().toString();
  }
  if (auto st = mounter_->unmountUnused(); !st.ok()) {
    DSEC_LOG(kWarn, kLog) << "unmounting unused layers: " << st.error().toString();
  }
  if (adopted || reaped) DSEC_LOG(kInfo, kLog) << "re-adopted " << adopted << " sandbox(es), reaped " << reaped;
}

void NodeAgent::reaperLoop() {
  std::unique_lock lock(reaper_mu_);
  while (!stopping_) {
    reaper_cv_.wait_for(lock, std::chrono::duration<double>(options_.reaper_interval_seconds));
    if (stopping_) break;
    lock.unlock();
    reapSessions();
    reapExpired();
    lock.lock();
  }
}

void NodeAgent::loadSessions() {
  if (auto st = sessions_->load(); !st.ok()) {
    DSEC_LOG(kWarn, kLog) << "loading sessions: " << st.error().toString();
  }
  // Without a backend nothing was adopted, and reconciling would empty every session: keep them as they are.
  if (!backend_) return;
  std::map<std::string, std::string> members;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, rec] : sandboxes_) {
      if (!rec->params.session.empty()) members[id] = rec->params.session;
    }
  }
  sessions_->reconcile(members, wallSeconds());
}

void NodeAgent::pauseForLease(const std::string& id, const std::string& session) {
  auto rec = find(id);
  if (!rec) return;
  std::lock_guard lock(rec->mu);
  if (rec->destroyed) return;
  if (rec->sandbox->state() == backends::SandboxState::kRunning) {
    if (auto st = rec->sandbox->pause(); !st.ok()) {
      DSEC_LOG(kWarn, kLog) << "pausing " << id << " (session " << session << " lapsed): " << st.error().toString();
      return;
    }
    rec->paused_by = "lease";
    if (auto st = persist(*rec); !st.ok())
      DSEC_LOG(kWarn, kLog) << "persisting " << id << ": " << st.error().toString();
  }
  if (rec->sandbox->state() != backends::SandboxState::kPaused) return;
  // Frozen processes cannot touch their pages, so what the kernel pushes out now stays out until resume.
  if (auto st = rec->sandbox->reclaimMemory(); !st.ok()) {
    DSEC_LOG(kDebug, kLog) << "reclaiming memory of " << id << ": " << st.error().toString();
  }
}

void NodeAgent::reapSessions() {
  auto due = sessions_->tick(wallSeconds());
  for (const auto& [name, ids] : due.lapsed) {
    for (const auto& id : ids) pauseForLease(id, name);
  }
  for (const auto& [name, ids] : due.expired) {
    // The session goes first, so that once any of its sandboxes is seen gone the session is too, and no
    // attach can renew a session whose sandboxes are being destroyed. A crash in between is safe: a restart
    // finds the remaining sandboxes without a session file and restores the session lapsed.
    sessions_->erase(name);
    int destroyed = 0;
    for (const auto& id : ids) {
      if (destroy(id, "retention of session " + name + " passed").ok()) {
        ++destroyed;
        metrics_->reaped_total++;
      }
    }
    DSEC_LOG(kInfo, kLog) << "session " << name << " dropped: lapsed for its whole retention, destroyed " << destroyed
                          << " sandbox(es)";
  }
}

Result<json> NodeAgent::putSession(const std::string& name, const SessionSettings& settings) {
  DSEC_ASSIGN_OR_RETURN(Session s, sessions_->put(name, settings, wallSeconds()));
  return s.toJson();
}

Result<json> NodeAgent::getSession(const std::string& name) {
  DSEC_ASSIGN_OR_RETURN(Session s, sessions_->get(name));
  return s.toJson();
}

json NodeAgent::listSessions() {
  json out = json::array();
  for (const auto& s : sessions_->list()) out.push_back(s.toJson());
  return json{{"sessions", out}};
}

Result<json> NodeAgent::attachSession(const std::string& name, std::optional<double> lease) {
  DSEC_ASSIGN_OR_RETURN(Session s, sessions_->renew(name, lease, wallSeconds()));
  json out = s.toJson();
  json infos = json::array();
  // Sandboxes stay paused: the first exec or file request to each resumes it.
  for (const auto& id : s.sandboxes) {
    if (auto i = info(id); i.ok()) infos.push_back(std::move(*i));
  }
  out["sandbox_infos"] = std::move(infos);
  return out;
}

Result<json> NodeAgent::deleteSession(const std::string& name) {
  DSEC_ASSIGN_OR_RETURN(auto ids, sessions_->beginDelete(name));
  int destroyed = 0;
  std::optional<Error> failure;
  for (const auto& id : ids) {
    auto st = destroy(id, "session " + name + " deleted");
    if (st.ok()) {
      ++destroyed;
    } else if (st.error().code() != ErrorCode::kNotFound && !failure) {
      failure = st.error();
    }
  }
  if (failure) {
    // Keep the session (with what is left of it) so the delete can be retried.
    sessions_->cancelDelete(name);
    return failure->wrap("deleting session " + name);
  }
  sessions_->erase(name);
  DSEC_LOG(kInfo, kLog) << "session " << name << " deleted with " << destroyed << " sandbox(es)";
  return json{{"name", name}, {"destroyed", destroyed}};
}

bool NodeAgent::pausedByLease(SandboxRecord& rec) {
  std::lock_guard lock(rec.mu);
  return !rec.destroyed && rec.paused_by == "lease" && rec.sandbox->state() == backends::SandboxState::kPaused;
}

void NodeAgent::reapExpired() {
  std::vector<std::shared_ptr<SandboxRecord>> recs;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, rec] : sandboxes_) recs.push_back(rec);
  }
  double now_wall = wallSeconds(), now_mono = monotonicSeconds();
  for (const auto& rec : recs) {
    std::string reason;
    if (rec->params.timeout > 0 && now_wall - rec->created_unix >= rec->params.timeout) {
      reason = "timeout of " + std::to_string(rec->params.timeout) + " s reached";
    } else if (rec->params.idle_timeout > 0 && rec->active.load() == 0 &&
               now_mono - rec->last_active_mono.load() >= rec->params.idle_timeout && !pausedByLease(*rec)) {
      reason = "idle for " + std::to_string(rec->params.idle_timeout) + " s";
    }
    if (reason.empty()) continue;
    if (destroy(rec->id, reason).ok()) metrics_->reaped_total++;
  }
}

json NodeAgent::nodeInfo() {
  json unavailable = json::object();
  json backends = json::array();
  if (unavailable_reason_.empty()) {
    backends.push_back("container");
  } else {
    unavailable["container"] = unavailable_reason_;
  }
  for (const char* b : {"microvm", "vm"}) unavailable[b] = "not available on this node yet";
  int64_t committed = 0;
  size_t count = 0;
  {
    std::lock_guard lock(mu_);
    count = sandboxes_.size();
    for (const auto& [id, rec] : sandboxes_) committed += rec->params.memory_bytes;
  }
  json info{{"node", options_.node_name},
            {"fleet", options_.fleet_name},
            {"backends", backends},
            {"unavailable_backends", unavailable},
            {"capacity",
             {{"max_sandboxes", options_.max_sandboxes},
              {"free_sandboxes", std::max<int64_t>(0, options_.max_sandboxes - static_cast<int64_t>(count))},
              {"memory_bytes", node_memory_bytes_},
              {"memory_committed_bytes", committed},
              {"cpus", static_cast<int64_t>(sysconf(_SC_NPROCESSORS_ONLN))}}},
            {"sandboxes", count},
            {"density", density_ ? density_->nodeJson() : json(nullptr)},
            {"isolation",
             {{"user_namespaces", options_.user_namespaces},
              {"warning", options_.user_namespaces
                              ? json(nullptr)
                              : json("user namespaces are off (operator opt-out): sandbox root is host root")}}},
            {"qos", cpu_ ? cpu_->nodeJson() : json(nullptr)}};
  addFncallInfo(&info);
  return info;
}

Result<json> NodeAgent::layers() {
  DSEC_ASSIGN_OR_RETURN(auto manifests, store_.list());
  json out = json::array();
  for (const auto& m : manifests) {
    json j = m.toJson();
    j["mounted"] = mounter_->isMounted(m.ref);
    j["refs"] = mounter_->refCount(m.ref);
    out.push_back(std::move(j));
  }
  return json{{"layers", out}};
}

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
        if (rec->paused_by == "lease") ++paused_by_lease;
        break;
      case backends::SandboxState::kStopped:
        ++stopped;
        break;
    }
  }
  int64_t mounts = 0;
  if (auto manifests = store_.list(); manifests.ok()) {
    for (const auto& m : *manifests) mounts += mounter_->isMounted(m.ref) ? 1 : 0;
  }
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
  if (density_) density_->renderMetrics(out);
  if (fncall_) fncall_->renderMetrics(out);
}

}  // namespace dsec::launcher
