// A node of a dsec-launch fleet: its name and address, its capacity, its state directory, the embedded node it
// runs, and `--join` (adding this node to a running fleet over HTTP, no MPI). See docs/fleet.md.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dsec/common/Result.h"
#include "dsec/launcher/api/Serve.h"
#include "dsec/launcher/fleet/Fleet.h"
#include "dsec/launcher/fleet/LaunchOptions.h"

namespace dsec::launcher::fleet {

// Slurm's node name (or the host name) made safe for sandbox ids: [a-z0-9-], at most 32.
std::string safeNodeName(const std::string& given);

// Where other nodes reach this one: --address; else the interface that routes to `peer` (the gateway, or srun's
// host); else the first non-loopback interface; else 127.0.0.1.
std::string advertisedAddress(const LaunchOptions& options, const std::string& peer);

struct NodeCapacity {
  double cpus = 0;
  int64_t memory_bytes = 0;
};
NodeCapacity nodeCapacity();

// The directory rank 0 keeps the fleet's files in (fleet-token, fleet-nodes.json, the gateway config).
std::string fleetStateDir(const LaunchOptions& options, const std::string& node);

struct RunningNode {
  std::unique_ptr<EmbeddedNode> node;
  std::string name;
  std::string endpoint;
  NodeCapacity capacity;
};

// Starts this node: every NodeOptionTable setting of `options`, in its own state directory (with `token`),
// listening on the advertised address (towards `peer`) and --node-port.
Result<RunningNode> startLaunchNode(const LaunchOptions& options, const std::string& token, const std::string& peer);

RegistrarOptions registrarOptions(const std::vector<std::string>& gateways, const std::string& token,
                                  const RunningNode& node);
// The gateway candidates a fleet file names: "endpoints" in order, else its one "endpoint".
std::vector<std::string> fleetFileGateways(const nlohmann::json& fleetfile);

// Serves until a stop signal; a node drained at the gateway leaves the fleet once empty.
void runUntilStopped(RunningNode& node, NodeRegistrar& registrar);

// `dsec-launch --join NAME`: the exit code.
int runJoin(const LaunchOptions& options);

}  // namespace dsec::launcher::fleet
