// CPU QoS on a node (docs/qos.md): latency sandboxes get dedicated whole cores inside one NUMA domain (memory
// bound there) from placement::NodePlacer over the real machine's NodeModel; batch sandboxes share the pool of
// the other cores. With an exclusive pool (the default) the batch sandboxes' cgroups are moved off a core the
// moment it is dedicated, and back onto it when it is freed, so latency work never shares a core with batch
// work; scheduling policy and weight are the container backend's (SCHED_IDLE, cpu.idle, low weight).
// Admission by committed CPU and memory is the density controller's: the placer here only hands out cores.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "dsec/backends/Sandbox.h"
#include "dsec/common/Result.h"
#include "dsec/launcher/node/Infos.h"

namespace dsec::placement {
class NodePlacer;
class Binder;
}  // namespace dsec::placement

namespace dsec::launcher {

struct CpuAllocatorOptions {
  bool enabled = true;         // false: no cpusets at all (QoS off on this node)
  bool exclusive_pool = true;  // batch cpusets exclude dedicated cores (else they span every core)
  std::string cgroup_parent;   // where the container backend puts sandbox cgroups (named by sandbox id)
  std::string topology;        // NodeModel::fromSpec ("" = this machine)
};

class CpuAllocator;

// Cores held for one sandbox being created: released when dropped unless commit() was called.
class CpuReservation {
 public:
  CpuReservation() = default;
  CpuReservation(CpuAllocator* owner, std::string id, std::string cpus, std::string mems);
  CpuReservation(CpuReservation&& other) noexcept;
  CpuReservation& operator=(CpuReservation&&) = delete;
  CpuReservation(const CpuReservation&) = delete;
  ~CpuReservation();
  // The cpuset the backend should create the sandbox's cgroup with.
  void applyTo(backends::SandboxSpec& spec) const;
  // The sandbox exists: keep the cores, and (batch) follow the pool from now on.
  void commit();

 private:
  CpuAllocator* owner_ = nullptr;
  std::string id_, cpus_, mems_;
};

class CpuAllocator {
 public:
  // Never fails: a node whose topology cannot be read runs without dedicated cores (latency creates then get
  // 429 with the reason).
  explicit CpuAllocator(const CpuAllocatorOptions& options);
  ~CpuAllocator();

  // Latency: ceil(cpus) whole cores in one NUMA domain, or kResourceExhausted saying why. Batch: the pool.
  Result<CpuReservation> reserve(const std::string& id, backends::CpuQos qos, double cpus);
  // After an agent restart: books an adopted sandbox again, on the cores recorded for it when they are still
  // free, else on new ones (and moves its cgroup there). Errors are for the log: the sandbox keeps running.
  Status readopt(const std::string& id, backends::CpuQos qos, double cpus, const std::string& recorded_cpus);
  void release(const std::string& id);
  CpuBooking bookingOf(const std::string& id) const;
  // The node's books: cores, dedicated and free ones, the shared pool, sandboxes by QoS.
  CpuQosNodeInfo nodeInfo() const;

 private:
  friend class CpuReservation;
  void commit(const std::string& id);
  Status moveCgroup(const std::string& id, const std::string& cpus, const std::string& mems);

  CpuAllocatorOptions options_;
  std::string disabled_reason_;
  std::unique_ptr<placement::Binder> binder_;
  std::unique_ptr<placement::NodePlacer> placer_;
};

}  // namespace dsec::launcher
