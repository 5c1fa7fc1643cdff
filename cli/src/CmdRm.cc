// dsec rm ID...: destroys sandboxes; keeps going past failures and exits 1 if any failed.
#include <iostream>

#include "ClientCommon.h"
#include "Commands.h"

namespace dsec::cli {

int cmdRm(const Invocation& inv) {
  CommonOptions common;
  po::options_description desc("options");
  addCommonOptions(desc, &common, true);
  desc.add_options()("id", po::value<std::vector<std::string>>(), "sandbox ids");
  po::positional_options_description positional;
  positional.add("id", -1);
  po::variables_map vm;
  if (!parseCommandLine(inv, inv.args, desc, positional, "ID...", &vm, &common)) return kExitOk;
  if (vm.count("id") == 0) throw UsageError("missing sandbox id");
  auto client = connectFleet(common);
  if (!client.ok()) return reportError(inv, client.error());
  int status = kExitOk;
  for (const auto& id : vm["id"].as<std::vector<std::string>>()) {
    auto done = (*client)->call(HttpMethod::kDelete, sandboxPath(id));
    if (!done.ok()) {
      status = reportError(inv, done.error().wrap(id));
    } else {
      std::cout << id << "\n";
    }
  }
  return status;
}

}  // namespace dsec::cli
