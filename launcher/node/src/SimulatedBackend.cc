#include "dsec/launcher/node/SimulatedBackend.h"

#include <atomic>

namespace dsec::launcher {
namespace {

Error simulatedError(const std::string& id, const char* what) {
  return Error(ErrorCode::kUnsupported,
               "sandbox " + id + " is on a simulated node: it holds no processes (no " + what + ")");
}

class SimulatedSandbox : public backends::Sandbox {
 public:
  explicit SimulatedSandbox(backends::SandboxSpec spec, backends::SandboxState state = backends::SandboxState::kRunning)
      : spec_(std::move(spec)), state_(state) {}

  const backends::SandboxSpec& spec() const override { return spec_; }
  backends::SandboxState state() const override { return state_.load(); }
  std::string backendName() const override { return kSimulatedBackendName; }

  Result<backends::ExecResult> exec(const backends::ExecRequest&) override { return simulatedError(spec_.id, "exec"); }
  Result<backends::ExecResult> execStream(const backends::ExecRequest&, backends::ExecSink&) override {
    return simulatedError(spec_.id, "exec");
  }
  bool supportsStdinFd() const override { return false; }
  Result<backends::LongRunningProcess> spawn(const backends::ExecRequest&) override {
    return simulatedError(spec_.id, "processes to spawn");
  }
  // No processes, so no memory to limit: a limit asked for is refused, not pretended.
  Status setMemoryLimit(int64_t) override { return simulatedError(spec_.id, "memory limit"); }
  Result<UniqueFd> openForRead(const std::string&) override { return simulatedError(spec_.id, "files"); }
  Result<UniqueFd> openForWrite(const std::string&, uint32_t) override { return simulatedError(spec_.id, "files"); }
  Result<backends::FileStat> stat(const std::string&) override { return simulatedError(spec_.id, "files"); }
  Result<std::vector<backends::FileStat>> listDir(const std::string&) override {
    return simulatedError(spec_.id, "files");
  }
  Status remove(const std::string&, bool) override { return simulatedError(spec_.id, "files"); }

  Status pause() override {
    auto expected = backends::SandboxState::kRunning;
    if (!state_.compare_exchange_strong(expected, backends::SandboxState::kPaused) &&
        expected == backends::SandboxState::kStopped) {
      return Error(ErrorCode::kConflict, "sandbox " + spec_.id + " was destroyed");
    }
    return okStatus();
  }
  Status resume() override {
    auto expected = backends::SandboxState::kPaused;
    if (!state_.compare_exchange_strong(expected, backends::SandboxState::kRunning) &&
        expected == backends::SandboxState::kStopped) {
      return Error(ErrorCode::kConflict, "sandbox " + spec_.id + " was destroyed");
    }
    return okStatus();
  }
  Status reclaimMemory() override { return okStatus(); }  // nothing to reclaim
  Status destroy() override {
    state_.store(backends::SandboxState::kStopped);
    return okStatus();
  }
  Result<backends::SandboxUsage> usage() override { return backends::SandboxUsage{}; }

  nlohmann::json persistentState() const override {
    return nlohmann::json{{"backend", kSimulatedBackendName},
                          {"id", spec_.id},
                          {"image", spec_.image},
                          {"paused", state_.load() == backends::SandboxState::kPaused}};
  }

 private:
  backends::SandboxSpec spec_;
  std::atomic<backends::SandboxState> state_;
};

class SimulatedBackend : public backends::Backend {
 public:
  std::string name() const override { return kSimulatedBackendName; }
  std::vector<std::string> missingFeatures() const override { return {}; }

  Result<std::unique_ptr<backends::Sandbox>> create(const backends::SandboxSpec& spec) override {
    if (spec.id.empty()) return Error::invalid("simulated sandbox without an id");
    return std::unique_ptr<backends::Sandbox>(std::make_unique<SimulatedSandbox>(spec));
  }

  // A simulated sandbox is only its record: a restarted agent re-adopts it as it was (running or paused).
  Result<std::unique_ptr<backends::Sandbox>> adopt(const nlohmann::json& state) override {
    if (!state.is_object() || state.value("backend", "") != kSimulatedBackendName || !state.contains("id") ||
        !state["id"].is_string()) {
      return Error::notFound("not a simulated sandbox's state");
    }
    backends::SandboxSpec spec;
    spec.id = state["id"].get<std::string>();
    spec.image = state.value("image", "");
    auto initial = state.value("paused", false) ? backends::SandboxState::kPaused : backends::SandboxState::kRunning;
    return std::unique_ptr<backends::Sandbox>(std::make_unique<SimulatedSandbox>(std::move(spec), initial));
  }
  Status reap(const nlohmann::json&) override { return okStatus(); }
  Result<std::vector<std::string>> listLeftovers() override { return std::vector<std::string>{}; }
  Status reapLeftover(const std::string&) override { return okStatus(); }
};

}  // namespace

std::unique_ptr<backends::Backend> makeSimulatedBackend() { return std::make_unique<SimulatedBackend>(); }

placement::DensityConfig simulatedDensityConfig(placement::DensityConfig c) {
  c.overcommit = true;
  constexpr double kNever = 1e9;
  for (int i = 0; i < 3; ++i) {
    c.use_enter[i] = c.use_leave[i] = kNever;
    c.psi_some_enter[i] = c.psi_some_leave[i] = kNever;
    c.psi_full_enter[i] = c.psi_full_leave[i] = kNever;
  }
  c.cpu_psi_some = kNever;
  c.use_bound_min_fraction = kNever;  // no use-based bound on the ratio either
  c.oom_hold_seconds = 0;
  return c;
}

}  // namespace dsec::launcher
