#include "dsec/placement/NodePlacer.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"

namespace dsec::placement {

namespace {

std::string cpusText(double cpus) {
  std::ostringstream out;
  out << cpus;
  return out.str();
}

}  // namespace

const char* qosName(Qos qos) { return qos == Qos::kLatency ? "latency" : "batch"; }

Result<Qos> parseQos(const std::string& name) {
  if (name == "latency") return Qos::kLatency;
  if (name == "batch" || name.empty()) return Qos::kBatch;
  return Error::invalid("unknown qos '" + name + "' (expected latency or batch)");
}

NodePlacer::NodePlacer(NodeModel model, NodePlacerOptions options, Binder* binder)
    : model_(std::move(model)), options_(options), binder_(binder) {
  core_taken_.assign(model_.cores().size(), false);
  numa_dedicated_.assign(model_.numaDomains().size(), 0);
  numa_latency_cpus_.assign(model_.numaDomains().size(), 0);
  numa_latency_memory_.assign(model_.numaDomains().size(), 0);
  std::vector<int> all;
  for (const auto& domain : model_.numaDomains()) all.push_back(domain.index);
  all_mems_ = model_.memsOf(all);
  recomputePoolLocked();
}

int NodePlacer::freeCoresLocked() const { return static_cast<int>(model_.cores().size()) - dedicated_; }

void NodePlacer::recomputePoolLocked() {
  std::vector<int> cores;
  for (size_t c = 0; c < core_taken_.size(); ++c) {
    if (!core_taken_[c]) cores.push_back(static_cast<int>(c));
  }
  shared_cpuset_ = model_.cpusetOfCores(cores);
}

Placement NodePlacer::batchPlacementLocked() const {
  Placement p;
  p.qos = Qos::kBatch;
  p.cpuset = shared_cpuset_;
  for (const auto& domain : model_.numaDomains()) p.numa_nodes.push_back(domain.os_index);
  p.mems = all_mems_;
  p.sched_policy = SCHED_IDLE;
  p.cpu_weight = options_.batch_cpu_weight;
  return p;
}

Result<Placement> NodePlacer::place(const SandboxRequest& request) {
  if (request.id.empty()) return Error::invalid("sandbox id is empty");
  if (!(request.cpus > 0) || request.memory_bytes < 0) {
    return Error::invalid("sandbox " + request.id + ": cpus must be > 0 and memory >= 0");
  }
  std::lock_guard lock(mu_);
  if (sandboxes_.count(request.id) != 0) {
    return Error(ErrorCode::kAlreadyExists, "sandbox " + request.id + " is already placed on this node");
  }
  // Admission against capacity times the overcommit ratios (the density controller's knobs).
  double cpu_capacity = model_.puCount() * options_.cpu_overcommit;
  if (total_cpus_ + request.cpus > cpu_capacity + 1e-9) {
    return Error(ErrorCode::kResourceExhausted,
                 "node full: " + cpusText(total_cpus_) + " of " + cpusText(cpu_capacity) + " CPUs committed (" +
                     std::to_string(model_.puCount()) + " PUs x overcommit " + cpusText(options_.cpu_overcommit) +
                     "), sandbox " + request.id + " asks " + cpusText(request.cpus));
  }
  int64_t memory = model_.memoryBytes();
  auto memory_capacity = static_cast<int64_t>(static_cast<double>(memory) * options_.memory_overcommit);
  if (memory > 0 && total_memory_ + request.memory_bytes > memory_capacity) {
    return Error(ErrorCode::kResourceExhausted, "node full: " + formatBytes(total_memory_) + " of " +
                                                    formatBytes(memory_capacity) + " memory committed, sandbox " +
                                                    request.id + " asks " + formatBytes(request.memory_bytes));
  }

  Entry entry;
  entry.request = request;
  if (request.qos == Qos::kLatency) {
    DSEC_ASSIGN_OR_RETURN(entry.placement, placeLatency(request, entry.numa));
  } else {
    entry.placement = batchPlacementLocked();
    batch_cpus_ += request.cpus;
    batch_memory_ += request.memory_bytes;
  }
  total_cpus_ += request.cpus;
  total_memory_ += request.memory_bytes;
  Placement result = entry.placement;
  sandboxes_.emplace(request.id, std::move(entry));
  if (request.qos == Qos::kLatency) {
    recomputePoolLocked();
    Status rebound = rebindBatchLocked();
    if (!rebound.ok()) DSEC_LOG(kWarn, "placement") << "shrinking the shared pool: " << rebound.error().toString();
  }
  return result;
}

Result<Placement> NodePlacer::placeLatency(const SandboxRequest& request, int& numa_out) {
  const auto& cores = model_.cores();
  // Whole cores: sharing a core's SMT siblings with anyone else is the jitter latency sandboxes pay to avoid
  // (and there is no core scheduling to make siblings safe).
  int smt = std::max(1, model_.puCount() / static_cast<int>(cores.size()));
  int needed = std::max(1, static_cast<int>(std::ceil(request.cpus / smt - 1e-9)));
  int free_total = freeCoresLocked();
  if (free_total - needed < options_.min_shared_cores) {
    return Error(ErrorCode::kResourceExhausted,
                 "cannot dedicate " + std::to_string(needed) + " cores to latency sandbox " + request.id + ": " +
                     std::to_string(free_total) + " cores are free and " + std::to_string(options_.min_shared_cores) +
                     " must stay shared for batch sandboxes");
  }
  DSEC_ASSIGN_OR_RETURN(int best, latencyDomainLocked(request, needed));
  const NumaDomain& domain = model_.numaDomains()[best];
  std::vector<int> chosen = freeCoresOfDomainLocked(domain, needed);
  for (int c : chosen) core_taken_[c] = true;
  dedicated_ += needed;
  numa_dedicated_[best] += needed;
  numa_latency_cpus_[best] += request.cpus;
  numa_latency_memory_[best] += request.memory_bytes;
  numa_out = best;

  Placement p;
  p.qos = Qos::kLatency;
  p.cores = chosen;
  p.cpuset = model_.cpusetOfCores(chosen);
  p.numa_nodes = {domain.os_index};
  p.mems = std::to_string(domain.os_index);
  p.sched_policy = SCHED_OTHER;
  p.cpu_weight = options_.latency_cpu_weight;
  return p;
}

int NodePlacer::freeCoresInLocked(const std::vector<int>& list) const {
  int n = 0;
  for (int c : list) n += core_taken_[c] ? 0 : 1;
  return n;
}

Result<int> NodePlacer::latencyDomainLocked(const SandboxRequest& request, int needed) const {
  int best = -1;
  bool best_l3_fit = false;
  double best_load = 0;
  std::string per_domain;
  for (const auto& domain : model_.numaDomains()) {
    int free = freeCoresInLocked(domain.cores);
    per_domain += (per_domain.empty() ? "" : ", ") + std::to_string(domain.os_index) + ":" + std::to_string(free);
    if (free < needed) continue;
    if (domain.memory_bytes > 0 &&
        numa_latency_memory_[domain.index] + request.memory_bytes >
            static_cast<int64_t>(static_cast<double>(domain.memory_bytes) * options_.memory_overcommit)) {
      continue;
    }
    bool l3_fit = false;
    for (int g : domain.l3_groups) l3_fit = l3_fit || freeCoresInLocked(model_.l3Groups()[g].cores) >= needed;
    // Prefer a domain where the sandbox fits in one L3 group, then the least dedicated one (spreads memory
    // bandwidth and leaves room in every domain).
    double load = static_cast<double>(numa_dedicated_[domain.index]) / static_cast<double>(domain.cores.size());
    if (best < 0 || (l3_fit && !best_l3_fit) || (l3_fit == best_l3_fit && load < best_load)) {
      best = domain.index;
      best_l3_fit = l3_fit;
      best_load = load;
    }
  }
  if (best < 0) {
    return Error(ErrorCode::kResourceExhausted, "no NUMA domain has " + std::to_string(needed) +
                                                    " free cores (and room for " + formatBytes(request.memory_bytes) +
                                                    ") for latency sandbox " + request.id +
                                                    "; free cores per domain: " + per_domain);
  }
  return best;
}

std::vector<int> NodePlacer::freeCoresOfDomainLocked(const NumaDomain& domain, int needed) const {
  // Best fit among L3 groups that can hold it all; otherwise fill from the emptiest groups to span few.
  std::vector<std::pair<int, int>> groups;  // (free, group)
  for (int g : domain.l3_groups) groups.emplace_back(freeCoresInLocked(model_.l3Groups()[g].cores), g);
  std::sort(groups.begin(), groups.end(), [&](auto a, auto b) {
    bool a_fit = a.first >= needed;
    bool b_fit = b.first >= needed;
    if (a_fit != b_fit) return a_fit;
    return a_fit ? a.first < b.first : a.first > b.first;
  });
  std::vector<int> chosen;
  for (auto [free, g] : groups) {
    for (int c : model_.l3Groups()[g].cores) {
      if (static_cast<int>(chosen.size()) == needed) break;
      if (!core_taken_[c]) chosen.push_back(c);
    }
    if (static_cast<int>(chosen.size()) == needed) break;
  }
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

Status NodePlacer::applyLocked(const Placement& placement, const BindTarget& target) {
  if (binder_ == nullptr) return okStatus();
  DSEC_TRY(binder_->bindCpus(target, placement.cpuset));
  // Batch memory may use every node, which is what a process has anyway; a cgroup still needs cpuset.mems
  // (v1 refuses tasks without it).
  if (placement.qos == Qos::kLatency || target.isCgroup()) DSEC_TRY(binder_->bindMemory(target, placement.mems));
  Status sched = binder_->setSchedPolicy(target, placement.sched_policy);
  // Without cgroup v2 cpu.idle the policy is set on the sandbox's first process by its spawner (inherited).
  if (!sched.ok() && !(target.isCgroup() && sched.error().code() == ErrorCode::kUnsupported)) return sched;
  return okStatus();
}

Status NodePlacer::bind(const std::string& id, const BindTarget& target) {
  std::lock_guard lock(mu_);
  auto it = sandboxes_.find(id);
  if (it == sandboxes_.end()) return Error::notFound("sandbox " + id + " is not placed on this node");
  Placement placement = it->second.request.qos == Qos::kBatch ? batchPlacementLocked() : it->second.placement;
  Status applied = applyLocked(placement, target);
  if (!applied.ok()) return applied.error().wrap("binding sandbox " + id);
  it->second.target = target;
  return okStatus();
}

Status NodePlacer::rebindBatchLocked() {
  if (binder_ == nullptr) return okStatus();
  Placement pool = batchPlacementLocked();
  Status first;
  for (auto& [id, entry] : sandboxes_) {
    if (entry.request.qos != Qos::kBatch || !entry.target) continue;
    Status cpus = binder_->bindCpus(*entry.target, pool.cpuset);
    if (!cpus.ok() && first.ok()) first = cpus.error().wrap("re-binding batch sandbox " + id);
  }
  return first;
}

Status NodePlacer::release(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = sandboxes_.find(id);
  if (it == sandboxes_.end()) return Error::notFound("sandbox " + id + " is not placed on this node");
  const Entry& entry = it->second;
  total_cpus_ -= entry.request.cpus;
  total_memory_ -= entry.request.memory_bytes;
  bool latency = entry.request.qos == Qos::kLatency;
  if (latency) {
    for (int c : entry.placement.cores) core_taken_[c] = false;
    int n = static_cast<int>(entry.placement.cores.size());
    dedicated_ -= n;
    numa_dedicated_[entry.numa] -= n;
    numa_latency_cpus_[entry.numa] -= entry.request.cpus;
    numa_latency_memory_[entry.numa] -= entry.request.memory_bytes;
  } else {
    batch_cpus_ -= entry.request.cpus;
    batch_memory_ -= entry.request.memory_bytes;
  }
  sandboxes_.erase(it);
  if (latency) {
    recomputePoolLocked();
    Status rebound = rebindBatchLocked();
    if (!rebound.ok()) DSEC_LOG(kWarn, "placement") << "growing the shared pool: " << rebound.error().toString();
  }
  return okStatus();
}

Result<Placement> NodePlacer::placementOf(const std::string& id) const {
  std::lock_guard lock(mu_);
  auto it = sandboxes_.find(id);
  if (it == sandboxes_.end()) return Error::notFound("sandbox " + id + " is not placed on this node");
  if (it->second.request.qos == Qos::kBatch) return batchPlacementLocked();
  return it->second.placement;
}

std::string NodePlacer::sharedCpuset() const {
  std::lock_guard lock(mu_);
  return shared_cpuset_;
}

NodeUsage NodePlacer::usage() const {
  std::lock_guard lock(mu_);
  NodeUsage u;
  for (const auto& [id, entry] : sandboxes_) {
    (entry.request.qos == Qos::kLatency ? u.latency_sandboxes : u.batch_sandboxes) += 1;
  }
  u.dedicated_cores = dedicated_;
  u.shared_cores = freeCoresLocked();
  u.committed_cpus = total_cpus_;
  u.committed_memory = total_memory_;
  u.cpu_capacity = model_.puCount() * options_.cpu_overcommit;
  u.memory_capacity = static_cast<int64_t>(static_cast<double>(model_.memoryBytes()) * options_.memory_overcommit);
  return u;
}

std::vector<NumaUsage> NodePlacer::numaUsage() const {
  std::lock_guard lock(mu_);
  std::vector<NumaUsage> out;
  // Batch memory is not bound, so its commitments are attributed to domains by their share of shared cores
  // (where its threads run, and so where first-touch puts most of its pages).
  int shared = std::max(1, freeCoresLocked());
  for (const auto& domain : model_.numaDomains()) {
    NumaUsage u;
    u.os_index = domain.os_index;
    u.cores = static_cast<int>(domain.cores.size());
    u.dedicated_cores = numa_dedicated_[domain.index];
    double share = static_cast<double>(u.cores - u.dedicated_cores) / shared;
    u.committed_cpus = numa_latency_cpus_[domain.index] + batch_cpus_ * share;
    u.committed_memory = numa_latency_memory_[domain.index] + std::llround(static_cast<double>(batch_memory_) * share);
    u.memory_bytes = domain.memory_bytes;
    out.push_back(u);
  }
  return out;
}

void NodePlacer::setOvercommit(double cpu_ratio, double memory_ratio) {
  std::lock_guard lock(mu_);
  if (cpu_ratio > 0) options_.cpu_overcommit = cpu_ratio;
  if (memory_ratio > 0) options_.memory_overcommit = memory_ratio;
}

}  // namespace dsec::placement
