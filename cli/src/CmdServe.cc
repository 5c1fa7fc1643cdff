// dsec serve: the embedded single-node fleet, in the foreground until SIGINT/SIGTERM.
#include "Commands.h"
#include "dsec/launcher/Serve.h"

namespace dsec::cli {

int cmdServe(const Invocation& inv) {
  CommonOptions common;
  launcher::ServeOptions options;
  po::options_description desc("options");
  addCommonOptions(desc, &common, false);
  desc.add_options()("listen", po::value<std::string>(&options.listen)->default_value(options.listen),
                     "ADDR:PORT to serve the API on (port 0 picks a free one)")(
      "fleet-name", po::value<std::string>(&options.fleet_name)->default_value(options.fleet_name),
      "fleet name: writes ~/.dsec/fleets/NAME.json")(
      "node-name", po::value<std::string>(&options.node_name)->default_value(options.node_name),
      "node name (prefix of sandbox ids)")(
      "max-sandboxes", po::value<int64_t>(&options.max_sandboxes)->default_value(options.max_sandboxes),
      "admission limit of this node")("no-fleet-file", po::bool_switch(), "do not write the fleet file");
  po::variables_map vm;
  if (!parseCommandLine(inv, inv.args, desc, {}, "[--listen ADDR:PORT] [--root DIR] [--fleet-name NAME]", &vm,
                        &common)) {
    return kExitOk;
  }
  if (options.listen.find(':') == std::string::npos) throw UsageError("--listen wants ADDR:PORT");
  if (options.max_sandboxes <= 0) throw UsageError("--max-sandboxes must be > 0");
  options.root = common.root;
  options.write_fleet_file = !vm["no-fleet-file"].as<bool>();
  Status served = launcher::serveUntilSignal(options);
  if (!served.ok()) return reportError(inv, served.error());
  return kExitOk;
}

}  // namespace dsec::cli
