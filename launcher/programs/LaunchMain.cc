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

// The gateway process: every setting comes from its config file.
int runGatewayOnly(const fleet::LaunchOptions& options) {
  auto config = fleet::readGatewayConfig(options.gateway_config);
  if (!config.ok()) {
    DSEC_LOG(kError, "launch") << config.error().message();
    return 2;
  }
  return fleet::runGatewayProcess(*config);
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
