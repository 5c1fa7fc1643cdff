#include "dsec/launcher/api/Requests.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>

#include "dsec/backends/BackendKind.h"
#include "dsec/common/Base64.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/api/PolicyRequests.h"
#include "dsec/launcher/node/Sessions.h"

namespace dsec::launcher {
namespace {

using nlohmann::json;

constexpr int kMaxJsonDepth = 64;
constexpr size_t kMaxEnvEntries = 4096;
constexpr size_t kMaxLabels = 64;
constexpr size_t kMaxLabelKey = 128;
constexpr size_t kMaxLabelValue = 1024;
constexpr size_t kMaxPath = 4096;

bool hasNul(std::string_view s) { return s.find('\0') != std::string_view::npos; }

// Integers that fit int64_t; nlohmann stores large values as unsigned or float.
Result<int64_t> integerField(const json& v, const std::string& field) {
  if (v.is_number_integer() && !v.is_number_unsigned()) return v.get<int64_t>();
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return fieldError(field, "number too large");
    return static_cast<int64_t>(u);
  }
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) return static_cast<int64_t>(d);
    return fieldError(field, "expected an integer, got " + v.dump());
  }
  return fieldError(field, "expected an integer, got " + jsonTypeName(v));
}

Result<double> numberField(const json& v, const std::string& field) {
  if (!v.is_number()) return fieldError(field, "expected a number, got " + jsonTypeName(v));
  double d = v.get<double>();
  if (!std::isfinite(d)) return fieldError(field, "not a finite number");
  return d;
}

Status checkKnownKeys(const json& body, const std::set<std::string>& known) {
  for (const auto& [key, value] : body.items()) {
    (void)value;
    if (!known.count(key)) return Error::invalid("unknown field '" + key + "'");
  }
  return okStatus();
}

}  // namespace

std::string jsonTypeName(const json& v) {
  if (v.is_number_float()) return "a fractional number";
  if (v.is_number()) return "a number";
  return std::string("a ") + v.type_name();
}

Error fieldError(const std::string& field, const std::string& what) {
  return Error::invalid("field '" + field + "': " + what);
}

Result<std::string> parseStringField(const json& v, const std::string& field) {
  if (!v.is_string()) return fieldError(field, "expected a string, got " + jsonTypeName(v));
  return v.get<std::string>();
}

Result<json> parseJsonObject(std::string_view body) {
  // Depth check before parsing: a body of a million '[' must not reach the parser or the destructor.
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : body) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return Error::invalid("JSON nested deeper than " + std::to_string(kMaxJsonDepth));
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  json parsed = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    // Parse again with exceptions for the message (byte position and what was expected).
    try {
      json ignored = json::parse(body.begin(), body.end());
      (void)ignored;
    } catch (const json::exception& e) {
      return Error::invalid(std::string("malformed JSON: ") + e.what());
    }
    return Error::invalid("malformed JSON");
  }
  if (!parsed.is_object()) return Error::invalid("request body must be a JSON object, got " + jsonTypeName(parsed));
  return parsed;
}

Result<int64_t> parseSizeField(const json& v, const std::string& field) {
  if (v.is_string()) {
    auto r = parseByteSize(v.get<std::string>());
    if (!r.ok()) return fieldError(field, r.error().message());
    return *r;
  }
  if (!v.is_number())
    return fieldError(field, "expected bytes (an integer) or a size like \"512M\", got " + jsonTypeName(v));
  DSEC_ASSIGN_OR_RETURN(int64_t n, integerField(v, field));
  if (n < 0) return fieldError(field, "must not be negative, got " + std::to_string(n));
  return n;
}

Result<double> parseDurationField(const json& v, const std::string& field) {
  DSEC_ASSIGN_OR_RETURN(double d, numberField(v, field));
  if (d < 0) return fieldError(field, "must not be negative");
  if (d > kMaxDurationSeconds) return fieldError(field, "longer than ten years");
  return d;
}

Result<std::map<std::string, std::string>> parseEnvField(const json& v, const std::string& field) {
  if (!v.is_object()) return fieldError(field, "expected an object of strings, got " + jsonTypeName(v));
  if (v.size() > kMaxEnvEntries) return fieldError(field, "more than " + std::to_string(kMaxEnvEntries) + " entries");
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : v.items()) {
    if (key.empty() || key.find('=') != std::string::npos || hasNul(key)) {
      return fieldError(field, "invalid variable name '" + key + "' (empty, or contains '=' or NUL)");
    }
    if (!value.is_string()) return fieldError(field + "." + key, "expected a string, got " + jsonTypeName(value));
    std::string s = value.get<std::string>();
    if (hasNul(s)) return fieldError(field + "." + key, "contains a NUL byte");
    out[key] = std::move(s);
  }
  return out;
}

