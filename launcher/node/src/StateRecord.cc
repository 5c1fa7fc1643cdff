#include "dsec/launcher/node/StateRecord.h"

namespace dsec::launcher {

using nlohmann::json;

// The record's own names for the create parameters. The API's sandbox info spells them alike today
// (NodeAgent.cc), on purpose in separate code: an API rename must not change what a restarted node reads.
json paramsRecordJson(const CreateParams& p) {
  json j{{"image", p.image},
         {"backend", backends::backendKindName(p.backend)},
         {"cpus", p.cpus},
         {"memory", p.memory_bytes},
         {"disk", p.disk_bytes},
         {"pids", p.pids},
         {"timeout", p.timeout},
         {"idle_timeout", p.idle_timeout},
         {"network", backends::networkModeName(p.network)},
         {"egress", p.egress.texts()},
         {"protect", p.protected_paths},
         {"env", p.env},
         {"labels", p.labels},
         {"session", p.session.empty() ? json(nullptr) : json(p.session)},
         {"qos", backends::cpuQosName(p.qos)}};
  if (!p.snapshot.empty()) j["snapshot"] = p.snapshot;
  return j;
}

// Version 0 wrote the same names at the top level (and "session" as null when there was none).
Result<CreateParams> paramsFromJson(const json& j) {
  CreateParams p;
  p.image = j.at("image").get<std::string>();
  DSEC_ASSIGN_OR_RETURN(p.layers, fs3::parseImageRef(p.image));
  DSEC_ASSIGN_OR_RETURN(p.backend, backends::parseBackendKind(j.value(
                                       "backend", std::string(backendKindName(backends::BackendKind::kContainer)))));
  p.cpus = j.value("cpus", 0.0);
  p.memory_bytes = j.value("memory", int64_t{0});
  p.disk_bytes = j.value("disk", int64_t{0});
  p.pids = j.value("pids", int64_t{0});
  p.timeout = j.value("timeout", 0.0);
  p.idle_timeout = j.value("idle_timeout", 0.0);
  DSEC_ASSIGN_OR_RETURN(p.network, backends::parseNetworkMode(j.value("network", "none")));
  // Records from before egress policies: a link meant a route anywhere but the node.
  DSEC_ASSIGN_OR_RETURN(p.egress,
                        backends::parseEgressPolicy(j.value("egress", std::vector<std::string>{"0.0.0.0/0"})));
  DSEC_ASSIGN_OR_RETURN(p.protected_paths,
                        backends::parseProtectedPaths(j.value("protect", std::vector<std::string>{})));
  p.env = j.value("env", std::map<std::string, std::string>{});
  p.labels = j.value("labels", std::map<std::string, std::string>{});
  if (j.contains("session") && j["session"].is_string()) p.session = j["session"].get<std::string>();
  p.qos = j.value("qos", "batch") == "latency" ? backends::CpuQos::kLatency : backends::CpuQos::kBatch;
  if (j.contains("snapshot") && j["snapshot"].is_string()) p.snapshot = j["snapshot"].get<std::string>();
  return p;
}

namespace {

std::string stringOrEmpty(const json& j, const char* key) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
}

Result<SandboxStateRecord> fromVersion0(const json& j) {
  SandboxStateRecord r;
  r.id = j.at("id").get<std::string>();
  DSEC_ASSIGN_OR_RETURN(r.params, paramsFromJson(j));
  r.created_unix = j.value("created_unix", 0.0);
  if (j.value("paused", false)) {
    std::string by = stringOrEmpty(j, "paused_by");
    r.paused_by = parsePausedBy(by.empty() ? "user" : by);
  }
  r.backend_state = j.value("backend_state", json::object());
  r.cpuset = stringOrEmpty(j, "cpuset");
  return r;
}

Result<SandboxStateRecord> fromVersion1(const json& j) {
  SandboxStateRecord r;
  r.id = j.at("id").get<std::string>();
  DSEC_ASSIGN_OR_RETURN(r.params, paramsFromJson(j.at("params")));
  r.created_unix = j.at("created_unix").get<double>();
  std::string by = stringOrEmpty(j, "paused_by");
  r.paused_by = by.empty() ? PausedBy::kNone : parsePausedBy(by);
  r.backend_state = j.value("backend_state", json::object());
  r.cpuset = stringOrEmpty(j, "cpuset");
  r.slurm_job = stringOrEmpty(j, "slurm_job");
  return r;
}

}  // namespace

std::string_view pausedByName(PausedBy by) {
  switch (by) {
    case PausedBy::kNone:
      return "";
    case PausedBy::kUser:
      return "user";
    case PausedBy::kLease:
      return "lease";
    case PausedBy::kDensity:
      return "density";
  }
  return "";
}

PausedBy parsePausedBy(std::string_view name) {
  if (name == "lease") return PausedBy::kLease;
  if (name == "density") return PausedBy::kDensity;
  return PausedBy::kUser;
}

std::string encodeStateRecord(const SandboxStateRecord& r) {
  json j{{"version", kStateRecordVersion},
         {"id", r.id},
         {"created_unix", r.created_unix},
         {"params", paramsRecordJson(r.params)},
         {"paused_by", r.paused_by == PausedBy::kNone ? json(nullptr) : json(pausedByName(r.paused_by))},
         {"backend_state", r.backend_state},
         {"cpuset", r.cpuset.empty() ? json(nullptr) : json(r.cpuset)},
         {"slurm_job", r.slurm_job.empty() ? json(nullptr) : json(r.slurm_job)}};
  return j.dump();
}

Result<SandboxStateRecord> decodeStateRecord(std::string_view text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Error::invalid("state record: not a JSON object");
  try {
    if (!j.contains("version")) return fromVersion0(j);
    int version = j["version"].get<int>();
    if (version == 1) return fromVersion1(j);
    if (version > kStateRecordVersion) {
      return Error(ErrorCode::kUnsupported, "state record version " + std::to_string(version) +
                                                " is newer than this node's (" + std::to_string(kStateRecordVersion) +
                                                "): written by a newer dsec");
    }
    return Error::invalid("state record version " + std::to_string(version) + " is unknown");
  } catch (const json::exception& e) {
    return Error::invalid(std::string("state record: ") + e.what());
  }
}

nlohmann::json backendStateOf(std::string_view text) {
  json j = json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("backend_state") || !j["backend_state"].is_object()) return json::object();
  return j["backend_state"];
}

}  // namespace dsec::launcher
