#include "dsec/backends/simulated/SimulatedBackend.h"

#include <atomic>

#include "dsec/common/Fault.h"

namespace dsec::backends {
namespace {

Error simulatedError(const std::string& id, const char* what) {
  return Error(ErrorCode::kUnsupported,
               "sandbox " + id + " is on a simulated node: it holds no processes (no " + what + ")");
}

class SimulatedSandbox : public Sandbox {
 public:
  explicit SimulatedSandbox(SandboxSpec spec, SandboxState state = SandboxState::kRunning)
      : spec_(std::move(spec)), state_(state) {}

  const SandboxSpec& spec() const override { return spec_; }
  SandboxState state() const override { return state_.load(); }
  std::string backendName() const override { return kSimulatedBackendName; }

  Result<ExecResult> exec(const ExecRequest&) override { return simulatedError(spec_.id, "exec"); }
  Result<ExecResult> execStream(const ExecRequest&, ExecSink&) override { return simulatedError(spec_.id, "exec"); }
  bool supportsStdinFd() const override { return false; }
  Result<LongRunningProcess> spawn(const ExecRequest&) override {
    return simulatedError(spec_.id, "processes to spawn");
  }
  // No processes, so no memory to limit: a limit asked for is refused, not pretended.
  Status setMemoryLimit(int64_t) override { return simulatedError(spec_.id, "memory limit"); }
  Status setEgress(const EgressPolicy&) override { return simulatedError(spec_.id, "network"); }
  Status setProtectedPaths(const std::vector<std::string>&) override { return simulatedError(spec_.id, "files"); }
  // Nothing runs, so nothing is ever refused.
  Result<std::vector<Violation>> violations() override { return std::vector<Violation>{}; }
  Result<UniqueFd> openForRead(const std::string&) override { return simulatedError(spec_.id, "files"); }
  Result<UniqueFd> openForWrite(const std::string&, uint32_t) override { return simulatedError(spec_.id, "files"); }
  Result<FileStat> stat(const std::string&) override { return simulatedError(spec_.id, "files"); }
  Result<std::vector<FileStat>> listDir(const std::string&) override { return simulatedError(spec_.id, "files"); }
  Status remove(const std::string&, bool) override { return simulatedError(spec_.id, "files"); }

  Status pause() override {
    DSEC_TRY(checkFault("simulated.pause"));  // a freeze the kernel refused
    auto expected = SandboxState::kRunning;
    if (!state_.compare_exchange_strong(expected, SandboxState::kPaused) && expected == SandboxState::kStopped) {
      return Error(ErrorCode::kConflict, "sandbox " + spec_.id + " was destroyed");
    }
    return okStatus();
  }
  Status resume() override {
    auto expected = SandboxState::kPaused;
    if (!state_.compare_exchange_strong(expected, SandboxState::kRunning) && expected == SandboxState::kStopped) {
      return Error(ErrorCode::kConflict, "sandbox " + spec_.id + " was destroyed");
    }
    return okStatus();
  }
  Status reclaimMemory() override { return okStatus(); }  // nothing to reclaim
  Status destroy() override {
    state_.store(SandboxState::kStopped);
    return okStatus();
  }
  Result<SandboxUsage> usage() override { return SandboxUsage{}; }
  // A simulated sandbox has no files or memory to capture.
  Result<SnapshotKind> snapshot(const std::string&) override { return simulatedError(spec_.id, "snapshots"); }

  nlohmann::json persistentState() const override {
    return nlohmann::json{{"backend", kSimulatedBackendName},
                          {"id", spec_.id},
                          {"image", spec_.image},
                          {"paused", state_.load() == SandboxState::kPaused}};
  }

 private:
  SandboxSpec spec_;
  std::atomic<SandboxState> state_;
};

class SimulatedBackend : public Backend {
 public:
  std::string name() const override { return kSimulatedBackendName; }
  std::vector<std::string> missingFeatures() const override { return {}; }

  Result<std::unique_ptr<Sandbox>> create(const SandboxSpec& spec) override {
    if (spec.id.empty()) return Error::invalid("simulated sandbox without an id");
    return std::unique_ptr<Sandbox>(std::make_unique<SimulatedSandbox>(spec));
  }

  Result<std::unique_ptr<Sandbox>> restore(const SandboxSpec& spec, const std::string&) override {
    return simulatedError(spec.id, "snapshots");
  }

  // A simulated sandbox is only its record: a restarted agent re-adopts it as it was (running or paused).
  Result<std::unique_ptr<Sandbox>> adopt(const nlohmann::json& state) override {
    if (!state.is_object() || state.value("backend", "") != kSimulatedBackendName || !state.contains("id") ||
        !state["id"].is_string()) {
      return Error::notFound("not a simulated sandbox's state");
    }
    SandboxSpec spec;
    spec.id = state["id"].get<std::string>();
    spec.image = state.value("image", "");
    auto initial = state.value("paused", false) ? SandboxState::kPaused : SandboxState::kRunning;
    return std::unique_ptr<Sandbox>(std::make_unique<SimulatedSandbox>(std::move(spec), initial));
  }
  Status reap(const nlohmann::json&) override { return okStatus(); }
  Result<std::vector<std::string>> listLeftovers() override { return std::vector<std::string>{}; }
  Status reapLeftover(const std::string&) override { return okStatus(); }
};

}  // namespace

std::unique_ptr<Backend> makeSimulatedBackend() { return std::make_unique<SimulatedBackend>(); }

}  // namespace dsec::backends
