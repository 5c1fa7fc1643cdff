// One fncall worker: a read-only container sandbox (made by the factory) with the zygote spawned in it, and
// the agent's end of the zygote protocol (zygote.py): the control socket, and per call the pipes the call's
// child reads its request from and writes its output to (CallStreams), which the zygote never reads. Not
// thread-safe: one call at a time, which the service guarantees; kill() alone may be called from any thread
// (shutdown).
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "dsec/backends/Sandbox.h"
#include "dsec/backends/fncall/FunctionService.h"

namespace dsec::backends::fncall {

struct WorkerConfig {
  std::string id;  // sandbox id
  std::string image;
  Language language = Language::kPython;
  int64_t pids = 256;
  int64_t disk_bytes = 512LL << 20;
  std::string python = "python3";
  double ready_timeout_seconds = 60;  // interpreter start and stdlib imports, on a loaded machine
};

class Worker {
 public:
  // Creates the sandbox, spawns the zygote and waits for it to be ready; on failure nothing is left.
  static Result<std::unique_ptr<Worker>> start(const WorkerConfig& config, const WorkerSandboxFactory& factory);
  ~Worker();  // destroy()
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Runs one call. `healthy` comes back false when the worker must not take another call (zygote died, did
  // not answer, could not clean up, its memory limit could not be set): the caller destroys it. A memory
  // limit the sandbox cannot set is an error of the call, never ignored. `started`
  // comes back false when the zygote was gone before it took the request: the call never ran anywhere and
  // may be retried on another worker.
  Result<ExecResult> call(const CallRequest& request, bool* healthy, bool* started);
  // The zygote has exited (checked without blocking).
  bool dead() const;
  // SIGKILLs the zygote so a call in flight returns at once (thread-safe).
  void kill();
  // Kills the zygote, reaps it and destroys the sandbox. Idempotent.
  Status destroy();

  const std::string& id() const { return config_.id; }
  int64_t baselineMemory() const { return baseline_memory_; }
  uint64_t calls() const { return calls_; }

 private:
  Worker(WorkerConfig config, std::unique_ptr<Sandbox> sandbox);
  Status spawnZygote();
  Result<std::string> readReadyFrame(double deadline);
  Status setCallMemoryLimit(const CallRequest& request, bool* started);
  Result<ExecResult> zygoteDied(const Error& why, double start);
  void drainStderr();
  bool oomKilledSince();

  WorkerConfig config_;
  std::unique_ptr<Sandbox> sandbox_;
  LongRunningProcess zygote_;
  UniqueFd control_;                   // our end of the zygote's control socket
  std::atomic<int> zygote_pidfd_{-1};  // for kill() from another thread
  int64_t baseline_memory_ = 0;        // the worker's usage with the zygote ready: added to each call's limit
  int64_t memory_limit_ = -1;          // the limit set now (-1 = the creation-time one)
  int64_t oom_kills_ = 0;              // the cgroup's OOM kills already accounted for
  uint64_t calls_ = 0;
  bool destroyed_ = false;
};

}  // namespace dsec::backends::fncall
