// dsec bench create|density: benchmarks against an embedded node started here (or a running fleet).
#include <iostream>

#include "Commands.h"
#include "dsec/placement/PlacementBench.h"

namespace dsec::cli {

int benchCreate(const Invocation& inv);
int benchDensity(const Invocation& inv);
int benchGateway(const Invocation& inv);
int benchQos(const Invocation& inv);         // BenchQos.cc
int benchFncall(const Invocation& inv);      // BenchFncall.cc
int benchFork(const Invocation& inv);        // BenchFork.cc
int benchImageStart(const Invocation& inv);  // BenchImageStart.cc

// A simulated cell through the real placement code (placement/): no node or root needed.
int benchPlacement(const Invocation& inv) { return placement::placementBenchMain("dsec bench placement", inv.args); }

int cmdBench(const Invocation& inv) {
  static const std::pair<const char*, int (*)(const Invocation&)> kSubcommands[] = {{"create", benchCreate},
                                                                                    {"density", benchDensity},
                                                                                    {"placement", benchPlacement},
                                                                                    {"gateway", benchGateway},
                                                                                    {"qos", benchQos},
                                                                                    {"fncall", benchFncall},
                                                                                    {"fork", benchFork},
                                                                                    {"image-start", benchImageStart}};
  if (inv.args.empty() || inv.args[0] == "--help" || inv.args[0] == "-h") {
    std::ostream& out = inv.args.empty() ? std::cerr : std::cout;
    out << "usage: dsec bench create --backend container --count N --concurrency C [--image IMAGE]\n"
           "       dsec bench create --backend microvm|vm [--count N] [--memory SIZE]\n"
           "       dsec bench fork --backend microvm|vm|container --count N\n"
           "       dsec bench density --count N [--image IMAGE]\n"
           "       dsec bench placement [--nodes 160 --topology 2x96c-1.5t --sandboxes 380000]\n"
           "       dsec bench gateway --simulated-nodes 160 --count N [--concurrency C]\n"
           "       dsec bench qos [--rounds 3 --requests 1000 --stress-sandboxes 4]\n"
           "       dsec bench fncall --language python --count N --concurrency C [--image IMAGE]\n"
           "       dsec bench image-start [--image IMAGE] [--rate 1gbit] [--latency-ms 1] [--rounds 3]\n"
           "create, density and fork start an embedded node on 127.0.0.1 with --root unless --endpoint or --fleet is "
           "given.\n"
           "The last line of the output is one JSON object with the figures.\n";
    if (inv.args.empty())
      throw UsageError("missing bench command (create, density, placement, gateway, fork, image-start)");
    return kExitOk;
  }
  for (const auto& [name, run] : kSubcommands) {
    if (inv.args[0] != name) continue;
    Invocation sub{"bench " + inv.args[0], inv.globals, std::vector<std::string>(inv.args.begin() + 1, inv.args.end())};
    try {
      return run(sub);
    } catch (const UsageError& e) {  // named after the full command: "dsec layer build: ..."
      std::cerr << "dsec " << sub.name << ": " << e.what() << "\n(see `dsec " << sub.name << " --help`)\n";
      return kExitUsage;
    }
  }
  throw UsageError("unknown bench command '" + inv.args[0] +
                   "' (create, density, placement, gateway, fork, image-start)");
}

}  // namespace dsec::cli
