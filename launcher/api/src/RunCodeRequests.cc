#include "dsec/launcher/api/RunCodeRequests.h"

#include <cmath>
#include <set>

#include "dsec/common/Base64.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/api/CallRequests.h"
#include "dsec/launcher/api/Requests.h"

namespace dsec::launcher {
namespace {

using nlohmann::json;

// SandboxFusion's RunCodeRequest. Unknown fields are refused rather than ignored: one might be a limit (a
// limit a caller asks for is enforced or refused, never dropped).
const std::set<std::string>& knownKeys() {
  static const std::set<std::string> kKeys = {"code",  "language", "compile_timeout", "run_timeout", "memory_limit_MB",
                                              "stdin", "files",    "fetch_files"};
  return kKeys;
}

Result<RunLanguage> languageField(const json& v) {
  DSEC_ASSIGN_OR_RETURN(std::string name, parseStringField(v, "language"));
  if (name == "python") return RunLanguage::kPython;
  if (name == "bash") return RunLanguage::kBash;
  if (name == "cpp") return RunLanguage::kCpp;
  return fieldError("language", "unsupported language \"" + name.substr(0, 64) +
                                    "\": this sandbox runs \"python\", \"bash\" and \"cpp\"");
}

Result<double> timeoutField(const json& body, const char* field) {
  if (!body.contains(field) || body[field].is_null()) return kDefaultRunCodeTimeout;
  const json& t = body[field];
  if (!t.is_number()) return fieldError(field, "expected seconds (a number), got " + jsonTypeName(t));
  double d = t.get<double>();
  if (!std::isfinite(d) || d <= 0) return fieldError(field, "must be > 0 seconds");
  if (d > kMaxRunCodeTimeout) return fieldError(field, "at most 600 seconds");
  return d;
}

Result<int64_t> memoryField(const json& body, int64_t node_memory_bytes) {
  int64_t mb = kDefaultRunCodeMemoryMB;
  if (body.contains("memory_limit_MB") && !body["memory_limit_MB"].is_null()) {
    const json& m = body["memory_limit_MB"];
    bool integral = m.is_number_integer() || (m.is_number_float() && std::isfinite(m.get<double>()) &&
                                              m.get<double>() == std::floor(m.get<double>()));
    if (!integral) return fieldError("memory_limit_MB", "expected an integer (MiB), got " + jsonTypeName(m));
    double v = m.get<double>();
    if (v != -1 && v < kMinRunCodeMemoryMB) {
      return fieldError("memory_limit_MB", "must be -1 (the default, 1024) or at least 32");
    }
    if (v > static_cast<double>(backends::fncall::kMaxMemoryBytes >> 20)) {
      return fieldError("memory_limit_MB", "more than 65536");
    }
    if (v != -1) mb = static_cast<int64_t>(v);
  }
  int64_t bytes = mb << 20;
  if (node_memory_bytes > 0 && bytes > node_memory_bytes) {
    return fieldError("memory_limit_MB",
                      std::to_string(mb) + " is more than the node's memory (" + formatBytes(node_memory_bytes) + ")");
  }
  return bytes;
}

// path -> base64 (or null: no file, as SandboxFusion skips it).
Result<std::map<std::string, std::string>> filesField(const json& v) {
  if (v.is_null()) return std::map<std::string, std::string>();
  return parseCallFiles(v, true);
}

Result<std::vector<std::string>> fetchField(const json& v) {
  std::vector<std::string> paths;
  if (v.is_null()) return paths;
  if (!v.is_array()) return fieldError("fetch_files", "expected an array of relative paths, got " + jsonTypeName(v));
  if (v.size() > kMaxRunCodeFetchFiles) {
    return fieldError("fetch_files", "more than " + std::to_string(kMaxRunCodeFetchFiles) + " paths");
  }
  std::set<std::string> seen;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string field = "fetch_files[" + std::to_string(i) + "]";
    DSEC_ASSIGN_OR_RETURN(std::string path, parseStringField(v[i], field));
    if (auto st = validateCallFilePath(path); !st.ok()) return fieldError(field, st.error().message());
    if (seen.insert(path).second) paths.push_back(std::move(path));
  }
  return paths;
}

json outcomeJson(const std::optional<CommandOutcome>& o) {
  if (!o) return nullptr;
  json j{{"status", commandStatusName(o->status)},
         {"execution_time", nullptr},
         {"return_code", nullptr},
         {"stdout", o->stdout_data},
         {"stderr", o->stderr_data}};
  if (o->execution_time) j["execution_time"] = *o->execution_time;
  if (o->return_code) j["return_code"] = *o->return_code;
  return j;
}

}  // namespace

