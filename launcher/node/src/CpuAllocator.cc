#include "dsec/launcher/node/CpuAllocator.h"

#include <sched.h>

#include <cmath>

#include "dsec/common/Cgroup.h"
#include "dsec/common/Logging.h"
#include "dsec/placement/Binder.h"
#include "dsec/placement/NodePlacer.h"

namespace dsec::launcher {
namespace {

constexpr const char* kLog = "qos";
// Admission is the density controller's: the placer's own books must never refuse a sandbox.
constexpr double kNoAdmission = 1e6;  // x 1.5 TB still fits in int64
// Batch sandboxes without a CPU limit still need a positive figure in the placer's books.
constexpr double kUnlimitedBatchCpus = 0.01;

placement::Qos toPlacement(backends::CpuQos qos) {
  return qos == backends::CpuQos::kLatency ? placement::Qos::kLatency : placement::Qos::kBatch;
}

// Moves batch sandboxes' cgroups when the pool changes. A BindTarget's cgroup_dir is the sandbox id (the
// container backend names its cgroups so); the driver finds the cpuset directory on v1 or v2.
class SandboxCgroupBinder : public placement::Binder {
 public:
  explicit SandboxCgroupBinder(std::unique_ptr<CgroupDriver> driver) : driver_(std::move(driver)) {}

  Status bindCpus(const placement::BindTarget& target, const std::string& cpuset) override {
    return move(target, cpuset, "");
  }
  Status bindMemory(const placement::BindTarget& target, const std::string& mems) override {
    return move(target, "", mems);
  }
  // The container backend sets the policy (SCHED_IDLE on every process, cpu.idle on the cgroup).
  Status setSchedPolicy(const placement::BindTarget&, int) override {
    return Error(ErrorCode::kUnsupported, "scheduling policy is set by the container backend");
  }

 private:
  Status move(const placement::BindTarget& target, const std::string& cpus, const std::string& mems) {
    if (!target.isCgroup()) return Error::invalid("sandbox binder needs a cgroup target");
    auto cgroup = driver_->open(target.cgroup_dir);
    // Destroyed meanwhile (its release is on the way): nothing to move.
    if (!cgroup.ok() && cgroup.error().code() == ErrorCode::kNotFound) return okStatus();
    if (!cgroup.ok()) return cgroup.error();
    return (*cgroup)->setCpuset(cpus, mems);
  }

  std::unique_ptr<CgroupDriver> driver_;
};

}  // namespace

CpuReservation::CpuReservation(CpuAllocator* owner, std::string id, std::string cpus, std::string mems)
    : owner_(owner), id_(std::move(id)), cpus_(std::move(cpus)), mems_(std::move(mems)) {}

CpuReservation::CpuReservation(CpuReservation&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)),
      id_(std::move(other.id_)),
      cpus_(std::move(other.cpus_)),
      mems_(std::move(other.mems_)) {}

CpuReservation::~CpuReservation() {
  if (owner_ != nullptr) owner_->release(id_);
}

void CpuReservation::applyTo(backends::SandboxSpec& spec) const {
  spec.cpuset_cpus = cpus_;
  spec.cpuset_mems = mems_;
}

void CpuReservation::commit() {
  if (owner_ != nullptr) owner_->commit(id_);
  owner_ = nullptr;
}

CpuAllocator::CpuAllocator(const CpuAllocatorOptions& options) : options_(options) {
  if (!options_.enabled) {
    disabled_reason_ = "CPU QoS is off on this node";
    return;
  }
  auto model = placement::NodeModel::fromSpec(options_.topology);
  if (!model.ok()) {
    disabled_reason_ = "cannot read the node's topology: " + model.error().message();
    DSEC_LOG(kWarn, kLog) << disabled_reason_ << "; latency sandboxes will be refused";
    return;
  }
  if (options_.exclusive_pool) {
    auto driver = detectCgroupDriver(options_.cgroup_parent);
    if (driver.ok()) {
      binder_ = std::make_unique<SandboxCgroupBinder>(std::move(*driver));
    } else {
      DSEC_LOG(kWarn, kLog) << "batch sandboxes will not leave dedicated cores: " << driver.error().message();
    }
  }
  placement::NodePlacerOptions placer_options;
  placer_options.cpu_overcommit = kNoAdmission;
  placer_options.memory_overcommit = kNoAdmission;
  placer_ = std::make_unique<placement::NodePlacer>(std::move(*model), placer_options, binder_.get());
}

CpuAllocator::~CpuAllocator() = default;

