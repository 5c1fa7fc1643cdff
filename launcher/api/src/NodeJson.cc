#include "dsec/launcher/api/NodeJson.h"

#include "dsec/backends/fncall/FunctionService.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/node/NodeAgent.h"

namespace dsec::launcher {
namespace {

using nlohmann::json;

json stringOrNull(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }

template <typename T>
json optionalOrNull(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}

json paramsJson(const CreateParams& p) {
  return json{{"image", p.image},
              {"backend", backends::backendKindName(p.backend)},
              {"cpus", p.cpus},
              {"memory", p.memory_bytes},
              {"disk", p.disk_bytes},
              {"pids", p.pids},
              {"timeout", p.timeout},
              {"idle_timeout", p.idle_timeout},
              {"network", backends::networkModeName(p.network)},
              {"egress", p.network == backends::NetworkMode::kEgress ? json(p.egress.texts()) : json(nullptr)},
              {"protect", p.protected_paths},
              {"env", p.env},
              {"labels", p.labels},
              {"session", stringOrNull(p.session)},
              {"qos", backends::cpuQosName(p.qos)},
              {"snapshot", stringOrNull(p.snapshot)}};
}

json eventJson(const SandboxEvent& e) {
  json j = {{"unix", e.unix_seconds}, {"time", rfc3339(e.unix_seconds)}};
  if (e.kind == SandboxEvent::Kind::kOomKill) {
    j["type"] = "oom_kill";
    j["oom_kills"] = e.oom_kills;
    j["message"] = e.message;
  } else {
    j["type"] = "density_" + e.density_action;
    j["reason"] = e.reason;
  }
  return j;
}

json sandboxDensityJson(const SandboxDensity& d) {
  json j = {{"reclaimed_unix", optionalOrNull(d.reclaimed_unix)},
            {"reclaims", d.reclaims},
            {"paused_unix", optionalOrNull(d.paused_unix)},
            {"pauses", d.pauses}};
  if (d.resumed_unix) j["resumed_unix"] = *d.resumed_unix;
  return j;
}

json densityNodeJson(const DensityNodeInfo& d) {
  json last = json::array();
  for (const auto& a : d.last_actions) {
    last.push_back({{"seq", a.seq},
                    {"action", a.action},
                    {"sandbox", stringOrNull(a.sandbox)},
                    {"unix", a.unix_seconds},
                    {"reason", a.reason}});
  }
  const PressureInfo& p = d.pressure;
  return json{{"mode", d.overcommit ? "overcommit" : "static"},
              {"memory_ratio", d.memory_ratio},
              {"cpu_ratio", d.cpu_ratio},
              {"admitting", d.admitting},
              {"level", placement::pressureLevelName(d.level)},
              {"reason", d.reason},
              {"memory_capacity_bytes", d.memory_capacity_bytes},
              {"memory_used_bytes", d.memory_used_bytes},
              {"memory_committed_bytes", d.memory_committed_bytes},
              {"memory_admissible_bytes", d.memory_admissible_bytes},
              {"cpus", d.cpus},
              {"cpu_committed", d.cpu_committed},
              {"cpu_used", d.cpu_used},
              {"pressure",
               {{"source", p.source},
                {"per_cgroup", p.per_cgroup},
                {"available", p.available},
                {"memory_some_avg10", p.memory_some_avg10},
                {"memory_full_avg10", p.memory_full_avg10},
                {"cpu_some_avg10", p.cpu_some_avg10}}},
              {"oom_kills", d.oom_kills},
              {"paused_sandboxes", d.paused_sandboxes},
              {"refusals", d.refusals},
              {"actions_total", d.actions_total},
              {"last_actions", std::move(last)}};
}

json cpuQosJson(const CpuQosNodeInfo& q) {
  if (!q.enabled) return {{"enabled", false}, {"reason", q.disabled_reason}, {"free_dedicated_cores", 0}};
  return {{"enabled", true},
          {"exclusive_pool", q.exclusive_pool},
          {"cores", q.cores},
          {"numa_domains", q.numa_domains},
          {"dedicated_cores", q.dedicated_cores},
          {"free_dedicated_cores", q.free_dedicated_cores},
          {"shared_cpuset", q.shared_cpuset},
          {"latency_sandboxes", q.latency_sandboxes},
          {"batch_sandboxes", q.batch_sandboxes}};
}

}  // namespace

json toJson(const SandboxInfo& info) {
  json j = paramsJson(info.params);
  j["id"] = info.id;
  j["node"] = info.node;
  j["state"] = backends::sandboxStateName(info.state);
  j["created"] = rfc3339(info.created_unix);
  j["created_unix"] = info.created_unix;
  j["last_active_unix"] = info.last_active_unix;
  j["paused_by"] = info.paused_by ? json(pausedByName(*info.paused_by)) : json(nullptr);
  const backends::SandboxUsage& u = info.usage;
  j["usage"] = {
      {"memory_bytes", u.memory_bytes}, {"pids", u.pids}, {"cpu_usec", u.cpu_usec}, {"oom_kills", u.oom_kills}};
  if (info.cpu) {
    j["cpuset"] = stringOrNull(info.cpu->cpuset);  // null: the whole node (no exclusive pool, or QoS off)
    j["cpuset_mems"] = stringOrNull(info.cpu->mems);
  }
  if (info.density) {
    j["density"] = sandboxDensityJson(*info.density);
    json events = json::array();
    for (const auto& e : info.density->events) events.push_back(eventJson(e));
    j["events"] = std::move(events);
  }
  return j;
}

json sandboxListJson(const std::vector<SandboxInfo>& infos) {
  json out = json::array();
  for (const auto& info : infos) out.push_back(toJson(info));
  return json{{"sandboxes", std::move(out)}};
}

json sharedStoreJson(const SharedStoreInfo& s) {
  const fs3::ChunkCacheStats& c = s.cache;
  json failures = json::array();
  for (const auto& f : s.failures) failures.push_back({{"chunk", f.chunk}, {"what", f.what}, {"unix", f.unix_time}});
  return json{{"store", s.store},
              {"error", stringOrNull(s.error)},
              {"chunk_cache",
               {{"capacity_bytes", s.cache_capacity_bytes},
                {"bytes", c.bytes_cached},
                {"chunks", c.chunks_cached},
                {"hits", c.hits},
                {"misses", c.misses},
                {"bytes_fetched", c.bytes_fetched},
                {"evictions", c.evictions},
                {"corrupt", c.corrupt},
                {"fetch_errors", c.fetch_errors}}},
              {"prefetch",
               {{"recordings_written", s.prefetch.recordings_written},
                {"prefetches", s.prefetch.prefetches},
                {"chunks", s.prefetch.chunks_prefetched},
                {"bytes", s.prefetch.bytes_prefetched}}},
              {"events", std::move(failures)}};
}

json toJson(const NodeInfo& info) {
  json offered = json::array();
  for (auto kind : info.backends) offered.push_back(backends::backendKindName(kind));
  json unavailable = json::object();
  for (const auto& [kind, why] : info.unavailable_backends) unavailable[backends::backendKindName(kind)] = why;
  json notes = json::object();
  for (const auto& [kind, note] : info.backend_notes) notes[backends::backendKindName(kind)] = note;
  const NodeCapacity& c = info.capacity;
  return json{
      {"node", info.node},
      {"fleet", info.fleet},
      {"backends", std::move(offered)},
      {"unavailable_backends", std::move(unavailable)},
      {"backend_notes", std::move(notes)},
      {"capacity",
       {{"max_sandboxes", c.max_sandboxes},
        {"free_sandboxes", c.free_sandboxes},
        {"memory_bytes", c.memory_bytes},
        {"memory_committed_bytes", c.memory_committed_bytes},
        {"cpus", c.cpus}}},
      {"sandboxes", info.sandboxes},
      {"density", info.density ? densityNodeJson(*info.density) : json(nullptr)},
      {"admission", info.admission ? toJson(*info.admission) : json(nullptr)},
      {"isolation", {{"user_namespaces", info.user_namespaces}, {"warning", stringOrNull(info.isolation_warning)}}},
      {"qos", info.qos ? cpuQosJson(*info.qos) : json(nullptr)},
      {"layer_store", info.layer_store ? sharedStoreJson(*info.layer_store) : json(nullptr)}};
}

json toJson(const AdmissionInfo& a) {
  const placement::NodeAdmission& s = a.state;
  return json{{"admitting", s.admitting},
              {"level", placement::pressureLevelName(a.level)},
              {"reason", a.reason},
              {"memory_ratio", s.memory_ratio},
              {"cpu_ratio", s.cpu_ratio},
              {"memory_capacity_bytes", s.memory_capacity_bytes},
              {"memory_committed_bytes", s.memory_committed_bytes},
              {"cpus", s.cpus},
              {"cpu_committed", s.cpu_committed},
              {"cpu_used", s.cpu_used},
              {"cpu_by_use", s.cpu_by_use},
              {"free_dedicated_cores", s.free_dedicated_cores},
              {"free_sandboxes", s.free_sandboxes}};
}

Result<AdmissionInfo> parseAdmissionJson(const json& j) {
  if (!j.is_object()) return Error::invalid("admission must be a JSON object");
  AdmissionInfo a;
  placement::NodeAdmission& s = a.state;
  const char* key = "";
  try {
    auto get = [&](const char* k, auto* out) {
      key = k;
      *out = j.at(k).get<std::remove_pointer_t<decltype(out)>>();
    };
    std::string level;
    get("admitting", &s.admitting);
    get("level", &level);
    get("reason", &a.reason);
    get("memory_ratio", &s.memory_ratio);
    get("cpu_ratio", &s.cpu_ratio);
    get("memory_capacity_bytes", &s.memory_capacity_bytes);
    get("memory_committed_bytes", &s.memory_committed_bytes);
    get("cpus", &s.cpus);
    get("cpu_committed", &s.cpu_committed);
    // Absent from a node that admits CPUs by their limits only (before admission by use): that rule, then.
    if (j.contains("cpu_used")) get("cpu_used", &s.cpu_used);
    if (j.contains("cpu_by_use")) get("cpu_by_use", &s.cpu_by_use);
    get("free_dedicated_cores", &s.free_dedicated_cores);
    get("free_sandboxes", &s.free_sandboxes);
    key = "level";
    auto parsed = placement::parsePressureLevel(level);
    if (!parsed.ok()) return Error::invalid("admission: " + parsed.error().message());
    a.level = *parsed;
  } catch (const json::exception& e) {
    return Error::invalid(std::string("admission: field ") + key + ": " + e.what());
  }
  if (!(s.memory_ratio >= 0) || !(s.cpu_ratio >= 0) || !(s.cpus >= 0) || !(s.cpu_used >= 0) ||
      s.memory_capacity_bytes < 0) {
    return Error::invalid("admission: ratios, capacities and CPU use must be >= 0");
  }
  return a;
}

json toJson(const backends::fncall::FncallStats& s, const std::string& default_image) {
  json pools = json::array();
  for (const backends::fncall::FncallPoolStats& p : s.pools) {
    json pool = {{"image", p.image},       {"language", backends::fncall::languageName(p.language)},
                 {"idle", p.idle},         {"busy", p.busy},
                 {"creating", p.creating}, {"waiting", p.waiting},
                 {"calls", p.calls}};
    if (p.last_error) pool["last_error"] = *p.last_error;
    pools.push_back(std::move(pool));
  }
  return {{"max_workers", s.max_workers},
          {"default_image", default_image},
          {"workers", s.workers},
          {"idle", s.idle},
          {"busy", s.busy},
          {"creating", s.creating},
          {"calls", s.calls},
          {"errors", s.errors},
          {"timeouts", s.timeouts},
          {"oom_kills", s.oom_kills},
          {"rejected", s.rejected},
          {"workers_created", s.workers_created},
          {"worker_create_failures", s.worker_create_failures},
          {"workers_replaced", s.workers_replaced},
          {"workers_shrunk", s.workers_shrunk},
          {"pools", std::move(pools)}};
}

json fncallJson(NodeFncall& fncall) { return toJson(fncall.stats(), fncall.defaultImage()); }

json toJson(const Session& s) {
  return json{{"name", s.name},
              {"lease", s.lease},
              {"retention", s.retention},
              {"state", s.lapsed() ? "lapsed" : "active"},
              {"expires_unix", s.expires_unix},
              {"lapsed_unix", optionalOrNull(s.lapsed_unix)},
              {"sandboxes", s.sandboxes}};
}

json sessionListJson(const std::vector<Session>& sessions) {
  json out = json::array();
  for (const auto& s : sessions) out.push_back(toJson(s));
  return json{{"sessions", std::move(out)}};
}

json toJson(const AttachedSession& attached) {
  json j = toJson(attached.session);
  json infos = json::array();
  for (const auto& info : attached.sandboxes) infos.push_back(toJson(info));
  j["sandbox_infos"] = std::move(infos);
  return j;
}

json toJson(const DeletedSession& deleted) { return json{{"name", deleted.name}, {"destroyed", deleted.destroyed}}; }

json layerListJson(const std::vector<LayerStatus>& layers) {
  json out = json::array();
  for (const auto& layer : layers) {
    json j = layer.manifest.toJson();
    j["mounted"] = layer.mounted;
    j["refs"] = layer.refs;
    out.push_back(std::move(j));
  }
  return json{{"layers", std::move(out)}};
}

json toJson(const SnapshotMeta& meta) {
  return json{{"name", meta.name},
              {"kind", backends::snapshotKindName(meta.kind)},
              {"backend", backends::backendKindName(meta.backend)},
              {"image", meta.image},
              {"source", meta.source},
              {"node", meta.node},
              {"created", rfc3339(meta.created_unix)},
              {"created_unix", meta.created_unix},
              {"bytes", meta.bytes}};
}

json snapshotListJson(const std::vector<SnapshotMeta>& snapshots) {
  json list = json::array();
  for (const auto& s : snapshots) list.push_back(toJson(s));
  return json{{"snapshots", std::move(list)}};
}

}  // namespace dsec::launcher
