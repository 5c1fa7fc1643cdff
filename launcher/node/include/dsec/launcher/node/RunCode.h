// POST /run_code (docs/api.md, "SandboxFusion-compatible /run_code"): one program run the way SandboxFusion runs
// it, on this node. python and bash go to the fncall workers (NodeFncall); cpp is compiled with g++ and run in a
// fresh container sandbox that is destroyed afterwards. The node core's view, independent of the wire format: the
// API edge (api/RunCodeRequests.h) parses the JSON into a RunCodeRequest and shapes the RunCodeResult.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dsec/common/Result.h"

namespace dsec::launcher {

class NodeAgent;

enum class RunLanguage { kPython, kBash, kCpp };
const char* runLanguageName(RunLanguage language);

constexpr const char* kDefaultRunCodeCppImage = "debian:12+gcc:12";  // docs/api.md says how to build it

struct RunCodeOptions {
  std::string cpp_image = kDefaultRunCodeCppImage;  // the image cpp is compiled and run in (needs g++)
};

struct RunCodeRequest {
  RunLanguage language = RunLanguage::kPython;
  std::string code;
  std::string stdin_data;
  double compile_timeout = 10;  // seconds, cpp only (python and bash have no compile step)
  double run_timeout = 10;
  int64_t memory_bytes = 0;                  // the limit of the run (and of cpp's compile): always set
  std::map<std::string, std::string> files;  // relative path -> bytes, in the working directory
  std::vector<std::string> fetch_files;      // relative paths read back after the run
};

// SandboxFusion's CommandRunStatus.
enum class CommandStatus { kFinished, kTimeLimitExceeded, kError };
const char* commandStatusName(CommandStatus status);

// SandboxFusion's CommandRunResult: execution_time and return_code are absent where it has null (no return code
// after a time limit, neither after an error, whose message is in stderr).
struct CommandOutcome {
  CommandStatus status = CommandStatus::kFinished;
  std::optional<double> execution_time;
  std::optional<int> return_code;  // the exit status; -N when killed by signal N (as Python's subprocess says)
  std::string stdout_data;
  std::string stderr_data;
};

struct RunCodeResult {
  std::optional<CommandOutcome> compile;     // cpp only
  std::optional<CommandOutcome> run;         // absent when the compile failed or timed out
  std::map<std::string, std::string> files;  // fetched: path -> bytes (files that were not regular files are left out)
};

// The fetched files of one run together, at most (what does not fit fails the run with a clear error).
constexpr size_t kMaxFetchBytes = size_t{16} << 20;

// Runs one request. An error is the platform's or the request's (no fncall here, unknown image, no room: the
// API maps it to an HTTP status); what the program does (fails to compile, exits non-zero, runs over its time)
// is in the result.
Result<RunCodeResult> runCode(NodeAgent& agent, const RunCodeOptions& options, const RunCodeRequest& request);

// ---- the fetch driver of python and bash (exposed for tests) ----------------------------------------------------
// With fetch_files, a python or bash run is a Python driver on the fncall worker that runs the program as a child
// (stdin, stdout and stderr passed through), enforces run_timeout itself, and then writes a trailer to stdout:
// "\n<begin marker>" JSON "<end marker>", the markers carrying a per-run nonce. The trailer's JSON is
// {"rc": int|null, "signal": int, "tle": bool, "time": seconds, "files": {path: base64}, "skipped": [path...]}.
struct FetchTrailer {
  bool found = false;
  std::string program_stdout;  // stdout without the trailer
  std::optional<int> return_code;
  bool time_limit_exceeded = false;
  double execution_time = 0;
  std::map<std::string, std::string> files;  // decoded
  std::string error;                         // why the trailer is unusable ("" when fine)
};
std::string fetchDriverSource(const std::string& nonce);
FetchTrailer parseFetchTrailer(std::string_view stdout_data, const std::string& nonce);

}  // namespace dsec::launcher
