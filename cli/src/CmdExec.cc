// dsec exec ID [--timeout --cwd --env K=V -i --no-stdin] -- CMD...: runs a command in a sandbox, streaming its
// output and forwarding our stdin to it, and exits with its exit code.
#include <unistd.h>

#include "ClientCommon.h"
#include "Commands.h"
#include "StreamExec.h"

namespace dsec::cli {

int cmdExec(const Invocation& inv) {
  auto [before, command] = splitAtDoubleDash(inv.args);
  CommonOptions common;
  po::options_description desc("options");
  addCommonOptions(desc, &common, true);
  desc.add_options()("id", po::value<std::string>()->required(), "sandbox id")(
      "timeout", po::value<double>()->default_value(0), "kill the command after this many seconds (0 = never)")(
      "cwd", po::value<std::string>(), "working directory inside the sandbox")(
      "interactive,i", "forward stdin even when it is a terminal (it is forwarded when it is not one)")(
      "no-stdin", "do not forward stdin (the command reads EOF)")(
      "env", po::value<std::vector<std::string>>()->composing(), "K=V (repeatable)")(
      "cmd", po::value<std::vector<std::string>>(), "command (prefer after --)");
  po::positional_options_description positional;
  positional.add("id", 1).add("cmd", -1);
  po::variables_map vm;
  if (!parseCommandLine(inv, before, desc, positional, "ID [options] -- CMD...", &vm, &common)) return kExitOk;
  if (vm.count("cmd") != 0) {
    auto extra = vm["cmd"].as<std::vector<std::string>>();
    command.insert(command.begin(), extra.begin(), extra.end());
  }
  if (command.empty()) throw UsageError("missing command (dsec exec ID -- CMD...)");
  nlohmann::json body{{"cmd", command}};
  double timeout = vm["timeout"].as<double>();
  if (!(timeout >= 0)) throw UsageError("--timeout must be >= 0 seconds");
  if (timeout > 0) body["timeout"] = timeout;
  if (vm.count("cwd") != 0) body["cwd"] = vm["cwd"].as<std::string>();
  if (vm.count("env") != 0) body["env"] = parseKeyValues("env", vm["env"].as<std::vector<std::string>>());

  auto client = connectFleet(common);
  if (!client.ok()) return reportError(inv, client.error());
  // The exec's answer takes as long as the command: the client waits for its own timeout plus a grace.
  (*client)->setTimeouts(common.connect_timeout, timeout > 0 ? timeout + 30 : 0);
  const bool forward_stdin = vm.count("no-stdin") == 0 && (vm.count("interactive") != 0 || isatty(STDIN_FILENO) == 0);
  auto result = streamExec(**client, vm["id"].as<std::string>(), body, forward_stdin);
  if (!result.ok()) return reportError(inv, result.error());
  return exitCodeOf(*result, inv.name);
}

}  // namespace dsec::cli
