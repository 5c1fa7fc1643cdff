// The command-line face of the placement benchmark, shared by `dsec-bench-placement` and `dsec bench placement`.
#include <boost/program_options.hpp>
#include <iostream>

#include "dsec/placement/NodeModel.h"
#include "dsec/placement/PlacementBench.h"

namespace dsec::placement {

namespace po = boost::program_options;

int placementBenchMain(const std::string& prog, const std::vector<std::string>& args) {
  PlacementBenchOptions options;
  bool no_compare = false;
  std::string aliases;
  for (const auto& alias : syntheticAliases()) aliases += std::string("\n  ") + alias.name + ": " + alias.what;
  po::options_description desc("usage: " + prog + " [options]");
  desc.add_options()("help,h", "print this help")("nodes", po::value<int>(&options.nodes)->default_value(160),
                                                  "nodes in the cell")(
      "topology", po::value<std::string>(&options.topology)->default_value("2x96c-1.5t"),
      ("node shape: an alias, an hwloc synthetic description, an XML file or 'system'; aliases:" + aliases).c_str())(
      "sandboxes", po::value<int64_t>(&options.sandboxes)->default_value(380000), "sandboxes to place")(
      "k", po::value<int>(&options.k)->default_value(2), "nodes sampled per decision")(
      "seed", po::value<uint64_t>(&options.seed)->default_value(42), "random seed (same seed, same run)")(
      "latency-fraction", po::value<double>(&options.latency_fraction)->default_value(0.002),
      "fraction of sandboxes with QoS latency (dedicated cores)")(
      "cpu-overcommit", po::value<double>(&options.cpu_overcommit)->default_value(0),
      "CPU overcommit ratio (0 = derive from the mix)")("memory-overcommit",
                                                        po::value<double>(&options.memory_overcommit)->default_value(0),
                                                        "memory overcommit ratio (0 = derive from the mix)")(
      "headroom", po::value<double>(&options.headroom)->default_value(0.10), "headroom added to derived ratios")(
      "no-compare", po::bool_switch(&no_compare), "skip the random and least-loaded baselines");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(desc).run(), vm);
    if (vm.count("help")) {
      std::cout << desc << "\n";
      return 0;
    }
    po::notify(vm);
  } catch (const std::exception& e) {
    std::cerr << prog << ": " << e.what() << "\n" << desc << "\n";
    return 2;
  }
  options.compare = !no_compare;
  auto result = runPlacementBench(options, std::cout);
  if (!result.ok()) {
    std::cerr << prog << ": " << result.error().toString() << "\n";
    return 1;
  }
  std::cout << result->json << std::endl;
  return 0;
}

}  // namespace dsec::placement
