// dsec-launch: one rank per node (srun --mpi=pmix, or mpirun). Every rank runs a node agent with the node flags
// `dsec serve` takes (NodeOptionTable.h); rank 0 also starts the gateway, a supervised child process
// (`dsec-launch --gateway-only --gateway-config FILE`). `--join NAME` adds this job's nodes to a running fleet
// (no MPI). See docs/fleet.md.
#include <sys/prctl.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "MpiLaunch.h"
#include "dsec/common/Logging.h"
#include "dsec/launcher/fleet/GatewayProcess.h"
#include "dsec/launcher/fleet/LaunchNode.h"
#include "dsec/launcher/fleet/LaunchOptions.h"

namespace {

using namespace dsec;
using namespace dsec::launcher;

// The gateway process: its config file, or (the older form) its settings as flags.
int runGatewayOnly(const fleet::LaunchOptions& options) {
  fleet::GatewayProcessConfig config;
  if (!options.gateway_config.empty()) {
    auto read = fleet::readGatewayConfig(options.gateway_config);
    if (!read.ok()) {
      DSEC_LOG(kError, "launch") << read.error().message();
      return 2;
    }
    config = *read;
  } else {
    config.fleet_name = options.serve.node.fleet_name;
    config.token_file = options.token_file;
    config.seed_file = options.seed_file;
    config.port_file = options.port_file;
    config.address = options.address;
    config.port = options.port;
    config.cpu_overcommit = options.cpu_overcommit;
    config.memory_overcommit = options.memory_overcommit;
    config.lost_after_seconds = options.lost_after;
    fleet::setGatewayHttp(options.serve.http, &config);
  }
  return fleet::runGatewayProcess(config);
}

}  // namespace

int main(int argc, char** argv) try {
  // Every role holds the fleet token: not readable through /proc or ptrace but by host root, never in a core dump.
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  auto options = fleet::parseLaunchOptions(std::vector<std::string>(argv + (argc > 0 ? 1 : 0), argv + argc));
  if (!options.ok()) {
    std::cerr << "dsec-launch: " << options.error().message() << "\n(dsec-launch --help lists the options)\n";
    return 2;
  }
  if (options->help) {
    std::cout << fleet::launchUsage();
    return 0;
  }
  if (const char* level = std::getenv("DSEC_LOG_LEVEL")) {
    LogLevel l;
    if (parseLogLevel(level, &l)) setLogLevel(l);
  }
  if (options->gateway_only) return runGatewayOnly(*options);
  if (!options->join.empty()) return fleet::runJoin(*options);
  return runLaunch(*options, argc, argv);
} catch (const std::exception& e) {
  std::fprintf(stderr, "dsec-launch: %s\n", e.what());
  return 1;
}
