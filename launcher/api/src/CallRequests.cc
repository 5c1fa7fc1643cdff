#include "dsec/launcher/api/CallRequests.h"

#include <cmath>
#include <set>
#include <string>

#include "dsec/common/Base64.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/LayerRef.h"
#include "dsec/launcher/api/Requests.h"

namespace dsec::launcher {
namespace {

using backends::fncall::CallRequest;
using backends::fncall::Language;
using nlohmann::json;

// The edge refuses what the service would, with the API's field names.
static_assert(kMaxCallCodeBytes == backends::fncall::kMaxCodeBytes);
static_assert(kMinCallMemory == backends::fncall::kMinMemoryBytes);
static_assert(kMaxCallFiles == backends::fncall::kMaxFiles);

const std::set<std::string>& knownKeys() {
  static const std::set<std::string> kKeys = {"code",   "language", "stdin", "stdin_b64",  "timeout",
                                              "memory", "files",    "image", "output_cap", "fresh_interpreter"};
  return kKeys;
}

// Kept here rather than calling the fncall library so the API's message names the field and the choices.
Result<Language> languageField(const json& v) {
  DSEC_ASSIGN_OR_RETURN(std::string name, parseStringField(v, "language"));
  if (name == "python") return Language::kPython;
  if (name == "bash") return Language::kBash;
  return fieldError("language", "expected \"python\" or \"bash\", got \"" + name.substr(0, 64) + "\"");
}

}  // namespace

Status validateCallFilePath(std::string_view path) {
  if (path.empty()) return Error::invalid("empty path");
  if (path.size() > kMaxCallPathBytes) {
    return Error::invalid("path longer than " + std::to_string(kMaxCallPathBytes) + " bytes");
  }
  if (path.find('\0') != std::string_view::npos) return Error::invalid("path contains a NUL byte");
  if (path.front() == '/') {
    return Error::invalid("must be a path relative to the call's working directory, not absolute");
  }
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    std::string_view part = path.substr(start, end - start);
    if (part.empty()) return Error::invalid("empty path component (\"//\" or a trailing '/')");
    if (part == "." || part == "..") return Error::invalid("'.' and '..' are not allowed in paths");
    start = end + 1;
  }
  return okStatus();
}

Result<CallRequest> parseCallRequest(const json& body, int64_t node_memory_bytes) {
  if (!body.is_object()) return Error::invalid("request body must be a JSON object");
  for (const auto& [key, value] : body.items()) {
    (void)value;
    if (!knownKeys().count(key)) {
      return Error::invalid("unknown field '" + key.substr(0, 64) +
                            "' (known: code, language, stdin, stdin_b64, timeout, memory, files, image, output_cap, "
                            "fresh_interpreter)");
    }
  }
  CallRequest req;
  if (!body.contains("code")) return fieldError("code", "required");
  DSEC_ASSIGN_OR_RETURN(req.code, parseStringField(body["code"], "code"));
  if (req.code.empty()) return fieldError("code", "empty");
  if (req.code.size() > kMaxCallCodeBytes) return fieldError("code", "longer than 1 MiB");
  if (req.code.find('\0') != std::string::npos) return fieldError("code", "contains a NUL byte");
  if (body.contains("language")) {
    DSEC_ASSIGN_OR_RETURN(req.language, languageField(body["language"]));
  }
  DSEC_ASSIGN_OR_RETURN(req.stdin_data, parseStdinFields(body));
  req.timeout_seconds = kDefaultCallTimeout;
  if (body.contains("timeout")) {
    const json& t = body["timeout"];
    if (!t.is_number()) return fieldError("timeout", "expected seconds (a number), got " + jsonTypeName(t));
    double d = t.get<double>();
    if (!std::isfinite(d) || d <= 0) return fieldError("timeout", "must be > 0 seconds");
    if (d > kMaxCallTimeout) return fieldError("timeout", "at most 600 seconds for a call");
    req.timeout_seconds = d;
  }
  req.memory_bytes = kDefaultCallMemory;
  if (body.contains("memory")) {
    DSEC_ASSIGN_OR_RETURN(req.memory_bytes, parseSizeField(body["memory"], "memory"));
    if (req.memory_bytes < kMinCallMemory) return fieldError("memory", "must be at least 32M for a call");
    if (node_memory_bytes > 0 && req.memory_bytes > node_memory_bytes) {
      return fieldError("memory", "more than the node's memory (" + formatBytes(node_memory_bytes) + ")");
    }
  }
  req.output_cap = kDefaultCallOutputCap;
  if (body.contains("output_cap")) {
    const json& c = body["output_cap"];
    if (!c.is_number_integer()) return fieldError("output_cap", "expected bytes (an integer), got " + jsonTypeName(c));
    if (c.is_number_unsigned() ? c.get<uint64_t>() > static_cast<uint64_t>(kMaxCallOutputCap)
                               : c.get<int64_t>() > kMaxCallOutputCap) {
      return fieldError("output_cap", "more than 16 MiB");
    }
    int64_t cap = c.get<int64_t>();
    if (cap < 0) return fieldError("output_cap", "must not be negative");
    req.output_cap = cap == 0 ? kMaxCallOutputCap : cap;
  }
  if (body.contains("files")) {
    DSEC_ASSIGN_OR_RETURN(req.files, parseCallFiles(body["files"], false));
  }
  if (body.contains("fresh_interpreter")) {
    const json& f = body["fresh_interpreter"];
    if (!f.is_boolean()) return fieldError("fresh_interpreter", "expected true or false, got " + jsonTypeName(f));
    req.fresh_interpreter = f.get<bool>();
  }
  if (body.contains("image") && !body["image"].is_null()) {
    DSEC_ASSIGN_OR_RETURN(std::string image, parseStringField(body["image"], "image"));
    auto layers = fs3::parseImageRef(image);
    if (!layers.ok()) return fieldError("image", layers.error().message());
    req.image = fs3::imageToString(*layers);
  }
  return req;
}

Result<std::map<std::string, std::string>> parseCallFiles(const json& v, bool skip_null) {
  if (!v.is_object()) {
    return fieldError("files", "expected an object of relative path -> base64 bytes, got " + jsonTypeName(v));
  }
  if (v.size() > kMaxCallFiles) return fieldError("files", "more than " + std::to_string(kMaxCallFiles) + " files");
  std::map<std::string, std::string> files;
  std::set<std::string> dirs;  // every proper prefix, so "a" and "a/b" cannot both be files
  for (const auto& [path, value] : v.items()) {
    const std::string field = "files[\"" + path.substr(0, 128) + "\"]";
    if (auto st = validateCallFilePath(path); !st.ok()) return fieldError(field, st.error().message());
    if (skip_null && value.is_null()) continue;
    DSEC_ASSIGN_OR_RETURN(std::string b64, parseStringField(value, field));
    auto bytes = base64Decode(b64);
    if (!bytes.ok()) return fieldError(field, "not base64: " + bytes.error().message());
    for (size_t slash = path.find('/'); slash != std::string::npos; slash = path.find('/', slash + 1)) {
      dirs.insert(path.substr(0, slash));
    }
    files.emplace(path, std::move(*bytes));
  }
  for (const auto& [path, bytes] : files) {
    if (dirs.count(path))
      return fieldError("files[\"" + path.substr(0, 128) + "\"]", "is also a directory of another file");
  }
  return files;
}

}  // namespace dsec::launcher
