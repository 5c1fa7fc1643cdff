// fncall: warm, restricted function calls. Pools of workers are kept per (image, language), each worker a
// pre-created container sandbox (read-only root) running a zygote: for Python an interpreter with the
// standard library loaded that forks a fresh child per call. Every call gets a fresh process, a fresh
// working directory, no network, the memory and pids limits, the timeout and the output cap; nothing it
// leaves (files, globals, environment, background processes) is seen by the next call. Workers that die are
// replaced; pools grow with load and shrink when idle. When no worker frees up in time the call fails with
// kResourceExhausted (the API turns it into 429 with a retry hint).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dsec/backends/Sandbox.h"
#include "dsec/common/Result.h"

namespace dsec::backends::fncall {

enum class Language { kPython, kBash };
Result<Language> parseLanguage(std::string_view name);  // "python" | "bash"; else kInvalidArgument
const char* languageName(Language language);

struct CallRequest {
  Language language = Language::kPython;
  std::string code;
  std::string stdin_data;
  double timeout_seconds = 10;
  int64_t memory_bytes = 256LL << 20;
  int64_t output_cap = 1LL << 20;            // bytes kept per stream
  std::map<std::string, std::string> files;  // relative path -> bytes, placed in the call's working directory
  std::string image;                         // "" = the service's default image
  // Python: run the call in an interpreter started for it alone (its own hash seed, nothing preloaded)
  // instead of a fork of the worker's warm one, at the cost of a whole interpreter start (docs/fncall.md,
  // "The hash seed"). Bash calls always start their own shell, so for them this changes nothing.
  bool fresh_interpreter = false;
};

// What call() accepts (kInvalidArgument naming the field otherwise).
inline constexpr size_t kMaxCodeBytes = size_t{1} << 20;
inline constexpr size_t kMaxStdinBytes = size_t{16} << 20;
inline constexpr size_t kMaxFiles = 1000;
inline constexpr size_t kMaxFileBytes = size_t{64} << 20;  // all files of one call together
inline constexpr size_t kMaxFilePathBytes = 1024;
inline constexpr double kMaxTimeoutSeconds = 600;
inline constexpr int64_t kMinMemoryBytes = 32LL << 20;
inline constexpr int64_t kMaxMemoryBytes = 64LL << 30;
inline constexpr int64_t kMaxOutputCap = 64LL << 20;
// Checks a request as call() does (code, stdin, timeout_seconds, memory_bytes, output_cap, files: relative
// paths without '..', '.', empty components or NUL, sizes); the error message names the field.
Status validateCallRequest(const CallRequest& request);

// Makes the container sandbox a worker runs in. The node agent mounts the image's layers and asks its
// container backend, so this library needs nothing of the launcher. `spec` arrives filled in (id, limits,
// read_only_root, network none); the factory adds lower_dirs and keeps the mount alive as long as the
// returned sandbox lives.
using WorkerSandboxFactory =
    std::function<Result<std::unique_ptr<Sandbox>>(const std::string& image, const SandboxSpec& spec)>;

struct FunctionServiceOptions {
  std::string default_image;     // used when a call names none
  std::string node_name = "n0";  // worker sandbox ids are "<node>-fn-<hex>"
  int max_workers = 8;           // over all pools on this node
  int min_idle_workers = 1;      // per pool that has seen a call, kept warm
  double idle_shrink_seconds = 30;
  double queue_wait_seconds = 2;  // how long a call waits for a worker before kResourceExhausted
  int64_t worker_pids = 256;      // pids limit of a worker sandbox (fork bombs stop here)
  // Size of each writable tmpfs of a worker (/work, /tmp, /dev/shm); what is written counts against the
  // call's memory limit too.
  int64_t worker_disk_bytes = 512LL << 20;
  bool prewarm_default = true;     // start min_idle_workers python workers of default_image at start()
  std::string python = "python3";  // the interpreter running the zygote, looked up on the image's PATH
};

// One pool of warm workers: those of one (image, language).
struct FncallPoolStats {
  std::string image;
  Language language = Language::kPython;
  int idle = 0;
  int busy = 0;
  int creating = 0;
  int waiting = 0;  // calls waiting for a worker of this pool
  uint64_t calls = 0;
  std::optional<std::string> last_error;  // why the last worker start failed, while failures continue
};

// The service's workers and what its calls came to, since start.
struct FncallStats {
  int max_workers = 0;
  int workers = 0;  // idle + busy + creating
  int idle = 0;
  int busy = 0;
  int creating = 0;
  uint64_t calls = 0;
  uint64_t errors = 0;  // calls with no result
  uint64_t timeouts = 0;
  uint64_t oom_kills = 0;
  uint64_t rejected = 0;  // no worker freed up in time
  uint64_t workers_created = 0;
  uint64_t worker_create_failures = 0;
  uint64_t workers_replaced = 0;
  uint64_t workers_shrunk = 0;
  double call_seconds = 0;  // summed over calls, receipt to result
  std::vector<FncallPoolStats> pools;
};

class FunctionService {
 public:
  static Result<std::unique_ptr<FunctionService>> start(const FunctionServiceOptions& options,
                                                        WorkerSandboxFactory factory);
  virtual ~FunctionService() = default;

  // Runs one call. Invalid requests are kInvalidArgument; no worker in time is kResourceExhausted.
  virtual Result<ExecResult> call(const CallRequest& request) = 0;
  // Pools, workers (idle/busy), calls, replacements, capacity rejections: for /v1/node and metrics.
  virtual FncallStats stats() = 0;
  // Prometheus lines (dsec_fncall_*).
  virtual void renderMetrics(std::string* out) = 0;
  // Destroys every worker sandbox. Idempotent; also done by the destructor.
  virtual void shutdown() = 0;
};

}  // namespace dsec::backends::fncall
