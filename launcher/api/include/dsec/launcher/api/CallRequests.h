// Validation of POST /v1/call bodies (docs/api.md, "Function calls"): code, language, stdin | stdin_b64,
// timeout, memory, files, image, output_cap. Pure logic, unit-tested; every error names the field.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string_view>

#include "dsec/backends/fncall/FunctionService.h"
#include "dsec/common/Result.h"

namespace dsec::launcher {

constexpr uint64_t kCallBodyLimit = 64ULL << 20;  // the whole request (code, stdin, files)
constexpr size_t kMaxCallCodeBytes = 1ULL << 20;  // source text (the fncall service's own limit)
constexpr size_t kMaxCallFiles = 1000;
constexpr size_t kMaxCallPathBytes = 1024;
constexpr double kDefaultCallTimeout = 10;
constexpr double kMaxCallTimeout = 600;  // a call holds a warm worker for its whole run
constexpr int64_t kDefaultCallMemory = 256LL << 20;
constexpr int64_t kMinCallMemory = 32LL << 20;  // the fncall service's own limit
constexpr int64_t kDefaultCallOutputCap = 1LL << 20;
constexpr int64_t kMaxCallOutputCap = 16LL << 20;

// node_memory_bytes bounds "memory" (0 skips that check). The image is normalised ("a:1+b:2"); "" when the
// body names none (the node's default fncall image).
Result<backends::fncall::CallRequest> parseCallRequest(const nlohmann::json& body, int64_t node_memory_bytes);

// A call's "files": {relative path: base64 bytes}, at most kMaxCallFiles, no path both a file and a directory of
// another. skip_null: a null value means no file (SandboxFusion's clients send that); else it is an error.
Result<std::map<std::string, std::string>> parseCallFiles(const nlohmann::json& v, bool skip_null);

// A path relative to the call's working directory: not empty, not absolute, no "." / ".." / empty components,
// no NUL, at most kMaxCallPathBytes.
Status validateCallFilePath(std::string_view path);

}  // namespace dsec::launcher
