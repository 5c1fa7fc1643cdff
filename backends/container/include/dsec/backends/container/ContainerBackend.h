// Container sandboxes: a user namespace whose root is an unprivileged host id range of the sandbox's own, new
// mount, PID, network, UTS, IPC and cgroup namespaces; an overlay of the layer mounts (idmapped, so files keep
// their ownership inside) with a size-limited writable upper; pivot_root; reduced capabilities, no_new_privs and a
// seccomp filter. PID 1 of each sandbox is dsec-sandbox-init (a tiny static binary): it makes the namespaces, sets
// up the root, then only reaps. Commands are started from outside by dsec-sandbox-spawner, which shares nothing
// with the agent (Spawn.h), so nothing of ours is reachable from inside the sandbox.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dsec/backends/Sandbox.h"
#include "dsec/common/Cgroup.h"

namespace dsec::backends {

enum class UserNamespaceMode {
  // Every sandbox in a user namespace of its own; its root is a host id range no other sandbox and no host
  // service uses. Without kernel support the backend refuses to run sandboxes (missingFeatures).
  kPrivate,
  // No user namespace: sandbox root is host root with reduced capabilities. For SPANK steps (their tasks run as the
  // job's own unprivileged user) and for an operator's explicit, logged opt-out on kernels that lack support.
  kOff,
};

struct ContainerBackendOptions {
  std::string init_path;                   // dsec-sandbox-init; default: next to the running executable
  std::string cgroup_parent = "dsec";      // cgroups live under <controller>/dsec/<id>
  int64_t default_disk_bytes = 1LL << 30;  // upper size when the spec gives none
  int init_pool_size = 4;                  // sandbox inits started ahead of time (network "none"; 0 = none)
  // Sandboxes whose cgroup files stay open for their next command (JoinFdCache.h): the most recently used. On
  // cgroup v1 each costs the agent up to one fd per controller; an idle sandbox beyond them costs one fd.
  int join_fd_cache_sandboxes = 256;
  // CPU QoS (docs/qos.md): batch sandboxes run every process under SCHED_IDLE in a cgroup with cpu.idle and a low
  // weight; latency ones at normal priority. A spec's cpuset is applied either way. false: every sandbox is plain.
  bool cpu_qos = true;
  UserNamespaceMode user_namespace = UserNamespaceMode::kPrivate;
  std::string id_lease_dir = "/run/dsec/idranges";  // node-wide leases of host id ranges (UserNamespace.h)
  uint32_t id_range_first = 0x40000000;             // first host uid/gid handed to sandboxes
  uint32_t id_range_count = 16384;                  // ranges of 65536 ids
  // NetworkMode::kHost is refused unless this is set (SPANK steps, whose tasks are the job user's own processes
  // and have the host's network without dsec too).
  bool allow_host_network = false;
  // false: nothing is started inside through the backend (exec and spawn are refused), and dsec-sandbox-spawner is
  // not needed. SPANK steps, whose tasks join the sandbox from slurmstepd.
  bool commands = true;
  // NetworkMode::kEgress: the sandbox's own network namespace with a veth to the node, routed and masqueraded to
  // the node's uplink; nothing on the node itself, other sandboxes or link-local addresses is reachable.
  std::string egress_subnet = "100.64.0.0/16";  // carved into /30s, one per sandbox
  // IPv4 blocks no sandbox reaches whatever its egress policy says, besides the node's own addresses, link-local
  // and the sandboxes' subnet (always): the fleet's gateways, the Slurm controller. Only a rule naming one address
  // exactly (a /32) opens one of them.
  std::vector<std::string> egress_never;
  // Where the node's resolver for sandboxes (NodeResolver.h) sends the names their policies allow: "ADDR" or
  // "ADDR:PORT" (IPv4); "" = the first IPv4 nameserver of the node's /etc/resolv.conf.
  std::string dns_upstream;
  // Snapshots (Sandbox::snapshot): the most a sandbox's upper may hold to be captured, in bytes (files' sizes and
  // symlink targets) and entries; a larger one is refused, not cut.
  int64_t snapshot_max_bytes = 8LL << 30;
  int64_t snapshot_max_entries = 1000000;
};

// The cgroup weight of batch sandboxes (v2 cpu.weight scale; v1 shares 102): low, so they yield to everything.
constexpr uint64_t kBatchCpuWeight = 10;

Result<std::unique_ptr<Backend>> makeContainerBackend(const ContainerBackendOptions& options);

// What the host lacks for network "egress" (nftables with inet nat, IPv4 forwarding); "" when usable. Changes
// nothing on the host.
std::string egressSupportProblem();
// Why refused writes to protected paths cannot be recorded here (the file watch's BPF programs do not load or
// attach); "" when they can. Loads and unloads the programs.
std::string fileWatchSupportProblem();

// Every fault point (common/Fault.h) on the create path, in order: agent steps ("container.clone", ...)
// and init steps ("container.init.mount_overlay", ...). Tests arm each in turn and check nothing is left.
std::vector<std::string> containerCreateFaultPoints();

}  // namespace dsec::backends