Result<CpuReservation> CpuAllocator::reserve(const std::string& id, backends::CpuQos qos, double cpus) {
  if (!placer_) {
    if (qos == backends::CpuQos::kLatency) {
      return Error(ErrorCode::kResourceExhausted, "no dedicated cores for latency sandboxes: " + disabled_reason_);
    }
    return CpuReservation();
  }
  placement::SandboxRequest request;
  request.id = id;
  request.qos = toPlacement(qos);
  request.cpus = cpus > 0 ? cpus : kUnlimitedBatchCpus;
  auto placed = placer_->place(request);
  if (!placed.ok()) {
    if (placed.error().code() == ErrorCode::kResourceExhausted) {
      return Error(ErrorCode::kResourceExhausted, "latency sandbox needs dedicated cores: " + placed.error().message());
    }
    return placed.error();
  }
  // Without an exclusive pool batch cgroups keep the parent's cpuset (every core).
  bool pinned = qos == backends::CpuQos::kLatency || binder_ != nullptr;
  return CpuReservation(this, id, pinned ? placed->cpuset : "", pinned ? placed->mems : "");
}

void CpuAllocator::commit(const std::string& id) {
  if (!placer_ || !binder_) return;
  auto placed = placer_->placementOf(id);
  if (!placed.ok() || placed->qos != placement::Qos::kBatch) return;
  // Applies the pool as it is now (it may have shrunk since reserve) and follows it from now on.
  if (auto st = placer_->bind(id, placement::BindTarget::cgroup(id)); !st.ok()) {
    DSEC_LOG(kWarn, kLog) << "binding " << id << " to the shared pool: " << st.error().toString();
  }
}

Status CpuAllocator::moveCgroup(const std::string& id, const std::string& cpus, const std::string& mems) {
  auto driver = detectCgroupDriver(options_.cgroup_parent);
  if (!driver.ok()) return driver.error();
  DSEC_ASSIGN_OR_RETURN(auto cgroup, (*driver)->open(id));
  return cgroup->setCpuset(cpus, mems);
}

Status CpuAllocator::readopt(const std::string& id, backends::CpuQos qos, double cpus,
                             const std::string& recorded_cpus) {
  if (!placer_) return okStatus();
  DSEC_ASSIGN_OR_RETURN(CpuReservation held, reserve(id, qos, cpus));
  auto placed = placer_->placementOf(id);
  if (!placed.ok()) return placed.error();
  if (qos == backends::CpuQos::kLatency && placed->cpuset != recorded_cpus) {
    // The books were rebuilt in another order: the sandbox moves to the cores now booked for it, so no core is
    // ever dedicated twice.
    DSEC_LOG(kInfo, kLog) << "re-adopted latency sandbox " << id << " moves from cpus " << recorded_cpus << " to "
                          << placed->cpuset;
    DSEC_TRY(moveCgroup(id, placed->cpuset, placed->mems));
  }
  held.commit();
  return okStatus();
}

void CpuAllocator::release(const std::string& id) {
  if (!placer_) return;
  Status st = placer_->release(id);
  if (!st.ok() && st.error().code() != ErrorCode::kNotFound) {
    DSEC_LOG(kWarn, kLog) << "releasing cores of " << id << ": " << st.error().toString();
  }
}

CpuBooking CpuAllocator::bookingOf(const std::string& id) const {
  if (!placer_) return {};
  auto placed = placer_->placementOf(id);
  if (!placed.ok() || (placed->qos != placement::Qos::kLatency && !binder_)) return {};
  return {placed->cpuset, placed->mems};
}

CpuQosNodeInfo CpuAllocator::nodeInfo() const {
  CpuQosNodeInfo info;
  if (!placer_) {
    info.disabled_reason = disabled_reason_;
    return info;
  }
  auto usage = placer_->usage();
  const auto& model = placer_->model();
  info.enabled = true;
  info.exclusive_pool = binder_ != nullptr;
  info.cores = static_cast<int>(model.cores().size());
  info.numa_domains = static_cast<int>(model.numaDomains().size());
  info.dedicated_cores = usage.dedicated_cores;
  // What one more latency sandbox could get at most: the free cores above the pool's minimum.
  info.free_dedicated_cores = std::max(0, usage.shared_cores - 1);
  info.shared_cpuset = placer_->sharedCpuset();
  info.latency_sandboxes = usage.latency_sandboxes;
  info.batch_sandboxes = usage.batch_sandboxes;
  return info;
}

}  // namespace dsec::launcher