Result<std::map<std::string, std::string>> parseLabelsField(const json& v) {
  if (!v.is_object()) return fieldError("labels", "expected an object of strings, got " + jsonTypeName(v));
  if (v.size() > kMaxLabels) return fieldError("labels", "more than " + std::to_string(kMaxLabels) + " labels");
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : v.items()) {
    if (key.empty() || key.size() > kMaxLabelKey || key.find_first_of("=&") != std::string::npos || hasNul(key)) {
      return fieldError("labels", "invalid label name '" + key + "' (empty, too long, or contains '=', '&' or NUL)");
    }
    if (!value.is_string()) return fieldError("labels." + key, "expected a string, got " + jsonTypeName(value));
    std::string s = value.get<std::string>();
    if (s.size() > kMaxLabelValue || hasNul(s)) return fieldError("labels." + key, "too long or contains NUL");
    out[key] = std::move(s);
  }
  return out;
}

namespace {

Status parseCreateBackend(const json& body, CreateParams* p) {
  if (!body.contains("backend")) return okStatus();
  DSEC_ASSIGN_OR_RETURN(std::string name, parseStringField(body["backend"], "backend"));
  auto kind = backends::parseBackendKind(name);
  if (!kind.ok()) return fieldError("backend", kind.error().message());
  if (*kind == backends::BackendKind::kFncall) {
    return fieldError("backend", "fncall is not a sandbox backend (POST /v1/call runs code on it)");
  }
  p->backend = *kind;
  return okStatus();
}

Status parseCreateLimits(const json& body, int64_t node_memory_bytes, CreateParams* p) {
  if (body.contains("cpus")) {
    DSEC_ASSIGN_OR_RETURN(p->cpus, numberField(body["cpus"], "cpus"));
    if (p->cpus < 0) return fieldError("cpus", "must not be negative");
    if (p->cpus > kMaxCpus) return fieldError("cpus", "more than " + std::to_string(int(kMaxCpus)));
  }
  if (body.contains("memory")) {
    DSEC_ASSIGN_OR_RETURN(p->memory_bytes, parseSizeField(body["memory"], "memory"));
    if (p->memory_bytes != 0 && p->memory_bytes < kMinMemoryBytes) {
      return fieldError("memory", "at least 4M is needed, got " + std::to_string(p->memory_bytes) + " bytes");
    }
    if (node_memory_bytes > 0 && p->memory_bytes > node_memory_bytes) {
      return fieldError("memory", std::to_string(p->memory_bytes) + " bytes is more than this node's memory (" +
                                      std::to_string(node_memory_bytes) + " bytes)");
    }
  }
  if (body.contains("disk")) {
    DSEC_ASSIGN_OR_RETURN(p->disk_bytes, parseSizeField(body["disk"], "disk"));
    if (p->disk_bytes != 0 && p->disk_bytes < kMinDiskBytes) {
      return fieldError("disk", "at least 1M is needed, got " + std::to_string(p->disk_bytes) + " bytes");
    }
  }
  if (body.contains("pids")) {
    DSEC_ASSIGN_OR_RETURN(p->pids, integerField(body["pids"], "pids"));
    if (p->pids < 0) return fieldError("pids", "must not be negative");
    if (p->pids != 0 && p->pids < kMinPids) return fieldError("pids", "at least 8 (or 0 for no limit)");
    if (p->pids > (1 << 22)) return fieldError("pids", "more than the kernel's pid limit");
  }
  return okStatus();
}

// "none"; {"egress": [...]} (a link, and where it may go: [] = nowhere yet, a later stage may open it); "egress"
// (a link with a route anywhere but the node, as before policies: {"egress": ["0.0.0.0/0"]}).
Status parseCreateNetwork(const json& body, CreateParams* p) {
  if (body.contains("protect")) {
    DSEC_ASSIGN_OR_RETURN(std::vector<std::string> paths, parseStringList(body["protect"], "protect"));
    auto normal = backends::parseProtectedPaths(paths);
    if (!normal.ok()) return fieldError("protect", normal.error().message());
    p->protected_paths = std::move(*normal);
  }
  if (!body.contains("network")) return okStatus();
  if (body["network"].is_object()) {
    auto policy = parseNetworkBody(body["network"]);
    if (!policy.ok()) return fieldError("network", policy.error().message());
    p->network = backends::NetworkMode::kEgress;
    p->egress = std::move(*policy);
    return okStatus();
  }
  DSEC_ASSIGN_OR_RETURN(std::string net, parseStringField(body["network"], "network"));
  if (net == "none") {
    p->network = backends::NetworkMode::kNone;
  } else if (net == "egress") {
    p->network = backends::NetworkMode::kEgress;
    p->egress = backends::parseEgressPolicy({"0.0.0.0/0"}).value();
  } else if (net == "host") {
    return fieldError("network",
                      "\"host\" is not offered: a sandbox never shares the node's network (its root "
                      "could sniff and spoof the node's traffic); use \"egress\" for a route out");
  } else {
    return fieldError("network", "expected \"none\", \"egress\" or {\"egress\": [...]}, got \"" + net + "\"");
  }
  return okStatus();
}

Status parseCreateQos(const json& body, CreateParams* p) {
  if (body.contains("qos")) {
    DSEC_ASSIGN_OR_RETURN(std::string qos, parseStringField(body["qos"], "qos"));
    if (qos == "batch") {
      p->qos = backends::CpuQos::kBatch;
    } else if (qos == "latency") {
      p->qos = backends::CpuQos::kLatency;
    } else {
      return fieldError("qos", "expected \"latency\" or \"batch\", got \"" + qos + "\"");
    }
  }
  // Latency sandboxes get ceil(cpus) dedicated cores: "unlimited" has no core count.
  if (p->qos == backends::CpuQos::kLatency && !(p->cpus > 0)) {
    return fieldError("qos", "\"latency\" needs cpus > 0 (the cores to dedicate)");
  }
  return okStatus();
}

}  // namespace

