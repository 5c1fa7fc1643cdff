// The node agent's density loop (docs/density.md): every interval it samples the node (memory in use, PSI,
// the sandboxes' parent cgroup, each sandbox's idleness and usage), feeds placement::DensityController and
// executes its actions through the backend (reclaim, pause with paused_by "density", resume). It also
// answers admission for creates (placement/Admission.h: committed memory and CPUs against capacity x the
// controller's ratios, and pressure) and makes all of it visible: each sandbox's SandboxDensity (actions and
// events, OOM kills), the node's DensityNodeInfo and AdmissionInfo (Infos.h) and /metrics (dsec_density_*).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dsec/common/Pressure.h"
#include "dsec/common/Result.h"
#include "dsec/launcher/node/Infos.h"
#include "dsec/placement/Admission.h"
#include "dsec/placement/DensityController.h"

namespace dsec::launcher {

struct SandboxRecord;
struct CreateParams;

// What the density loop needs of the node it runs on (the node agent implements it).
class DensityHost {
 public:
  virtual ~DensityHost() = default;
  // Every live record. `with_sums` gets the records' committed memory and CPUs while the registry cannot
  // change, so that the loop's books and the registry agree (a create that lands later commits its ticket).
  virtual std::vector<std::shared_ptr<SandboxRecord>> sampleRegistry(
      const std::function<void(int64_t memory, double cpus)>& with_sums) = 0;
  virtual std::shared_ptr<SandboxRecord> findRecord(const std::string& id) = 0;
  // Saves a record after the loop paused or resumed its sandbox (the caller holds the record's mutex).
  virtual Status saveRecord(SandboxRecord& record) = 0;
  virtual const std::string& nodeName() const = 0;
  virtual int64_t nodeMemoryBytes() const = 0;
};

class DensityLoop {
 public:
  // Holds a create's memory and CPUs as committed from admission until the sandbox is in the registry.
  class Ticket {
   public:
    Ticket(DensityLoop* loop, int64_t memory, double cpus) : loop_(loop), memory_(memory), cpus_(cpus) {}
    Ticket(Ticket&& other) noexcept : loop_(other.loop_), memory_(other.memory_), cpus_(other.cpus_) {
      other.loop_ = nullptr;
    }
    Ticket& operator=(Ticket&&) = delete;
    Ticket(const Ticket&) = delete;
    ~Ticket();
    // The sandbox is in the registry: its share stays committed until the next tick re-sums the registry.
    void commit();

   private:
    DensityLoop* loop_;
    int64_t memory_;
    double cpus_;
  };

  DensityLoop(DensityHost* host, const placement::DensityConfig& config, int64_t memory_capacity_bytes,
              double interval_seconds, const std::string& cgroup_parent);
  ~DensityLoop();
  DensityLoop(const DensityLoop&) = delete;
  DensityLoop& operator=(const DensityLoop&) = delete;

  void start();  // one tick at once, then the thread
  void stop();   // idempotent

  // kResourceExhausted (429 capacity) naming why, or a ticket. The rule is placement/Admission.h's.
  Result<Ticket> admit(const CreateParams& params);
  // What admit() judges by now (committed including creates in flight), with the pressure level and its reason:
  // GET /v1/node "admission", which the gateway places with.
  AdmissionInfo admissionInfo();
  // What the loop did to a sandbox and saw in it.
  SandboxDensity sandboxDensity(const std::string& id);
  void forget(const std::string& id);
  DensityNodeInfo nodeInfo();
  void renderMetrics(std::string* out);
  int64_t memoryCapacityBytes() const { return capacity_; }

  // One sample, decision and execution (the thread calls it every interval; public for tests).
  void tick();

 private:
  struct PerSandbox {
    double reclaimed_unix = 0;
    int reclaims = 0;
    double paused_unix = 0;
    int pauses = 0;
    double resumed_unix = 0;
    int64_t oom_seen = 0;
    int64_t memory_bytes = 0;
    std::deque<SandboxEvent> events;
  };
  void run();
  placement::NodeAdmission admissionLocked() const;  // mu_ held
  // The node's memory, CPU and pressure (tick's first half); `committed` fields are filled by the caller.
  void sampleNode(double now, placement::NodeSample* sample, std::string* memory_psi_source);
  // The sandboxes' idleness and state; usage of a round-robin share of them into `fresh` (id -> memory, kills).
  std::vector<placement::SandboxView> viewSandboxes(const std::vector<std::shared_ptr<SandboxRecord>>& recs, double now,
                                                    std::map<std::string, std::pair<int64_t, int64_t>>* fresh);
  void reportOomKill(const std::string& id, int64_t kills);
  void execute(const placement::DensityAction& action, const std::shared_ptr<SandboxRecord>& rec);
  void addEvent(const std::string& id, SandboxEvent event);
  void logAction(const placement::DensityAction& action);

  DensityHost* host_;
  placement::DensityConfig config_;
  int64_t capacity_;
  bool capacity_overridden_;
  double cpus_;
  double interval_;
  PressurePaths paths_;

  std::mutex mu_;  // everything below
  placement::DensityController controller_;
  placement::DensityDecision decision_;
  placement::NodeSample last_sample_;
  std::string psi_source_;
  int64_t pending_memory_ = 0;  // creates in flight (tickets alive)
  double pending_cpus_ = 0;
  // Committed limits: the registry's sum at the last tick plus creates completed since (destroys since the
  // last tick still count, which errs on the safe side for at most one interval). Admission stays O(1).
  int64_t committed_memory_ = 0;
  double committed_cpus_ = 0;
  std::map<std::string, PerSandbox> per_sandbox_;
  std::map<std::string, uint64_t> actions_total_;
  uint64_t refusals_total_ = 0;
  uint64_t oom_events_total_ = 0;
  uint64_t action_seq_ = 0;
  std::deque<DensityActionRecord> last_actions_;
  uint64_t last_cpu_usec_ = 0;
  double last_cpu_t_ = -1;
  size_t scan_cursor_ = 0;

  std::mutex thread_mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace dsec::launcher
