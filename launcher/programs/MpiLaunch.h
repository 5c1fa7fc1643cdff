// dsec-launch's MPI start (one rank per node): the token, the nodes, the gateway; then MPI is left.
#pragma once

#include "dsec/launcher/fleet/LaunchOptions.h"

namespace dsec::launcher {

// Runs this rank's node in the fleet until stopped; the exit code.
int runLaunch(const fleet::LaunchOptions& options, int argc, char** argv);

}  // namespace dsec::launcher