Result<RunCodeRequest> parseRunCodeRequest(const json& body, int64_t node_memory_bytes) {
  if (!body.is_object()) return Error::invalid("request body must be a JSON object");
  for (const auto& [key, value] : body.items()) {
    (void)value;
    if (!knownKeys().count(key)) {
      return Error::invalid("unknown field '" + key.substr(0, 64) +
                            "' (known: code, language, compile_timeout, run_timeout, memory_limit_MB, stdin, files, "
                            "fetch_files)");
    }
  }
  RunCodeRequest req;
  if (!body.contains("code")) return fieldError("code", "required");
  DSEC_ASSIGN_OR_RETURN(req.code, parseStringField(body["code"], "code"));
  if (req.code.size() > kMaxCallCodeBytes) return fieldError("code", "longer than 1 MiB");
  if (req.code.find('\0') != std::string::npos) return fieldError("code", "contains a NUL byte");
  if (!body.contains("language")) return fieldError("language", "required (\"python\", \"bash\" or \"cpp\")");
  DSEC_ASSIGN_OR_RETURN(req.language, languageField(body["language"]));
  DSEC_ASSIGN_OR_RETURN(req.compile_timeout, timeoutField(body, "compile_timeout"));
  DSEC_ASSIGN_OR_RETURN(req.run_timeout, timeoutField(body, "run_timeout"));
  DSEC_ASSIGN_OR_RETURN(req.memory_bytes, memoryField(body, node_memory_bytes));
  if (body.contains("stdin") && !body["stdin"].is_null()) {
    DSEC_ASSIGN_OR_RETURN(req.stdin_data, parseStringField(body["stdin"], "stdin"));
    if (req.stdin_data.size() > backends::fncall::kMaxStdinBytes) return fieldError("stdin", "more than 16 MiB");
  }
  if (body.contains("files")) {
    DSEC_ASSIGN_OR_RETURN(req.files, filesField(body["files"]));
  }
  size_t total = 0;
  for (const auto& [path, bytes] : req.files) total += bytes.size();
  if (total > backends::fncall::kMaxFileBytes) return fieldError("files", "more than 64 MiB together");
  if (body.contains("fetch_files")) {
    DSEC_ASSIGN_OR_RETURN(req.fetch_files, fetchField(body["fetch_files"]));
  }
  return req;
}

json runCodeResponseJson(const RunCodeResult& result, const std::string& node) {
  // SandboxFusion's parse_run_status: an Error outcome is a SandboxError with its stderr as the message; then a
  // time limit or a non-zero return code is Failed; else Success.
  std::string status = "Success", message;
  std::vector<const CommandOutcome*> outcomes;
  if (result.compile) outcomes.push_back(&*result.compile);
  if (result.run) outcomes.push_back(&*result.run);
  bool failed = false, errored = false;
  for (const CommandOutcome* o : outcomes) {
    if (o->status == CommandStatus::kError && !errored) {
      errored = true;
      message = o->stderr_data;
    }
    if (o->status == CommandStatus::kTimeLimitExceeded) failed = true;
    if (o->return_code && *o->return_code != 0) failed = true;
  }
  if (errored) {
    status = "SandboxError";
  } else if (failed) {
    status = "Failed";
  }
  json files = json::object();
  for (const auto& [path, bytes] : result.files) files[path] = base64Encode(bytes);
  return json{{"status", status},
              {"message", message},
              {"compile_result", outcomeJson(result.compile)},
              {"run_result", outcomeJson(result.run)},
              {"executor_pod_name", node},
              {"files", files}};
}

json runCodeErrorJson(const std::string& code, const std::string& message) {
  return json{{"status", "SandboxError"},
              {"message", message},
              {"compile_result", nullptr},
              {"run_result", nullptr},
              {"executor_pod_name", nullptr},
              {"files", json::object()},
              {"error", {{"code", code}, {"message", message}}}};
}

}  // namespace dsec::launcher
