// Fleet placement as DSec's gateway does it, and a little better: filter healthy, non-draining nodes that run
// the backend and admit the request by their own admission state (placement/Admission.h: the node's reported
// ratios, committed resources, pressure, free dedicated cores and slots, plus the requests placed there and not
// yet answered), sample k of them at random, take the least loaded (the larger of its committed memory and CPU
// fractions of ratio x capacity; fewer sandboxes on a tie), and count the request in flight on that node until
// the node answers confirm(). The node makes the final admission; on a reject the caller places again,
// excluding the nodes that refused. A node that has not reported its admission state yet is left to decide
// alone (its own 429 sends the request elsewhere).
//
// Built for the gateway's hot path: a decision is a few random draws and comparisons under one uncontended
// mutex (millions per second on one core); the exhaustive scan happens only when sampling finds nothing,
// which also yields the error that says why nothing fits. Seeded, so tests and benchmarks are repeatable.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "dsec/common/Result.h"
#include "dsec/placement/Admission.h"
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
};

struct NodeInfo {
  std::string name;
  NodeSummary capacity;  // physical (pus, memory_bytes): utilisation is reported against it
  std::vector<std::string> backends = {"container"};
  // What the node admits by, as it reports it; nullopt keeps what is known (at first: nothing, the node decides).
  std::optional<NodeAdmission> admission;
  bool healthy = true;
  bool draining = false;
};

struct ClusterRequest {
  double cpus = 1;
  int64_t memory_bytes = 0;
  std::string_view backend = "container";  // "" = any
  bool latency = false;                    // qos latency: needs dedicated cores
};

// What a decision hands out: the node, and the request as counted in flight there. confirm() takes it back.
struct Ticket {
  NodeId node = -1;
  int64_t milli_cpus = 0;
  int64_t memory_bytes = 0;
  int64_t dedicated_cores = 0;  // latency requests
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
  bool admission_known = false;  // the node reported its admission state
  NodeAdmission admission;       // as reported, plus what was confirmed since (in flight not included)
  std::string closed_reason;     // what holds its admission closed, as it said
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

  // The watcher's view: health, draining, and the node's own admission state and sandbox count (a heartbeat or
  // probe), which replace ours; requests still in flight keep counting on top of it.
  Status setHealthy(NodeId node, bool healthy);
  Status setDraining(NodeId node, bool draining);
  Status setAdmission(NodeId node, const NodeAdmission& admission, int64_t sandboxes,
                      std::string_view closed_reason = "");

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
    // The node's admission state as last reported, plus creates confirmed since (its next report replaces
    // them). Unknown until the first report: capacities 0 and -1 check nothing, so the node decides alone.
    bool known = false;
    NodeAdmission admission;
    std::string closed_reason;
    int64_t sandboxes = 0;
    // Tickets: creates sent to the node and not answered yet.
    int64_t in_flight_milli = 0;
    int64_t in_flight_memory = 0;
    int64_t in_flight_cores = 0;
    int64_t in_flight = 0;
  };
  // The node's admission state with its tickets in flight counted.
  static NodeAdmission withInFlight(const Node& node);
  uint64_t backendBit(std::string_view backend);  // registers new names
  bool lookupBackend(std::string_view backend, uint64_t& bit) const;
  bool fits(const Node& node, uint64_t backend_bit, const AdmissionRequest& request) const;
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
