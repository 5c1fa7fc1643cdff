// Placement inside one node. Latency-sensitive sandboxes get dedicated whole cores inside one NUMA domain (one
// L3 group when they fit) with their memory bound there; best-effort sandboxes share the pool of cores nobody
// owns and run SCHED_IDLE with a low CPU weight, so they soak up idle cycles without delaying latency work.
// The placer also keeps the node's admission books (committed CPU and memory against capacity times the
// overcommit ratios, per node and per NUMA domain); the density controller moves the ratios.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "dsec/common/Result.h"
#include "dsec/placement/Binder.h"
#include "dsec/placement/NodeModel.h"

namespace dsec::placement {

enum class Qos { kLatency, kBatch };
const char* qosName(Qos qos);
// "latency" | "batch" (the pydsec and HTTP API spelling).
Result<Qos> parseQos(const std::string& name);

struct SandboxRequest {
  std::string id;
  Qos qos = Qos::kBatch;
  double cpus = 1;           // CPUs as Slurm counts them (PUs); a latency sandbox gets ceil(cpus / SMT) cores
  int64_t memory_bytes = 0;  // 0 = no memory commitment
};

struct Placement {
  Qos qos = Qos::kBatch;
  std::string cpuset;           // list format for cpuset.cpus / sched_setaffinity
  std::vector<int> numa_nodes;  // NUMA OS indices its memory may use
  std::string mems;             // the same in list format, for cpuset.mems
  int sched_policy = 0;         // SCHED_IDLE (batch) or SCHED_OTHER (latency)
  uint64_t cpu_weight = 100;    // cgroup v2 cpu.weight scale (1..10000, default 100)
  std::vector<int> cores;       // dedicated logical cores (latency only)
};

struct NodePlacerOptions {
  // Cores that always stay in the shared pool (node agent, batch work): a latency request that would take
  // the pool below this is refused.
  int min_shared_cores = 1;
  // Admission: committed <= capacity * ratio. The density controller moves these.
  double cpu_overcommit = 1.0;
  double memory_overcommit = 1.0;
  uint64_t batch_cpu_weight = 10;      // low: best effort yields to everything else in the pool
  uint64_t latency_cpu_weight = 1000;  // high: wins against the node's own helpers on its cores
};

// The books of one NUMA domain.
struct NumaUsage {
  int os_index = 0;
  int cores = 0;
  int dedicated_cores = 0;
  double committed_cpus = 0;  // latency sandboxes bound here plus this domain's share of batch
  int64_t committed_memory = 0;
  int64_t memory_bytes = 0;
};

struct NodeUsage {
  int latency_sandboxes = 0;
  int batch_sandboxes = 0;
  int dedicated_cores = 0;
  int shared_cores = 0;
  double committed_cpus = 0;
  int64_t committed_memory = 0;
  double cpu_capacity = 0;      // PUs * cpu_overcommit
  int64_t memory_capacity = 0;  // memory * memory_overcommit (0 = unknown, not checked)
};

class NodePlacer {
 public:
  // binder may be null (accounting only, as in the simulated cell); otherwise bind() applies placements and a
  // change of the shared pool re-binds every bound batch sandbox to the new pool.
  NodePlacer(NodeModel model, NodePlacerOptions options, Binder* binder = nullptr);

  // Admits and places a sandbox, or refuses it with kResourceExhausted and why; kAlreadyExists for a known id.
  Result<Placement> place(const SandboxRequest& request);
  // Binds a placed sandbox's processes (its cgroup, or a process) through the binder and remembers the target
  // for later pool changes.
  Status bind(const std::string& id, const BindTarget& target);
  // Gives back its cores and commitments (sandbox destroyed). kNotFound for an unknown id.
  Status release(const std::string& id);

  Result<Placement> placementOf(const std::string& id) const;
  std::string sharedCpuset() const;
  NodeUsage usage() const;
  std::vector<NumaUsage> numaUsage() const;
  void setOvercommit(double cpu_ratio, double memory_ratio);
  const NodeModel& model() const { return model_; }

 private:
  struct Entry {
    SandboxRequest request;
    Placement placement;
    int numa = -1;  // latency only
    std::optional<BindTarget> target;
  };
  Result<Placement> placeLatency(const SandboxRequest& request, int& numa_out);
  // The NUMA domain a latency sandbox needing `needed` whole cores goes to; kResourceExhausted when none fits.
  Result<int> latencyDomainLocked(const SandboxRequest& request, int needed) const;
  // `needed` free cores of the domain (sorted), spanning as few L3 groups as it can.
  std::vector<int> freeCoresOfDomainLocked(const NumaDomain& domain, int needed) const;
  int freeCoresInLocked(const std::vector<int>& cores) const;
  Placement batchPlacementLocked() const;
  void recomputePoolLocked();
  Status applyLocked(const Placement& placement, const BindTarget& target);
  Status rebindBatchLocked();
  int freeCoresLocked() const;

  NodeModel model_;
  NodePlacerOptions options_;
  Binder* binder_;
  mutable std::mutex mu_;
  std::vector<bool> core_taken_;              // by logical core
  std::vector<int> numa_dedicated_;           // dedicated cores per domain
  std::vector<double> numa_latency_cpus_;     // committed CPUs of latency sandboxes per domain
  std::vector<int64_t> numa_latency_memory_;  // committed memory of latency sandboxes per domain
  double batch_cpus_ = 0;
  int64_t batch_memory_ = 0;
  double total_cpus_ = 0;
  int64_t total_memory_ = 0;
  int dedicated_ = 0;
  std::string shared_cpuset_;  // cached: recomputed only when dedicated cores change
  std::string all_mems_;
  std::map<std::string, Entry> sandboxes_;
};

}  // namespace dsec::placement
