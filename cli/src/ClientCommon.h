// Helpers for the commands that talk to a fleet over the API.
#pragma once

#include <string>

#include "ApiClient.h"
#include "Cli.h"

namespace dsec::cli {

// The fleet named by --fleet (or DSEC_ENDPOINT/DSEC_TOKEN), as a connected-on-demand client.
Result<std::unique_ptr<ApiClient>> connectFleet(const CommonOptions& common);

std::string sandboxPath(const std::string& id);

}  // namespace dsec::cli
