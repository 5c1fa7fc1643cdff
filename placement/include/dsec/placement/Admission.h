// One admission rule for a node and for the gateway placing on it (docs/density.md "Admission", docs/fleet.md
// "Placement"): does this node admit a sandbox of (cpus, memory, qos)? The node's density loop asks it of its
// own books before every create, and that answer is the final word. The gateway asks it of the state each node
// reports (GET /v1/node "admission", with every heartbeat and probe) plus its own tickets (creates sent there
// and not yet seen in a report), so it places only where the node will say yes. There is no second ratio.
//
// Memory counts the sandboxes' limits against memory_ratio x capacity. CPUs count their limits against
// cpu_ratio x CPUs; CPU is compressible (batch sandboxes run SCHED_IDLE), so the density controller keeps
// cpu_ratio at its bound (1024) until the sandboxes themselves saturate the CPUs: idle sandboxes are admitted
// by what they use, not by their default of 1 CPU. A latency sandbox also needs ceil(cpus) dedicated cores.
//
// Pure and allocation-free: the gateway calls it for every node it samples on every create.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace dsec::placement {

// A node's live admission state, as its density controller, CPU QoS books and sandbox slots hold it.
struct NodeAdmission {
  bool admitting = true;    // false while pressure (level >= 2) holds admission closed
  double memory_ratio = 1;  // the density controller's current overcommit ratios
  double cpu_ratio = 1;
  int64_t memory_capacity_bytes = 0;   // 0: memory is not checked
  int64_t memory_committed_bytes = 0;  // the sandboxes' limits, creates in flight included
  double cpus = 0;                     // 0: CPUs are not checked
  double cpu_committed = 0;
  int64_t free_dedicated_cores = -1;  // for latency sandboxes; -1: not checked here (the CPU QoS books decide)
  int64_t free_sandboxes = -1;        // slots under --max-sandboxes; -1: not checked here

  bool operator==(const NodeAdmission&) const = default;
};

struct AdmissionRequest {
  int64_t memory_bytes = 0;  // 0: no memory limit, counts nothing
  double cpus = 0;           // 0: no CPU limit, counts nothing
  bool latency = false;      // qos latency: also needs ceil(cpus) dedicated cores
};

enum class AdmissionRefusal { kNone, kClosed, kSandboxes, kMemory, kCpus, kDedicatedCores };

// kNone when the node admits the request, else the first reason it does not (in the order above).
AdmissionRefusal admissionRefusal(const NodeAdmission& node, const AdmissionRequest& request);
// The refusal in words, naming the resource, the numbers and the ratio; closed_reason says what holds
// admission closed (the density controller's reason).
std::string explainRefusal(AdmissionRefusal refusal, const NodeAdmission& node, const AdmissionRequest& request,
                           std::string_view closed_reason);
// "" when admitted, else why not.
std::string checkAdmission(const NodeAdmission& node, const AdmissionRequest& request,
                           std::string_view closed_reason = "");
// Dedicated cores a latency sandbox of `cpus` needs: whole cores, at least one (as the node's CPU QoS books).
int64_t dedicatedCoresFor(double cpus);
// The node's use of what it admits by: the larger of its committed memory and CPU fractions of ratio x capacity
// (0 for a resource it does not check). The gateway's "least loaded".
double admissionLoad(const NodeAdmission& node);

}  // namespace dsec::placement
