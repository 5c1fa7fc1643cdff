// Helpers for the commands that talk to a fleet over the API.
#pragma once

#include <string>

#include "ApiClient.h"
#include "Cli.h"

namespace dsec::cli {

// The fleet named by --fleet (or DSEC_ENDPOINT/DSEC_TOKEN), as a connected-on-demand client.
Result<std::unique_ptr<ApiClient>> connectFleet(const CommonOptions& common);

std::string sandboxPath(const std::string& id);

// The command line of a command on one sandbox: the common options (with --fleet) and ID, the first positional.
// The command adds its own options to desc and positionals after ID, then calls parse().
struct SandboxCommandLine {
  CommonOptions common;
  po::options_description desc{"options"};
  po::positional_options_description positional;
  po::variables_map vm;

  SandboxCommandLine() {
    addCommonOptions(desc, &common, true);
    desc.add_options()("id", po::value<std::string>()->required(), "sandbox id");
    positional.add("id", 1);
  }
  // False when --help was given (usage printed); throws UsageError as parseCommandLine does.
  bool parse(const Invocation& inv, const std::vector<std::string>& args, const std::string& synopsis) {
    return parseCommandLine(inv, args, desc, positional, synopsis, &vm, &common);
  }
  std::string id() const { return vm["id"].as<std::string>(); }
};

}  // namespace dsec::cli
