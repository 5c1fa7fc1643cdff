// The wire format of POST /run_code (docs/api.md, "SandboxFusion-compatible /run_code"): SandboxFusion's
// RunCodeRequest in, its RunCodeResponse out, with the same field names, value spellings and nulls. Pure logic,
// unit-tested (tests/launcher/RunCodeRequestsTest.cc).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "dsec/common/Result.h"
#include "dsec/launcher/node/RunCode.h"

namespace dsec::launcher {

constexpr uint64_t kRunCodeBodyLimit = 64ULL << 20;  // the whole request (code, stdin, files in base64)
constexpr double kDefaultRunCodeTimeout = 10;        // SandboxFusion's default compile_timeout and run_timeout
constexpr double kMaxRunCodeTimeout = 600;           // a run holds a worker (or a sandbox) for its whole time
constexpr int64_t kDefaultRunCodeMemoryMB = 1024;    // memory_limit_MB absent or -1 (SandboxFusion: "no limit")
constexpr int64_t kMinRunCodeMemoryMB = 32;          // fncall's own minimum
constexpr size_t kMaxRunCodeFetchFiles = 1000;

// The request, checked: an unknown language, an unknown field, a limit out of range, bad base64, a path that is
// absolute or leaves the working directory: kInvalidArgument naming the field. node_memory_bytes bounds
// memory_limit_MB (0 skips that check).
Result<RunCodeRequest> parseRunCodeRequest(const nlohmann::json& body, int64_t node_memory_bytes);

// SandboxFusion's RunCodeResponse for a result: status "Success" | "Failed" | "SandboxError" (as its
// parse_run_status decides), message, compile_result and run_result (null or {status, execution_time,
// return_code, stdout, stderr}), executor_pod_name (the node), files (path -> base64).
nlohmann::json runCodeResponseJson(const RunCodeResult& result, const std::string& node);

// The answer to a request that could not run, in SandboxFusion's shape ("SandboxError", the message, no results)
// plus dsec's error object {"code", "message"} (docs/api.md, Errors), so both kinds of client read it.
nlohmann::json runCodeErrorJson(const std::string& code, const std::string& message);

}  // namespace dsec::launcher