Result<CreateParams> parseCreateRequest(const json& body, int64_t node_memory_bytes) {
  if (!body.is_object()) return Error::invalid("request body must be a JSON object");
  DSEC_TRY(checkKnownKeys(body, {"image", "backend", "cpus", "memory", "disk", "pids", "timeout", "idle_timeout", "env",
                                 "labels", "network", "protect", "session", "qos"}));
  CreateParams p;
  if (!body.contains("image")) return fieldError("image", "required");
  DSEC_ASSIGN_OR_RETURN(std::string image, parseStringField(body["image"], "image"));
  auto layers = fs3::parseImageRef(image);
  if (!layers.ok()) return fieldError("image", layers.error().message());
  p.layers = std::move(*layers);
  p.image = fs3::imageToString(p.layers);

  DSEC_TRY(parseCreateBackend(body, &p));
  DSEC_TRY(parseCreateLimits(body, node_memory_bytes, &p));
  if (body.contains("timeout")) {
    DSEC_ASSIGN_OR_RETURN(p.timeout, parseDurationField(body["timeout"], "timeout"));
  }
  if (body.contains("idle_timeout")) {
    DSEC_ASSIGN_OR_RETURN(p.idle_timeout, parseDurationField(body["idle_timeout"], "idle_timeout"));
  }
  if (body.contains("env")) {
    DSEC_ASSIGN_OR_RETURN(p.env, parseEnvField(body["env"], "env"));
  }
  if (body.contains("labels")) {
    DSEC_ASSIGN_OR_RETURN(p.labels, parseLabelsField(body["labels"]));
  }
  DSEC_TRY(parseCreateNetwork(body, &p));
  DSEC_TRY(parseCreateQos(body, &p));
  if (body.contains("session") && !body["session"].is_null()) {
    DSEC_ASSIGN_OR_RETURN(p.session, parseStringField(body["session"], "session"));
    if (auto st = validateSessionName(p.session); !st.ok()) return fieldError("session", st.error().message());
  }
  return p;
}

namespace {

Result<double> sessionSecondsField(const json& v, const std::string& field, double min, double max) {
  if (!v.is_number()) return Error::invalid("field '" + field + "': expected a number of seconds, got " + v.dump());
  double d = v.get<double>();
  if (!std::isfinite(d) || d < min || d > max) {
    char buf[128];
    std::snprintf(buf, sizeof(buf), "must be between %g and %g seconds, got ", min, max);
    return Error::invalid("field '" + field + "': " + buf + v.dump());
  }
  return d;
}

}  // namespace

