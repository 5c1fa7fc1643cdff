// dsec pause ID / dsec resume ID: freezes or thaws a sandbox (cgroup freezer) and prints its new state.
#include <iostream>

#include "ClientCommon.h"
#include "Commands.h"

namespace dsec::cli {
namespace {

// The two commands differ only in the action: POST /v1/sandboxes/ID/<action>.
int sandboxAction(const Invocation& inv, const std::string& action) {
  SandboxCommandLine line;
  if (!line.parse(inv, inv.args, "ID")) return kExitOk;
  auto client = connectFleet(line.common);
  if (!client.ok()) return reportError(inv, client.error());
  auto info = (*client)->call(HttpMethod::kPost, sandboxPath(line.id()) + "/" + action);
  if (!info.ok()) return reportError(inv, info.error());
  std::cout << line.id() << " " << info->value("state", "?") << "\n";
  return kExitOk;
}

}  // namespace

int cmdPause(const Invocation& inv) { return sandboxAction(inv, "pause"); }

int cmdResume(const Invocation& inv) { return sandboxAction(inv, "resume"); }

}  // namespace dsec::cli
