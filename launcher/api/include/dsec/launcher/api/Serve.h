// The embedded single-node fleet: a node agent plus the HTTP API in one process (`dsec serve`).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "dsec/common/Result.h"
#include "dsec/launcher/node/NodeFncall.h"
#include "dsec/placement/DensityController.h"

namespace dsec::launcher {

struct ServeOptions {
  std::string root = "/var/lib/dsec";     // layer store, state dir, token
  std::string listen = "127.0.0.1:8470";  // ADDR:PORT; port 0 picks a free one
  std::string fleet_name = "default";     // fleet file ~/.dsec/fleets/<fleet_name>.json
  std::string node_name = "n0";           // prefix of sandbox ids
  bool write_fleet_file = true;
  int max_connections = 1024;  // concurrent HTTP connections; more get 503
  // Against clients that hold connections on purpose (docs/node-agent.md, "Connection budgets"; defaults and
  // meaning as HttpServerOptions): unauthenticated connections per client (0: min(64, max_connections / 2)),
  // the request head deadline, and the body's grace time and minimum rate.
  int max_client_connections = 0;
  double header_timeout_seconds = 10;
  double body_timeout_seconds = 10;
  double body_min_rate = 64 * 1024;
  // Buffered exec and call output held at once (OutputBudget.h); 0: a sixteenth of the node's memory,
  // between 64 MiB and 1 GiB.
  uint64_t output_budget_bytes = 0;
  int64_t max_sandboxes = 4096;  // admission limit for this node; more get 429 capacity
  // Parent of the sandboxes' cgroups. Empty: "dsec" for the default root, else "dsec-<hash of root>", so
  // nodes with different roots on one host (tests, several fleets) never reap each other's sandboxes.
  std::string cgroup_parent;
  // A simulated node: sandboxes are records without processes (NodeOptions::simulate, docs/fleet.md).
  bool simulate = false;
  // The fncall backend: default image (fncall.image, "debian:12+python:3.11"), worker count, queue wait.
  FncallOptions fncall;
  // The density controller (docs/density.md); density.overcommit = false: static limits, no overcommit.
  placement::DensityConfig density;
  int64_t memory_capacity_bytes = 0;  // 0: the node's physical memory
  bool cpu_qos = true;                // CPU QoS (docs/qos.md); false: every sandbox plain
  bool cpu_exclusive_pool = true;     // batch sandboxes leave the cores dedicated to latency ones
  bool user_namespaces = true;        // false: the operator's opt-out (NodeOptions::user_namespaces)
};

// A running node: agent + API server on background threads. stop() (or the destructor) stops serving; the
// sandboxes keep running (a restarted node re-adopts them) unless destroySandboxes is true.
class EmbeddedNode {
 public:
  static Result<std::unique_ptr<EmbeddedNode>> start(const ServeOptions& options);
  virtual ~EmbeddedNode() = default;
  virtual std::string endpoint() const = 0;  // "http://127.0.0.1:PORT"
  virtual std::string token() const = 0;
  virtual void stop(bool destroy_sandboxes) = 0;
};

// `dsec serve`: runs until SIGINT or SIGTERM, then stops serving and leaves sandboxes running (so a restart
// re-adopts them). Returns an error if it cannot start (port taken, root unusable, ...).
Status serveUntilSignal(const ServeOptions& options);

}  // namespace dsec::launcher