Result<SessionSettings> parseSessionSettings(const json& body, bool allow_retention) {
  if (!body.is_object()) return Error::invalid("request body must be a JSON object");
  SessionSettings s;
  for (const auto& [key, value] : body.items()) {
    if (key == "lease") {
      DSEC_ASSIGN_OR_RETURN(s.lease, sessionSecondsField(value, "lease", kMinSessionLease, kMaxSessionLease));
    } else if (key == "retention" && allow_retention) {
      DSEC_ASSIGN_OR_RETURN(s.retention, sessionSecondsField(value, "retention", 0, kMaxSessionRetention));
    } else {
      return Error::invalid("unknown field '" + key + "'" + (allow_retention ? "" : " (attach takes only 'lease')"));
    }
  }
  return s;
}

Result<std::string> parseStdinFields(const nlohmann::json& body) {
  if (body.contains("stdin") && body.contains("stdin_b64")) {
    return Error::invalid("fields 'stdin' and 'stdin_b64' are exclusive");
  }
  if (body.contains("stdin")) return parseStringField(body["stdin"], "stdin");
  if (!body.contains("stdin_b64")) return std::string();
  DSEC_ASSIGN_OR_RETURN(std::string b64, parseStringField(body["stdin_b64"], "stdin_b64"));
  auto decoded = base64Decode(b64);
  if (!decoded.ok()) return fieldError("stdin_b64", decoded.error().message());
  return std::move(*decoded);
}

Result<backends::ExecRequest> parseExecRequest(const json& body) {
  if (!body.is_object()) return Error::invalid("request body must be a JSON object");
  DSEC_TRY(checkKnownKeys(body, {"cmd", "timeout", "cwd", "env", "stdin", "stdin_b64", "output_cap"}));
  backends::ExecRequest req;
  if (!body.contains("cmd")) return fieldError("cmd", "required");
  const json& cmd = body["cmd"];
  if (cmd.is_string()) {
    std::string s = cmd.get<std::string>();
    if (s.empty()) return fieldError("cmd", "empty command");
    if (hasNul(s)) return fieldError("cmd", "contains a NUL byte");
    req.argv = {"/bin/sh", "-c", std::move(s)};
  } else if (cmd.is_array()) {
    if (cmd.empty()) return fieldError("cmd", "empty argv");
    for (size_t i = 0; i < cmd.size(); ++i) {
      const std::string name = "cmd[" + std::to_string(i) + "]";
      DSEC_ASSIGN_OR_RETURN(std::string arg, parseStringField(cmd[i], name));
      if (hasNul(arg)) return fieldError(name, "contains a NUL byte");
      req.argv.push_back(std::move(arg));
    }
    if (req.argv[0].empty()) return fieldError("cmd[0]", "empty program name");
  } else {
    return fieldError("cmd", "expected a string or an array of strings, got " + jsonTypeName(cmd));
  }
  if (body.contains("timeout")) {
    DSEC_ASSIGN_OR_RETURN(req.timeout_seconds, parseDurationField(body["timeout"], "timeout"));
  }
  if (body.contains("cwd")) {
    DSEC_ASSIGN_OR_RETURN(req.cwd, parseStringField(body["cwd"], "cwd"));
    DSEC_TRY(validateSandboxPath(req.cwd, "cwd"));
  }
  if (body.contains("env")) {
    DSEC_ASSIGN_OR_RETURN(req.env, parseEnvField(body["env"], "env"));
  }
  DSEC_ASSIGN_OR_RETURN(req.stdin_data, parseStdinFields(body));
  req.output_cap = kDefaultOutputCap;
  if (body.contains("output_cap")) {
    DSEC_ASSIGN_OR_RETURN(int64_t cap, integerField(body["output_cap"], "output_cap"));
    if (cap < 0) return fieldError("output_cap", "must not be negative");
    if (cap > kMaxOutputCap) return fieldError("output_cap", "more than 1 GiB");
    req.output_cap = cap == 0 ? kMaxOutputCap : cap;
  }
  return req;
}

Status validateSandboxPath(std::string_view path, const std::string& field) {
  if (path.empty()) return fieldError(field, "empty path");
  if (path.front() != '/') return fieldError(field, "must be an absolute path, got '" + std::string(path) + "'");
  if (hasNul(path)) return fieldError(field, "contains a NUL byte");
  if (path.size() > kMaxPath) return fieldError(field, "longer than 4096 bytes");
  return okStatus();
}

