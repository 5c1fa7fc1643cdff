// The placement benchmark: a simulated cell (DSec's: 160 nodes of 2 x 96 cores and 1.5 TB) filled with a
// realistic mix of sandbox sizes through the real ClusterPlacer, every node's admission done by a real
// NodePlacer, and compared in the same run against naive random and least-loaded-full-scan placement.
// `dsec-bench-placement` and `dsec bench placement` both call runPlacementBench().
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "dsec/common/Result.h"
#include "dsec/placement/ClusterPlacer.h"

namespace dsec::placement {

struct SandboxSize {
  double share;  // fraction of sandboxes
  double cpus;
  int64_t memory_bytes;
};

struct PlacementBenchOptions {
  int nodes = 160;
  std::string topology = "2x96c-1.5t";
  int64_t sandboxes = 380000;
  int k = 2;
  uint64_t seed = 42;
  // The DSec mix: 70% 1 CPU/2 GiB, 20% 2/4, 8% 4/8, 2% 8/16.
  std::vector<SandboxSize> mix;
  // Fraction of sandboxes asking for QoS "latency" (dedicated cores in one NUMA domain).
  double latency_fraction = 0.002;
  // 0 = derive from the mix: requested / physical of a full cell, plus headroom (see below).
  double cpu_overcommit = 0;
  double memory_overcommit = 0;
  double headroom = 0.10;
  bool compare = true;  // also run the random and least-loaded baselines
};

struct StrategyResult {
  std::string strategy;
  int64_t placed = 0;
  int64_t rejected = 0;              // sandboxes no node would take
  int64_t node_rejects = 0;          // node admissions that refused (then placed again elsewhere)
  double decisions_per_second = 0;   // ClusterPlacer::place calls per second of time spent in them
  double end_to_end_per_second = 0;  // the whole loop: decision, node admission, confirm
  double p50_decision_ns = 0;
  double p99_decision_ns = 0;
  double max_over_mean = 0;  // node utilisation (max of CPU and memory committed fractions): max / mean
  double cpu_max_over_mean = 0;
  double memory_max_over_mean = 0;
  double mean_utilisation = 0;
};

struct PlacementBenchResult {
  double cpu_overcommit = 0;
  double memory_overcommit = 0;
  NodeSummary node;
  StrategyResult ours;  // power-of-k
  std::vector<StrategyResult> baselines;
  std::string json;  // one line: the keys the issue names plus the details
};

// Human summary goes to out (the JSON line is not written; print result.json last).
Result<PlacementBenchResult> runPlacementBench(const PlacementBenchOptions& options, std::ostream& out);
std::vector<SandboxSize> defaultSandboxMix();

// Parses benchmark options from args (without the program name), runs it, prints the summary and the JSON
// line; returns the exit status (0 ok, 1 failed, 2 bad arguments).
int placementBenchMain(const std::string& prog, const std::vector<std::string>& args);

}  // namespace dsec::placement
