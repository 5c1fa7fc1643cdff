#include "dsec/backends/Sandbox.h"

namespace dsec::backends {

const char* sandboxStateName(SandboxState state) {
  switch (state) {
    case SandboxState::kRunning:
      return "running";
    case SandboxState::kPaused:
      return "paused";
    case SandboxState::kStopped:
      return "stopped";
  }
  return "unknown";
}

const char* cpuQosName(CpuQos qos) {
  switch (qos) {
    case CpuQos::kBatch:
      return "batch";
    case CpuQos::kLatency:
      return "latency";
  }
  return "unknown";
}

}  // namespace dsec::backends