Result<uint32_t> parseFileMode(std::string_view text) {
  if (text.empty() || text.size() > 5)
    return Error::invalid("mode: expected octal like 0644, got '" + std::string(text) + "'");
  uint32_t mode = 0;
  for (char c : text) {
    if (c < '0' || c > '7') return Error::invalid("mode: expected octal like 0644, got '" + std::string(text) + "'");
    mode = mode * 8 + (c - '0');
  }
  if (mode > 07777) return Error::invalid("mode: more than 07777");
  return mode;
}

Result<std::map<std::string, std::string>> parseLabelSelectors(const std::vector<std::string>& values) {
  std::map<std::string, std::string> out;
  for (const auto& v : values) {
    auto eq = v.find('=');
    if (eq == std::string::npos || eq == 0) return Error::invalid("label: expected k=v, got '" + v + "'");
    out[v.substr(0, eq)] = v.substr(eq + 1);
  }
  return out;
}

bool bearerTokenMatches(std::string_view authorization, std::string_view token) {
  constexpr std::string_view kScheme = "bearer ";
  if (authorization.size() <= kScheme.size()) return false;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(authorization[i])) != kScheme[i]) return false;
  }
  authorization.remove_prefix(kScheme.size());
  while (!authorization.empty() && authorization.front() == ' ') authorization.remove_prefix(1);
  while (!authorization.empty() && authorization.back() == ' ') authorization.remove_suffix(1);
  return !token.empty() && constantTimeEquals(authorization, token);
}

bool constantTimeEquals(std::string_view a, std::string_view b) {
  // Length is not secret (tokens have a fixed length); the content comparison does not short-circuit.
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

Result<RestoreRequest> parseRestoreRequest(const json& body) {
  if (!body.is_object()) return Error::invalid("body must be a JSON object");
  std::string others;
  for (const auto& [key, value] : body.items()) {
    static const std::set<std::string> kRestoreKeys = {"snapshot", "timeout", "idle_timeout", "labels", "session"};
    if (!kRestoreKeys.count(key)) others += (others.empty() ? "'" : ", '") + key + "'";
  }
  if (!others.empty()) {
    return Error::invalid("a restore from a snapshot takes its image, backend and limits from the snapshot; drop " +
                          others + " (it takes snapshot, timeout, idle_timeout, labels and session)");
  }
  RestoreRequest r;
  DSEC_ASSIGN_OR_RETURN(r.snapshot, parseStringField(body["snapshot"], "snapshot"));
  if (body.contains("timeout")) {
    DSEC_ASSIGN_OR_RETURN(r.options.timeout, parseDurationField(body["timeout"], "timeout"));
  }
  if (body.contains("idle_timeout")) {
    DSEC_ASSIGN_OR_RETURN(r.options.idle_timeout, parseDurationField(body["idle_timeout"], "idle_timeout"));
  }
  if (body.contains("labels")) {
    DSEC_ASSIGN_OR_RETURN(r.options.labels, parseLabelsField(body["labels"]));
  }
  if (body.contains("session") && !body["session"].is_null()) {
    DSEC_ASSIGN_OR_RETURN(std::string session, parseStringField(body["session"], "session"));
    if (auto st = validateSessionName(session); !st.ok()) return fieldError("session", st.error().message());
    r.options.session = std::move(session);
  }
  return r;
}

Result<SnapshotRequest> parseSnapshotRequest(const json& body, bool fork) {
  if (!body.is_object()) return Error::invalid("body must be a JSON object");
  DSEC_TRY(checkKnownKeys(
      body, fork ? std::set<std::string>{"count", "processes"} : std::set<std::string>{"name", "processes"}));
  SnapshotRequest r;
  if (body.contains("name") && !body["name"].is_null()) {
    DSEC_ASSIGN_OR_RETURN(r.name, parseStringField(body["name"], "name"));
  }
  if (body.contains("processes")) {
    if (!body["processes"].is_boolean()) {
      return fieldError("processes", "expected true or false, got " + jsonTypeName(body["processes"]));
    }
    r.processes = body["processes"].get<bool>();
  }
  if (fork) {
    if (!body.contains("count")) return fieldError("count", "required (1..256)");
    DSEC_ASSIGN_OR_RETURN(int64_t count, integerField(body["count"], "count"));
    if (count < 1 || count > 256) return fieldError("count", "must be 1..256, got " + std::to_string(count));
    r.count = static_cast<int>(count);
  }
  return r;
}

}  // namespace dsec::launcher
