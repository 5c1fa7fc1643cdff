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

void ClusterPlacer::recomputeLimits(Node& node) {
  double cpu_ratio = node.cpu_ratio > 0 ? node.cpu_ratio : options_.cpu_overcommit;
  double memory_ratio = node.memory_ratio > 0 ? node.memory_ratio : options_.memory_overcommit;
  node.limit_milli = static_cast<int64_t>(std::floor(static_cast<double>(node.cap_milli) * cpu_ratio));
  node.limit_memory = static_cast<int64_t>(std::floor(static_cast<double>(node.cap_memory) * memory_ratio));
  node.inv_limit_milli = node.limit_milli > 0 ? 1.0 / static_cast<double>(node.limit_milli) : 0;
  node.inv_limit_memory = node.limit_memory > 0 ? 1.0 / static_cast<double>(node.limit_memory) : 0;
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
  node.cpu_ratio = info.cpu_overcommit;
  node.memory_ratio = info.memory_overcommit;
  recomputeLimits(node);
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

bool ClusterPlacer::fits(const Node& node, uint64_t backend_bit, int64_t milli, int64_t memory) const {
  return node.healthy && !node.draining && (backend_bit == 0 || (node.backends & backend_bit) != 0) &&
         node.used_milli + milli <= node.limit_milli &&
         (node.limit_memory == 0 || node.used_memory + memory <= node.limit_memory);
}

double ClusterPlacer::score(const Node& node, int64_t /*milli*/, int64_t /*memory*/) const {
  // The scarcer of the two resources decides: a node full of memory is full whatever its CPUs say.
  return std::max(static_cast<double>(node.used_milli) * node.inv_limit_milli,
                  static_cast<double>(node.used_memory) * node.inv_limit_memory);
}

Result<Ticket> ClusterPlacer::place(const ClusterRequest& request, const std::vector<NodeId>& exclude) {
  if (!(request.cpus > 0) || request.memory_bytes < 0 || !std::isfinite(request.cpus)) {
    return Error::invalid("placement request needs cpus > 0 and memory >= 0 (got " + cpusText(request.cpus) +
                          " CPUs, " + std::to_string(request.memory_bytes) + " bytes)");
  }
  const auto milli = static_cast<int64_t>(std::llround(request.cpus * 1000.0));
  const int64_t memory = request.memory_bytes;
  std::lock_guard lock(mu_);
  uint64_t bit = 0;
  if (!lookupBackend(request.backend, bit)) return nothingFits(request, ~0ULL, exclude);
  const auto n = static_cast<uint32_t>(nodes_.size());
  if (n == 0) return Error(ErrorCode::kResourceExhausted, "no node has registered yet");

  NodeId best = -1;
  double best_score = std::numeric_limits<double>::infinity();
  auto consider = [&](NodeId id) {
    double s = score(nodes_[id], milli, memory);
    if (s < best_score) {
      best_score = s;
      best = id;
    }
  };

  if (options_.strategy == Strategy::kLeastLoaded) {
    for (NodeId id = 0; id < static_cast<NodeId>(n); ++id) {
      if (fits(nodes_[id], bit, milli, memory) && !excluded(exclude, id)) consider(id);
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
      if (seen || !fits(nodes_[id], bit, milli, memory) || excluded(exclude, id)) continue;
      sampled[found++] = id;
      consider(id);
    }
    if (found < k) {
      // Slow path (a nearly full or mostly unhealthy cell): sample among all eligible nodes exactly.
      scratch_.clear();
      for (NodeId id = 0; id < static_cast<NodeId>(n); ++id) {
        if (fits(nodes_[id], bit, milli, memory) && !excluded(exclude, id)) scratch_.push_back(id);
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
  node.used_milli += milli;
  node.used_memory += memory;
  node.in_flight_milli += milli;
  node.in_flight_memory += memory;
  node.in_flight += 1;
  return Ticket{best, milli, memory};
}

void ClusterPlacer::confirm(const Ticket& ticket, bool ok) {
  std::lock_guard lock(mu_);
  if (ticket.node < 0 || ticket.node >= static_cast<NodeId>(nodes_.size())) return;
  Node& node = nodes_[ticket.node];
  node.in_flight_milli -= ticket.milli_cpus;
  node.in_flight_memory -= ticket.memory_bytes;
  node.in_flight -= 1;
  if (ok) {
    node.sandboxes += 1;
  } else {
    node.used_milli -= ticket.milli_cpus;
    node.used_memory -= ticket.memory_bytes;
  }
}

void ClusterPlacer::release(NodeId id, double cpus, int64_t memory_bytes) {
  std::lock_guard lock(mu_);
  if (id < 0 || id >= static_cast<NodeId>(nodes_.size())) return;
  Node& node = nodes_[id];
  node.used_milli = std::max(node.in_flight_milli, node.used_milli - static_cast<int64_t>(std::llround(cpus * 1000.0)));
  node.used_memory = std::max(node.in_flight_memory, node.used_memory - memory_bytes);
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

Status ClusterPlacer::setCommitted(NodeId id, double cpus, int64_t memory_bytes, int64_t sandboxes) {
  std::lock_guard lock(mu_);
  if (id < 0 || id >= static_cast<NodeId>(nodes_.size())) return unknownNode(id);
  Node& node = nodes_[id];
  node.used_milli = std::llround(cpus * 1000.0) + node.in_flight_milli;
  node.used_memory = memory_bytes + node.in_flight_memory;
  node.sandboxes = sandboxes;
  return okStatus();
}

Status ClusterPlacer::setOvercommit(NodeId id, double cpu_ratio, double memory_ratio) {
  std::lock_guard lock(mu_);
  if (id < 0 || id >= static_cast<NodeId>(nodes_.size())) return unknownNode(id);
  if (cpu_ratio < 0 || memory_ratio < 0) return Error::invalid("overcommit ratios must be >= 0");
  nodes_[id].cpu_ratio = cpu_ratio;
  nodes_[id].memory_ratio = memory_ratio;
  recomputeLimits(nodes_[id]);
  return okStatus();
}

NodeLoad ClusterPlacer::loadLocked(const Node& node) const {
  NodeLoad load;
  load.name = node.name;
  load.healthy = node.healthy;
  load.draining = node.draining;
  load.capacity_cpus = static_cast<double>(node.cap_milli) / 1000.0;
  load.capacity_memory = node.cap_memory;
  load.committed_cpus = static_cast<double>(node.used_milli - node.in_flight_milli) / 1000.0;
  load.committed_memory = node.used_memory - node.in_flight_memory;
  load.in_flight_cpus = static_cast<double>(node.in_flight_milli) / 1000.0;
  load.in_flight_memory = node.in_flight_memory;
  load.in_flight = node.in_flight;
  load.sandboxes = node.sandboxes;
  double cpu = node.cap_milli > 0 ? static_cast<double>(node.used_milli) / static_cast<double>(node.cap_milli) : 0;
  double mem = node.cap_memory > 0 ? static_cast<double>(node.used_memory) / static_cast<double>(node.cap_memory) : 0;
  load.utilisation = std::max(cpu, mem);
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
                     formatBytes(request.memory_bytes) + " (backend '" + std::string(request.backend) + "')";
  if (bit == ~0ULL) {
    std::string known;
    for (const auto& name : backend_names_) known += (known.empty() ? "" : ", ") + name;
    return Error(ErrorCode::kResourceExhausted,
                 what + ": no node runs that backend (known: " + (known.empty() ? "none" : known) + ")");
  }
  const auto milli = static_cast<int64_t>(std::llround(request.cpus * 1000.0));
  int unhealthy = 0, draining = 0, no_backend = 0, full = 0, refused = 0;
  const Node* roomiest = nullptr;
  double roomiest_free = -1;
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
    } else {
      ++full;
      double free = 1.0 - score(node, milli, request.memory_bytes);
      if (free > roomiest_free) {
        roomiest_free = free;
        roomiest = &node;
      }
    }
  }
  std::string why = what + ": of " + std::to_string(nodes_.size()) + " nodes " + std::to_string(full) + " are full";
  if (unhealthy) why += ", " + std::to_string(unhealthy) + " unhealthy";
  if (draining) why += ", " + std::to_string(draining) + " draining";
  if (no_backend) why += ", " + std::to_string(no_backend) + " lack the backend";
  if (refused) why += ", " + std::to_string(refused) + " already refused it";
  if (roomiest != nullptr) {
    why += "; the most room is on " + roomiest->name + " (" +
           cpusText(static_cast<double>(roomiest->limit_milli - roomiest->used_milli) / 1000.0) + " CPUs";
    if (roomiest->limit_memory > 0) why += ", " + formatBytes(roomiest->limit_memory - roomiest->used_memory);
    why += " free after overcommit)";
  }
  return Error(ErrorCode::kResourceExhausted, why);
}

}  // namespace dsec::placement
