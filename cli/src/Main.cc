// `dsec`: the command line of the platform. One table maps subcommand names to their handlers; options given
// before the subcommand (--root, --fleet, --log-level) are handed to it as if given after.
#include <iostream>
#include <string>
#include <vector>

#include "Commands.h"

namespace {

using dsec::cli::Invocation;

struct Command {
  const char* name;
  int (*run)(const Invocation&);
  const char* summary;
};

const Command kCommands[] = {
    {"serve", dsec::cli::cmdServe, "run the embedded single-node fleet (node agent + HTTP API)"},
    {"run", dsec::cli::cmdRun, "create a sandbox; with -- CMD, run it, print its output and destroy the sandbox"},
    {"exec", dsec::cli::cmdExec, "run a command in a sandbox, streaming its output"},
    {"shell", dsec::cli::cmdShell, "an interactive terminal in a sandbox (its login shell, or -- CMD)"},
    {"call", dsec::cli::cmdCall, "run code once on the fncall backend (warm, stateless)"},
    {"ls", dsec::cli::cmdLs, "list sandboxes"},
    {"rm", dsec::cli::cmdRm, "destroy sandboxes"},
    {"pause", dsec::cli::cmdPause, "freeze a sandbox"},
    {"resume", dsec::cli::cmdResume, "thaw a sandbox"},
    {"network", dsec::cli::cmdNetwork, "replace a running sandbox's egress policy (a stage)"},
    {"protect", dsec::cli::cmdProtect, "replace a running sandbox's protected paths"},
    {"violations", dsec::cli::cmdViolations, "what a sandbox's processes were refused"},
    {"snapshot", dsec::cli::cmdSnapshot, "keep a sandbox's state (create), list and remove snapshots"},
    {"fork", dsec::cli::cmdFork, "copy a running sandbox into new ones (prints their ids)"},
    {"layer", dsec::cli::cmdLayer, "build, list and remove layers in the local layer store"},
    {"doctor", dsec::cli::cmdDoctor, "report what this host supports"},
    {"node", dsec::cli::cmdNode, "node upkeep: cleanup --job ID destroys what an ended Slurm job left here"},
    {"bench", dsec::cli::cmdBench, "benchmarks: create latency and throughput, density"},
};

void printUsage(std::ostream& out) {
  out << "usage: dsec [--root DIR] [--fleet NAME] [--log-level LEVEL] <command> [options] [args]\n\ncommands:\n";
  for (const auto& cmd : kCommands) {
    out << "  " << cmd.name << std::string(12 - std::string(cmd.name).size(), ' ') << cmd.summary << "\n";
  }
  out << "\n`dsec <command> --help` describes a command.\n";
}

bool isGlobalWithValue(const std::string& arg) { return arg == "--root" || arg == "--fleet" || arg == "--log-level"; }

bool isGlobalWithInlineValue(const std::string& arg) {
  return arg.rfind("--root=", 0) == 0 || arg.rfind("--fleet=", 0) == 0 || arg.rfind("--log-level=", 0) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  std::vector<std::string> globals;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h" || arg == "help") {
      printUsage(std::cout);
      return dsec::cli::kExitOk;
    }
    if (arg == "--version") {
      std::cout << "dsec 0.1.0\n";
      return dsec::cli::kExitOk;
    }
    if (isGlobalWithInlineValue(arg)) {
      globals.push_back(arg);
    } else if (isGlobalWithValue(arg)) {
      if (i + 1 >= args.size()) {
        std::cerr << "dsec: option " << arg << " needs a value\n";
        return dsec::cli::kExitUsage;
      }
      globals.push_back(arg);
      globals.push_back(args[++i]);
    } else if (!arg.empty() && arg[0] == '-') {
      std::cerr << "dsec: unknown option '" << arg << "'\n";
      printUsage(std::cerr);
      return dsec::cli::kExitUsage;
    } else {
      break;
    }
  }
  if (i >= args.size()) {
    std::cerr << "dsec: missing command\n";
    printUsage(std::cerr);
    return dsec::cli::kExitUsage;
  }
  const std::string name = args[i];
  for (const auto& cmd : kCommands) {
    if (name != cmd.name) continue;
    Invocation inv{name, globals, std::vector<std::string>(args.begin() + static_cast<long>(i) + 1, args.end())};
    try {
      return cmd.run(inv);
    } catch (const dsec::cli::UsageError& e) {
      std::cerr << "dsec " << name << ": " << e.what() << "\n(see `dsec " << name << " --help`)\n";
      return dsec::cli::kExitUsage;
    } catch (const std::exception& e) {
      std::cerr << "dsec " << name << ": " << e.what() << "\n";
      return dsec::cli::kExitFailure;
    }
  }
  std::cerr << "dsec: unknown command '" << name << "'\n";
  printUsage(std::cerr);
  return dsec::cli::kExitUsage;
}
