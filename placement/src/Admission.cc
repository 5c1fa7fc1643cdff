#include "dsec/placement/Admission.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace dsec::placement {
namespace {

// Sums of doubles (committed CPUs) drift in the last bits: a request that exactly fills the limit fits.
constexpr double kCpuSlack = 1e-9;

std::string fmt(const char* format, double a, double b = 0, double c = 0) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), format, a, b, c);
  return buf;
}

std::string mib(int64_t bytes) { return fmt("%.0f MiB", static_cast<double>(bytes) / (1 << 20)); }

double memoryAllowed(const NodeAdmission& node) {
  return node.memory_ratio * static_cast<double>(node.memory_capacity_bytes);
}

}  // namespace

int64_t dedicatedCoresFor(double cpus) {
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(cpus - kCpuSlack)));
}

AdmissionRefusal admissionRefusal(const NodeAdmission& node, const AdmissionRequest& request) {
  if (!node.admitting) return AdmissionRefusal::kClosed;
  if (node.free_sandboxes >= 0 && node.free_sandboxes < 1) return AdmissionRefusal::kSandboxes;
  if (request.memory_bytes > 0 && node.memory_capacity_bytes > 0 &&
      static_cast<double>(node.memory_committed_bytes + request.memory_bytes) > memoryAllowed(node)) {
    return AdmissionRefusal::kMemory;
  }
  if (request.cpus > 0 && node.cpus > 0 && node.cpu_committed + request.cpus > node.cpu_ratio * node.cpus + kCpuSlack) {
    return AdmissionRefusal::kCpus;
  }
  if (request.latency && node.free_dedicated_cores >= 0 &&
      node.free_dedicated_cores < dedicatedCoresFor(request.cpus)) {
    return AdmissionRefusal::kDedicatedCores;
  }
  return AdmissionRefusal::kNone;
}

std::string explainRefusal(AdmissionRefusal refusal, const NodeAdmission& node, const AdmissionRequest& request,
                           std::string_view closed_reason) {
  switch (refusal) {
    case AdmissionRefusal::kNone:
      return "";
    case AdmissionRefusal::kClosed:
      return "memory pressure on the node, admission is closed (" +
             (closed_reason.empty() ? std::string("pressure") : std::string(closed_reason)) + ")";
    case AdmissionRefusal::kSandboxes:
      return "no free sandbox slot (--max-sandboxes)";
    case AdmissionRefusal::kMemory:
      return "memory: " + mib(node.memory_committed_bytes) + " committed + " + mib(request.memory_bytes) + " asked > " +
             fmt("%.2f", node.memory_ratio) + " x " + mib(node.memory_capacity_bytes) +
             " (overcommit ratio x capacity)";
    case AdmissionRefusal::kCpus:
      return fmt("cpus: %.2f committed + %.2f asked > ", node.cpu_committed, request.cpus) +
             fmt("%.2f x %.0f CPUs (overcommit ratio x capacity)", node.cpu_ratio, node.cpus);
    case AdmissionRefusal::kDedicatedCores:
      return "latency sandbox needs " + std::to_string(dedicatedCoresFor(request.cpus)) + " dedicated cores, " +
             std::to_string(node.free_dedicated_cores) + " free";
  }
  return "";
}

std::string checkAdmission(const NodeAdmission& node, const AdmissionRequest& request, std::string_view closed_reason) {
  return explainRefusal(admissionRefusal(node, request), node, request, closed_reason);
}

double admissionLoad(const NodeAdmission& node) {
  double memory = node.memory_capacity_bytes > 0 && node.memory_ratio > 0
                      ? static_cast<double>(node.memory_committed_bytes) / memoryAllowed(node)
                      : 0;
  double cpu = node.cpus > 0 && node.cpu_ratio > 0 ? node.cpu_committed / (node.cpu_ratio * node.cpus) : 0;
  return std::max(memory, cpu);
}

}  // namespace dsec::placement
