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

const char* snapshotKindName(SnapshotKind kind) {
  switch (kind) {
    case SnapshotKind::kFilesystem:
      return "filesystem";
    case SnapshotKind::kMachine:
      return "machine";
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

const char* networkModeName(NetworkMode mode) {
  switch (mode) {
    case NetworkMode::kNone:
      return "none";
    case NetworkMode::kEgress:
      return "egress";
    case NetworkMode::kHost:
      return "host";
  }
  return "unknown";
}

Result<NetworkMode> parseNetworkMode(const std::string& name) {
  if (name == "none") return NetworkMode::kNone;
  if (name == "egress") return NetworkMode::kEgress;
  if (name == "host") return NetworkMode::kHost;
  return Error::invalid("network must be \"none\" or \"egress\", not \"" + name + "\"");
}

}  // namespace dsec::backends
