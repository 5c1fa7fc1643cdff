// Fleet placement as DSec's gateway does it, and a little better: filter healthy, non-draining nodes that run
// the backend and have room (committed + in-flight + request <= capacity * overcommit), sample k of them at
// random, take the least loaded (the larger of its committed CPU and memory fractions), and count the request
// in flight on that node until the node answers confirm(). The node makes the final admission; on a reject
// the caller places again, excluding the nodes that refused.
//
// Built for the gateway's hot path: a decision is a few random draws and comparisons under one uncontended
// mutex (millions per second on one core); the exhaustive scan happens only when sampling finds nothing,
// which also yields the error that says why nothing fits. Seeded, so tests and benchmarks are repeatable.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "dsec/common/Result.h"
#include "dsec/placement/NodeModel.h"

namespace dsec::placement {

using NodeId = int32_t;

enum class Strategy {
  kPowerOfK,     // sample k eligible nodes, take the least loaded (the default)
  kRandom,       // one eligible node at random (the naive baseline)
  kLeastLoaded,  // scan every node, take the least loaded (the slow ideal)
};
const char* strategyName(Strategy strategy);

struct ClusterPlacerOptions {
  int k = 2;
  uint64_t seed = 0;  // 0 = from the clock
  Strategy strategy = Strategy::kPowerOfK;
  // Defaults for nodes that do not set their own.
  double cpu_overcommit = 1.0;
  double memory_overcommit = 1.0;
};

struct NodeInfo {
  std::string name;
  NodeSummary capacity;  // from the node's NodeModel: pus and memory_bytes are used
  std::vector<std::string> backends = {"container"};
  double cpu_overcommit = 0;  // 0 = the placer's default
  double memory_overcommit = 0;
  bool healthy = true;
  bool draining = false;
};

struct ClusterRequest {
  double cpus = 1;
  int64_t memory_bytes = 0;
  std::string_view backend = "container";  // "" = any
};

// What a decision hands out: the node, and the request as counted in flight there. confirm() takes it back.
struct Ticket {
  NodeId node = -1;
  int64_t milli_cpus = 0;
  int64_t memory_bytes = 0;
};

struct NodeLoad {
  std::string name;
  bool healthy = true;
  bool draining = false;
  double capacity_cpus = 0;
  int64_t capacity_memory = 0;
  double committed_cpus = 0;
  int64_t committed_memory = 0;
  double in_flight_cpus = 0;
  int64_t in_flight_memory = 0;
  int64_t in_flight = 0;
  int64_t sandboxes = 0;
  // Committed (and in flight) against physical capacity, the larger of CPU and memory.
  double utilisation = 0;
};

class ClusterPlacer {
 public:
  explicit ClusterPlacer(ClusterPlacerOptions options = {});

  // Adds a node or, for a known name, replaces its capacity/backends/ratios and flags (a node re-registering).
  NodeId addNode(const NodeInfo& info);
  Result<NodeId> find(const std::string& name) const;
  size_t nodeCount() const;

  // One decision. exclude: nodes that already refused this request. kResourceExhausted when nothing fits,
  // with counts of why; kInvalidArgument for a malformed request.
  Result<Ticket> place(const ClusterRequest& request, const std::vector<NodeId>& exclude = {});
  // The node's answer: ok commits the request there, a reject just drops it from in flight.
  void confirm(const Ticket& ticket, bool ok);
  // A sandbox on the node went away (destroyed, reclaimed at TTL).
  void release(NodeId node, double cpus, int64_t memory_bytes);

  // The watcher's view: health, draining, and the node's own books (which win over ours).
  Status setHealthy(NodeId node, bool healthy);
  Status setDraining(NodeId node, bool draining);
  Status setCommitted(NodeId node, double cpus, int64_t memory_bytes, int64_t sandboxes);
  Status setOvercommit(NodeId node, double cpu_ratio, double memory_ratio);

  Result<NodeLoad> load(NodeId node) const;
  std::vector<NodeLoad> loads() const;
  std::string name(NodeId node) const;

 private:
  struct Node {
    std::string name;
    uint64_t backends = 0;  // bit per registered backend name
    bool healthy = true;
    bool draining = false;
    int64_t cap_milli = 0;  // physical
    int64_t cap_memory = 0;
    int64_t limit_milli = 0;   // physical * overcommit
    int64_t limit_memory = 0;  // 0 = memory not checked (unknown)
    double inv_limit_milli = 0;
    double inv_limit_memory = 0;
    double cpu_ratio = 0;  // as set on the node (0 = default)
    double memory_ratio = 0;
    int64_t used_milli = 0;  // committed + in flight
    int64_t used_memory = 0;
    int64_t in_flight_milli = 0;
    int64_t in_flight_memory = 0;
    int64_t in_flight = 0;
    int64_t sandboxes = 0;
  };
  uint64_t backendBit(std::string_view backend);  // registers new names
  bool lookupBackend(std::string_view backend, uint64_t& bit) const;
  void recomputeLimits(Node& node);
  bool fits(const Node& node, uint64_t backend_bit, int64_t milli, int64_t memory) const;
  double score(const Node& node, int64_t milli, int64_t memory) const;
  uint64_t nextRandom();
  uint32_t randomBelow(uint32_t bound);
  Error nothingFits(const ClusterRequest& request, uint64_t backend_bit, const std::vector<NodeId>& exclude) const;
  NodeLoad loadLocked(const Node& node) const;

  ClusterPlacerOptions options_;
  mutable std::mutex mu_;
  std::vector<Node> nodes_;
  std::unordered_map<std::string, NodeId> by_name_;
  std::vector<std::string> backend_names_;
  uint64_t rng_[4];
  std::vector<NodeId> scratch_;  // eligible nodes, for the slow path
};

}  // namespace dsec::placement
