// dsec-launch's command line: every node flag of the shared table (NodeOptionTable.h, the same as `dsec serve`)
// plus the flags of the fleet itself (the gateway, joining, draining, MPI). See docs/fleet.md.
#pragma once

#include <string>
#include <vector>

#include "dsec/common/Result.h"
#include "dsec/launcher/api/Serve.h"

namespace dsec::launcher::fleet {

struct LaunchOptions {
  // The node: every NodeOptionTable flag. Its listen address is --address:--node-port, its name --node-name or
  // the Slurm node's; node.fleet_name is --fleet (or --fleet-name, or --join), default $DSEC_FLEET, else
  // kDefaultFleetName.
  ServeOptions serve;
  std::string node_name;  // --node-name as given ("" : $SLURMD_NODENAME or the host name; made safe later)
  std::string state_dir;  // per-node: token, state, layer mounts (default <root>/nodes/<node>)
  std::string address;    // advertised address (default: the interface that routes to srun's host)
  int node_port = 0;
  int port = 0;  // gateway port (0: a free one, kept across gateway restarts)
  // Gateway candidates: ranks 0..min(N, gateways)-1 each run a gateway (active-active), so the fleet outlives
  // rank 0's node; the fleet file lists them in rank order.
  int gateways = 3;
  std::string join;
  double drain_timeout = 30;
  bool no_mpi = false;
  // Node liveness at the gateway (GatewayOptions). Admission is each node's own (docs/fleet.md, Placement).
  double lost_after = 3.0;
  // Each gateway's listener without authentication for POST /run_code ("" : none; docs/security.md).
  std::string gateway_run_code_listen;
  E2bOptions gateway_e2b;  // --gateway-e2b-listen, --gateway-e2b-template, --gateway-e2b-default-image
  // The gateway process: every setting is in --gateway-config FILE (written by rank 0).
  bool gateway_only = false;
  std::string gateway_config;
  bool help = false;  // --help: usage() was asked for
};

// Parses dsec-launch's arguments (argv[0] is skipped). Bad values are refused with an error naming the flag.
Result<LaunchOptions> parseLaunchOptions(const std::vector<std::string>& args);
// The usage text with every flag and its default.
std::string launchUsage();

}  // namespace dsec::launcher::fleet
