// Container sandboxes: new mount, PID, network, UTS, IPC and cgroup namespaces; an overlay of the layer
// mounts with a size-limited writable upper; pivot_root; reduced capabilities and a seccomp filter.
// PID 1 of each sandbox is dsec-sandbox-init (a tiny static binary): it sets up the root, then only reaps.
// Exec runs from outside: a helper forked by the agent joins the namespaces and cgroup (setns through the
// init's pidfd) and execs the command, so nothing of ours is reachable from inside the sandbox.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dsec/backends/Sandbox.h"
#include "dsec/common/Cgroup.h"

namespace dsec::backends {

struct ContainerBackendOptions {
  std::string init_path;                   // dsec-sandbox-init; default: next to the running executable
  std::string cgroup_parent = "dsec";      // cgroups live under <controller>/dsec/<id>
  int64_t default_disk_bytes = 1LL << 30;  // upper size when the spec gives none
  int netns_pool_size = 8;                 // network namespaces made ahead of time (0 = make each in the create path)
  int init_pool_size = 4;                  // sandbox inits started ahead of time (network "none"; 0 = none)
  // CPU QoS (docs/qos.md): batch sandboxes run every process under SCHED_IDLE in a cgroup with cpu.idle and a low
  // weight; latency ones at normal priority. A spec's cpuset is applied either way. false: every sandbox is plain.
  bool cpu_qos = true;
};

// The cgroup weight of batch sandboxes (v2 cpu.weight scale; v1 shares 102): low, so they yield to everything.
constexpr uint64_t kBatchCpuWeight = 10;

Result<std::unique_ptr<Backend>> makeContainerBackend(const ContainerBackendOptions& options);

// Every fault point (common/Fault.h) on the create path, in order: agent steps ("container.clone", ...)
// and init steps ("container.init.mount_overlay", ...). Tests arm each in turn and check nothing is left.
std::vector<std::string> containerCreateFaultPoints();

}  // namespace dsec::backends
