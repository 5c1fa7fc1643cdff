// dsec pause ID / dsec resume ID: freezes or thaws a sandbox (cgroup freezer) and prints its new state.
#include <iostream>

#include "ClientCommon.h"
#include "Commands.h"

namespace dsec::cli {
namespace {

// The two commands differ only in the action: POST /v1/sandboxes/ID/<action>.
int sandboxAction(const Invocation& inv, const std::string& action) {
  CommonOptions common;
  po::options_description desc("options");
  addCommonOptions(desc, &common, true);
  desc.add_options()("id", po::value<std::string>()->required(), "sandbox id");
  po::positional_options_description positional;
  positional.add("id", 1);
  po::variables_map vm;
  if (!parseCommandLine(inv, inv.args, desc, positional, "ID", &vm, &common)) return kExitOk;
  auto client = connectFleet(common);
  if (!client.ok()) return reportError(inv, client.error());
  std::string id = vm["id"].as<std::string>();
  auto info = (*client)->call(HttpMethod::kPost, sandboxPath(id) + "/" + action);
  if (!info.ok()) return reportError(inv, info.error());
  std::cout << id << " " << info->value("state", "?") << "\n";
  return kExitOk;
}

}  // namespace

int cmdPause(const Invocation& inv) { return sandboxAction(inv, "pause"); }

int cmdResume(const Invocation& inv) { return sandboxAction(inv, "resume"); }

}  // namespace dsec::cli
