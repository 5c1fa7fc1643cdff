// What a sandbox is created with, once the API edge has validated a request (api/Requests.h): the node core's
// view of a create, independent of the wire format.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dsec/backends/BackendKind.h"
#include "dsec/backends/Sandbox.h"
#include "dsec/fs3/LayerRef.h"

namespace dsec::launcher {

constexpr int64_t kMinMemoryBytes = 4LL << 20;
constexpr int64_t kMinDiskBytes = 1LL << 20;
constexpr int64_t kMinPids = 8;
constexpr double kMaxCpus = 1024;
constexpr double kMaxDurationSeconds = 10.0 * 365 * 24 * 3600;
constexpr int64_t kDefaultOutputCap = 16LL << 20;
constexpr int64_t kMaxOutputCap = 1LL << 30;

struct CreateParams {
  std::string image;  // normalised ("a:1+b:2")
  std::vector<fs3::LayerRef> layers;
  backends::BackendKind backend = backends::BackendKind::kContainer;
  double cpus = 1;
  int64_t memory_bytes = 512LL << 20;  // 0 = unlimited
  int64_t disk_bytes = 1LL << 30;      // 0 = backend default
  int64_t pids = 1024;                 // 0 = unlimited
  double timeout = 0;                  // seconds, 0 = none
  double idle_timeout = 0;
  std::map<std::string, std::string> env;
  std::map<std::string, std::string> labels;
  backends::NetworkMode network = backends::NetworkMode::kNone;
  // With network kEgress: where it may connect, now (PUT .../network replaces it).
  backends::EgressPolicy egress;
  // Paths its processes cannot change, now (PUT .../protect replaces them).
  std::vector<std::string> protected_paths;
  std::string session;  // the session the sandbox belongs to ("" = none)
  // CPU QoS (docs/qos.md): "latency" gets dedicated cores, "batch" (default) shares the pool under SCHED_IDLE.
  backends::CpuQos qos = backends::CpuQos::kBatch;
  // The snapshot it was restored from ("" = made from its image); a container's snapshot layer is in `layers`.
  std::string snapshot;
};

// Whether every k=v of `want` is among `labels` (the ?label= selectors of a list).
bool labelsMatch(const std::map<std::string, std::string>& labels, const std::map<std::string, std::string>& want);

}  // namespace dsec::launcher
