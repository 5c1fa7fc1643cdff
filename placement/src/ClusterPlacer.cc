#include "dsec/placement/ClusterPlacer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <sstream>

#include "dsec/common/Strings.h"

namespace dsec::placement {

namespace {

constexpr int kMaxK = 64;

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

std::string cpusText(double cpus) {
  std::ostringstream out;
  out << cpus;
  return out.str();
}

// Least loaded first: the larger of the committed memory and CPU fractions of what the node admits, then the
// fewer sandboxes (nodes that check nothing yet, or requests without limits, still spread).
struct Score {
  double load = 0;
  int64_t sandboxes = 0;
  bool operator<(const Score& other) const {
    return load != other.load ? load < other.load : sandboxes < other.sandboxes;
  }
};

bool excluded(const std::vector<NodeId>& exclude, NodeId id) {
  for (NodeId e : exclude) {
    if (e == id) return true;
  }
  return false;
}

}  // namespace

const char* strategyName(Strategy strategy) {
  switch (strategy) {
    case Strategy::kPowerOfK:
      return "power-of-k";
    case Strategy::kRandom:
      return "random";
    case Strategy::kLeastLoaded:
      return "least-loaded";
  }
  return "?";
}

ClusterPlacer::ClusterPlacer(ClusterPlacerOptions options) : options_(options) {
  options_.k = std::clamp(options_.k, 1, kMaxK);
  uint64_t seed = options_.seed != 0
                      ? options_.seed
                      : static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  for (auto& word : rng_) word = splitmix64(seed);
}

// xoshiro256**: fast, good enough for sampling, and the same sequence everywhere for a seed.
uint64_t ClusterPlacer::nextRandom() {
  uint64_t result = rotl(rng_[1] * 5, 7) * 9;
  uint64_t t = rng_[1] << 17;
  rng_[2] ^= rng_[0];
  rng_[3] ^= rng_[1];
  rng_[1] ^= rng_[2];
  rng_[0] ^= rng_[3];
  rng_[2] ^= t;
  rng_[3] = rotl(rng_[3], 45);
  return result;
}

// Lemire's multiply-shift: uniform enough for bounds far below 2^32, and no division.
uint32_t ClusterPlacer::randomBelow(uint32_t bound) {
  return static_cast<uint32_t>(((nextRandom() >> 32) * static_cast<uint64_t>(bound)) >> 32);
}

bool ClusterPlacer::lookupBackend(std::string_view backend, uint64_t& bit) const {
  if (backend.empty()) {
    bit = 0;
    return true;
  }
  for (size_t i = 0; i < backend_names_.size(); ++i) {
    if (backend_names_[i] == backend) {
      bit = 1ULL << i;
      return true;
    }
  }
  return false;
}

uint64_t ClusterPlacer::backendBit(std::string_view backend) {
  uint64_t bit = 0;
  if (lookupBackend(backend, bit)) return bit;
  if (backend_names_.size() >= 64) return 0;  // more than 64 backend kinds is not a real fleet
  backend_names_.emplace_back(backend);
  return 1ULL << (backend_names_.size() - 1);
}

NodeId ClusterPlacer::addNode(const NodeInfo& info) {
  std::lock_guard lock(mu_);
  NodeId id;
  auto it = by_name_.find(info.name);
  if (it != by_name_.end()) {
    id = it->second;
  } else {
    id = static_cast<NodeId>(nodes_.size());
    nodes_.emplace_back();
    by_name_.emplace(info.name, id);
  }
  Node& node = nodes_[id];
  node.name = info.name;
  node.backends = 0;
  for (const auto& backend : info.backends) node.backends |= backendBit(backend);
  node.healthy = info.healthy;
  node.draining = info.draining;
  node.cap_milli = static_cast<int64_t>(info.capacity.pus) * 1000;
  node.cap_memory = info.capacity.memory_bytes;
  if (info.admission) {
    node.known = true;
    node.admission = *info.admission;
  } else if (!node.known) {
    // Nothing checked until the node reports (capacities 0, -1): it decides alone.
    node.admission = NodeAdmission{.free_dedicated_cores = -1, .free_sandboxes = -1};
  }
  return id;
}

Result<NodeId> ClusterPlacer::find(const std::string& name) const {
  std::lock_guard lock(mu_);
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return Error::notFound("no node named " + name);
  return it->second;
}

size_t ClusterPlacer::nodeCount() const {
  std::lock_guard lock(mu_);
  return nodes_.size();
}

NodeAdmission ClusterPlacer::withInFlight(const Node& node) {
  NodeAdmission a = node.admission;
  a.memory_committed_bytes += node.in_flight_memory;
  a.cpu_committed += static_cast<double>(node.in_flight_milli) / 1000.0;
  if (a.free_sandboxes >= 0) a.free_sandboxes = std::max<int64_t>(0, a.free_sandboxes - node.in_flight);
  if (a.free_dedicated_cores >= 0)
    a.free_dedicated_cores = std::max<int64_t>(0, a.free_dedicated_cores - node.in_flight_cores);
  return a;
}

bool ClusterPlacer::fits(const Node& node, uint64_t backend_bit, const AdmissionRequest& request) const {
  return node.healthy && !node.draining && (backend_bit == 0 || (node.backends & backend_bit) != 0) &&
         admissionRefusal(withInFlight(node), request) == AdmissionRefusal::kNone;
}

Result<Ticket> ClusterPlacer::place(const ClusterRequest& request, const std::vector<NodeId>& exclude) {
  if (!(request.cpus > 0) || request.memory_bytes < 0 || !std::isfinite(request.cpus)) {
    return Error::invalid("placement request needs cpus > 0 and memory >= 0 (got " + cpusText(request.cpus) +
                          " CPUs, " + std::to_string(request.memory_bytes) + " bytes)");
  }
  const auto milli = static_cast<int64_t>(std::llround(request.cpus * 1000.0));
  const int64_t memory = request.memory_bytes;
  const AdmissionRequest asked{memory, request.cpus, request.latency};
  const int64_t cores = request.latency ? dedicatedCoresFor(request.cpus) : 0;
  std::lock_guard lock(mu_);
  uint64_t bit = 0;
  if (!lookupBackend(request.backend, bit)) return nothingFits(request, ~0ULL, exclude);
  const auto n = static_cast<uint32_t>(nodes_.size());
  if (n == 0) return Error(ErrorCode::kResourceExhausted, "no node has registered yet");

  NodeId best = -1;
  Score best_score;
  auto consider = [&](NodeId id) {
    const Node& node = nodes_[id];
    Score s{admissionLoad(withInFlight(node)), node.sandboxes + node.in_flight};
    if (best < 0 || s < best_score) {
      best_score = s;
      best = id;
    }
  };

  if (options_.strategy == Strategy::kLeastLoaded) {
    for (NodeId id = 0; id < static_cast<NodeId>(n); ++id) {
      if (fits(nodes_[id], bit, asked) && !excluded(exclude, id)) consider(id);
    }
  } else {
    const int k = options_.strategy == Strategy::kRandom ? 1 : options_.k;
    // Fast path: draw nodes at random and keep the eligible ones; a healthy cell finds k in about k draws.
    NodeId sampled[kMaxK];
    int found = 0;
    const int max_draws = 4 * k + 8;
    for (int draw = 0; draw < max_draws && found < k; ++draw) {
      auto id = static_cast<NodeId>(randomBelow(n));
      bool seen = false;
      for (int i = 0; i < found; ++i) seen = seen || sampled[i] == id;
      if (seen || !fits(nodes_[id], bit, asked) || excluded(exclude, id)) continue;
      sampled[found++] = id;
      consider(id);
    }
    if (found < k) {
      // Slow path (a nearly full or mostly unhealthy cell): sample among all eligible nodes exactly.
      scratch_.clear();
      for (NodeId id = 0; id < static_cast<NodeId>(n); ++id) {
        if (fits(nodes_[id], bit, asked) && !excluded(exclude, id)) scratch_.push_back(id);
      }
      // Partial Fisher-Yates over the eligible list for the draws still missing.
      auto eligible = static_cast<uint32_t>(scratch_.size());
      for (uint32_t i = 0; i < eligible && found < k; ++i) {
        uint32_t j = i + randomBelow(eligible - i);
        std::swap(scratch_[i], scratch_[j]);
        NodeId id = scratch_[i];
        bool seen = false;
        for (int s = 0; s < found; ++s) seen = seen || sampled[s] == id;
        if (seen) continue;
        sampled[found++] = id;
        consider(id);
      }
    }
  }
  if (best < 0) return nothingFits(request, bit, exclude);
  Node& node = nodes_[best];
  node.in_flight_milli += milli;
  node.in_flight_memory += memory;
  node.in_flight_cores += cores;
  node.in_flight += 1;
  return Ticket{best, milli, memory, cores};
}

void ClusterPlacer::confirm(const Ticket& ticket, bool ok) {
  std::lock_guard lock(mu_);
  if (ticket.node < 0 || ticket.node >= static_cast<NodeId>(nodes_.size())) return;
  Node& node = nodes_[ticket.node];
  node.in_flight_milli -= ticket.milli_cpus;
  node.in_flight_memory -= ticket.memory_bytes;
  node.in_flight_cores -= ticket.dedicated_cores;
  node.in_flight -= 1;
  if (!ok) return;
  // Committed from now on, until the node's next report (which then includes it) replaces the books.
  NodeAdmission& a = node.admission;
  a.memory_committed_bytes += ticket.memory_bytes;
  a.cpu_committed += static_cast<double>(ticket.milli_cpus) / 1000.0;
  if (a.free_sandboxes >= 0) a.free_sandboxes = std::max<int64_t>(0, a.free_sandboxes - 1);
  if (a.free_dedicated_cores >= 0) {
    a.free_dedicated_cores = std::max<int64_t>(0, a.free_dedicated_cores - ticket.dedicated_cores);
  }
  node.sandboxes += 1;
}

void ClusterPlacer::release(NodeId id, double cpus, int64_t memory_bytes) {
  std::lock_guard lock(mu_);
  if (id < 0 || id >= static_cast<NodeId>(nodes_.size())) return;
  Node& node = nodes_[id];
  NodeAdmission& a = node.admission;
  a.cpu_committed = std::max(0.0, a.cpu_committed - cpus);
  a.memory_committed_bytes = std::max<int64_t>(0, a.memory_committed_bytes - memory_bytes);
  if (a.free_sandboxes >= 0) a.free_sandboxes += 1;
  node.sandboxes = std::max<int64_t>(0, node.sandboxes - 1);
}

namespace {
Error unknownNode(NodeId id) { return Error::notFound("no node with id " + std::to_string(id)); }
}  // namespace

Status ClusterPlacer::setHealthy(NodeId id, bool healthy) {
  std::lock_guard lock(mu_);
  if (id < 0 || id >= static_cast<NodeId>(nodes_.size())) return unknownNode(id);
  nodes_[id].healthy = healthy;
  return okStatus();
}

Status ClusterPlacer::setDraining(NodeId id, bool draining) {
  std::lock_guard lock(mu_);
  if (id < 0 || id >= static_cast<NodeId>(nodes_.size())) return unknownNode(id);
  nodes_[id].draining = draining;
  return okStatus();
}

Status ClusterPlacer::setAdmission(NodeId id, const NodeAdmission& admission, int64_t sandboxes,
                                   std::string_view closed_reason) {
  if (!(admission.memory_ratio >= 0) || !(admission.cpu_ratio >= 0) || !(admission.cpus >= 0)) {
    return Error::invalid("admission ratios and capacities must be >= 0");
  }
  std::lock_guard lock(mu_);
  if (id < 0 || id >= static_cast<NodeId>(nodes_.size())) return unknownNode(id);
  Node& node = nodes_[id];
  node.known = true;
  node.admission = admission;
  node.closed_reason.assign(closed_reason);
  node.sandboxes = std::max<int64_t>(0, sandboxes);
  return okStatus();
}

NodeLoad ClusterPlacer::loadLocked(const Node& node) const {
  NodeLoad load;
  load.name = node.name;
  load.healthy = node.healthy;
  load.draining = node.draining;
  load.capacity_cpus = static_cast<double>(node.cap_milli) / 1000.0;
  load.capacity_memory = node.cap_memory;
  load.committed_cpus = node.admission.cpu_committed;
  load.committed_memory = node.admission.memory_committed_bytes;
  load.in_flight_cpus = static_cast<double>(node.in_flight_milli) / 1000.0;
  load.in_flight_memory = node.in_flight_memory;
  load.in_flight = node.in_flight;
  load.sandboxes = node.sandboxes;
  double cpu = node.cap_milli > 0
                   ? (load.committed_cpus + load.in_flight_cpus) * 1000.0 / static_cast<double>(node.cap_milli)
                   : 0;
  double mem = node.cap_memory > 0 ? static_cast<double>(load.committed_memory + load.in_flight_memory) /
                                         static_cast<double>(node.cap_memory)
                                   : 0;
  load.utilisation = std::max(cpu, mem);
  load.admission_known = node.known;
  load.admission = node.admission;
  load.closed_reason = node.closed_reason;
  return load;
}

Result<NodeLoad> ClusterPlacer::load(NodeId id) const {
  std::lock_guard lock(mu_);
  if (id < 0 || id >= static_cast<NodeId>(nodes_.size())) return unknownNode(id);
  return loadLocked(nodes_[id]);
}

std::vector<NodeLoad> ClusterPlacer::loads() const {
  std::lock_guard lock(mu_);
  std::vector<NodeLoad> out;
  out.reserve(nodes_.size());
  for (const auto& node : nodes_) out.push_back(loadLocked(node));
  return out;
}

std::string ClusterPlacer::name(NodeId id) const {
  std::lock_guard lock(mu_);
  if (id < 0 || id >= static_cast<NodeId>(nodes_.size())) return "";
  return nodes_[id].name;
}

// The slow, rare path: say exactly why nothing fits, so the user sees more than "no capacity".
Error ClusterPlacer::nothingFits(const ClusterRequest& request, uint64_t bit,
                                 const std::vector<NodeId>& exclude) const {
  std::string what = "no node can take a sandbox of " + cpusText(request.cpus) + " CPUs and " +
                     formatBytes(request.memory_bytes) + (request.latency ? " (latency" : " (batch") + ", backend '" +
                     std::string(request.backend) + "')";
  if (bit == ~0ULL) {
    std::string known;
    for (const auto& name : backend_names_) known += (known.empty() ? "" : ", ") + name;
    return Error(ErrorCode::kResourceExhausted,
                 what + ": no node runs that backend (known: " + (known.empty() ? "none" : known) + ")");
  }
  const AdmissionRequest asked{request.memory_bytes, request.cpus, request.latency};
  int unhealthy = 0, draining = 0, no_backend = 0, full = 0, closed = 0, refused = 0;
  const Node* roomiest = nullptr;
  double roomiest_load = 0;
  const Node* first_closed = nullptr;
  for (NodeId id = 0; id < static_cast<NodeId>(nodes_.size()); ++id) {
    const Node& node = nodes_[id];
    if (excluded(exclude, id)) {
      ++refused;
    } else if (!node.healthy) {
      ++unhealthy;
    } else if (node.draining) {
      ++draining;
    } else if (bit != 0 && (node.backends & bit) == 0) {
      ++no_backend;
    } else if (!node.admission.admitting) {
      ++closed;
      if (first_closed == nullptr) first_closed = &node;
    } else {
      ++full;
      double load = admissionLoad(withInFlight(node));
      if (roomiest == nullptr || load < roomiest_load) {
        roomiest_load = load;
        roomiest = &node;
      }
    }
  }
  std::string why = what + ": of " + std::to_string(nodes_.size()) + " nodes " + std::to_string(full) + " are full";
  if (closed) why += ", " + std::to_string(closed) + " not admitting";
  if (unhealthy) why += ", " + std::to_string(unhealthy) + " unhealthy";
  if (draining) why += ", " + std::to_string(draining) + " draining";
  if (no_backend) why += ", " + std::to_string(no_backend) + " lack the backend";
  if (refused) why += ", " + std::to_string(refused) + " already refused it";
  // In the node's own words (placement/Admission.h), in flight counted.
  if (roomiest != nullptr) {
    NodeAdmission a = withInFlight(*roomiest);
    why += "; the most room is on " + roomiest->name + ": " +
           explainRefusal(admissionRefusal(a, asked), a, asked, roomiest->closed_reason);
  } else if (first_closed != nullptr) {
    why += "; " + first_closed->name + ": " +
           explainRefusal(AdmissionRefusal::kClosed, first_closed->admission, asked, first_closed->closed_reason);
  }
  return Error(ErrorCode::kResourceExhausted, why);
}

}  // namespace dsec::placement
