// Languages and request validation: everything a call carries is checked before a worker is touched.
#include <cmath>
#include <string>

#include "dsec/backends/fncall/FunctionService.h"

namespace dsec::backends::fncall {
namespace {

Error fieldError(const std::string& field, const std::string& what) {
  return Error::invalid("fncall field '" + field + "': " + what);
}

Status validatePath(const std::string& path) {
  if (path.empty()) return Error::invalid("empty path");
  if (path.size() > kMaxFilePathBytes) {
    return Error::invalid("path longer than " + std::to_string(kMaxFilePathBytes) + " bytes");
  }
  if (path.find('\0') != std::string::npos) return Error::invalid("path contains a NUL byte");
  if (path.front() == '/') return Error::invalid("must be relative to the call's working directory");
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    std::string part = path.substr(start, end - start);
    if (part.empty()) return Error::invalid("empty path component");
    if (part == "..") return Error::invalid("'..' is not allowed");
    if (part == ".") return Error::invalid("'.' components are not allowed");
    start = end + 1;
  }
  return okStatus();
}

}  // namespace

Result<Language> parseLanguage(std::string_view name) {
  if (name == "python") return Language::kPython;
  if (name == "bash") return Language::kBash;
  return Error::invalid("fncall field 'language': expected \"python\" or \"bash\", got \"" +
                        std::string(name.substr(0, 64)) + "\"");
}

const char* languageName(Language language) {
  switch (language) {
    case Language::kPython:
      return "python";
    case Language::kBash:
      return "bash";
  }
  return "unknown";
}

Status validateCallRequest(const CallRequest& r) {
  if (r.language != Language::kPython && r.language != Language::kBash) {
    return fieldError("language", "expected python or bash");
  }
  if (r.code.size() > kMaxCodeBytes) {
    return fieldError("code", "larger than " + std::to_string(kMaxCodeBytes) + " bytes");
  }
  if (r.code.find('\0') != std::string::npos) return fieldError("code", "contains a NUL byte");
  if (r.stdin_data.size() > kMaxStdinBytes) {
    return fieldError("stdin", "larger than " + std::to_string(kMaxStdinBytes) + " bytes");
  }
  if (!std::isfinite(r.timeout_seconds) || r.timeout_seconds <= 0 || r.timeout_seconds > kMaxTimeoutSeconds) {
    return fieldError("timeout",
                      "must be > 0 and at most " + std::to_string(static_cast<int>(kMaxTimeoutSeconds)) + " seconds");
  }
  if (r.memory_bytes < kMinMemoryBytes || r.memory_bytes > kMaxMemoryBytes) {
    return fieldError("memory", "must be between " + std::to_string(kMinMemoryBytes >> 20) + " MiB and " +
                                    std::to_string(kMaxMemoryBytes >> 30) + " GiB");
  }
  if (r.output_cap < 0 || r.output_cap > kMaxOutputCap) {
    return fieldError("output_cap", "must be between 0 and " + std::to_string(kMaxOutputCap) + " bytes");
  }
  if (r.files.size() > kMaxFiles) return fieldError("files", "more than " + std::to_string(kMaxFiles) + " files");
  size_t total = 0;
  for (const auto& [path, data] : r.files) {
    if (auto st = validatePath(path); !st.ok()) {
      return fieldError("files[\"" + path.substr(0, 128) + "\"]", st.error().message());
    }
    total += data.size();
    // "a" and "a/b" cannot both be files.
    auto next = r.files.upper_bound(path + "/");
    if (next != r.files.end() && next->first.compare(0, path.size() + 1, path + "/") == 0) {
      return fieldError("files[\"" + path.substr(0, 128) + "\"]", "is also a directory of another file");
    }
  }
  if (total > kMaxFileBytes) {
    return fieldError("files", "larger than " + std::to_string(kMaxFileBytes) + " bytes together");
  }
  return okStatus();
}

}  // namespace dsec::backends::fncall
