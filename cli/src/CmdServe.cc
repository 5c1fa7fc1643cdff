// dsec serve: the embedded single-node fleet, in the foreground until SIGINT/SIGTERM. Its node flags are
// dsec-launch's too (NodeOptionTable.h).
#include "Commands.h"
#include "dsec/launcher/api/NodeOptionTable.h"
#include "dsec/launcher/api/Serve.h"

namespace dsec::cli {

int cmdServe(const Invocation& inv) {
  CommonOptions common;
  launcher::ServeOptions options;
  po::options_description desc("options");
  addCommonOptions(desc, &common, false);
  // --root is the common one: every dsec command takes it.
  launcher::NodeOptionTable table(&options, {.root = false, .listen = true});
  table.addTo(desc);
  desc.add_options()("no-fleet-file", po::bool_switch(), "do not write the fleet file");
  po::variables_map vm;
  if (!parseCommandLine(inv, inv.args, desc, {}, "[--listen ADDR:PORT] [--root DIR] [--fleet-name NAME]", &vm,
                        &common)) {
    return kExitOk;
  }
  options.node.root = common.root;
  if (Status st = table.apply(vm); !st.ok()) throw UsageError(st.error().message());
  options.write_fleet_file = !vm["no-fleet-file"].as<bool>();
  Status served = launcher::serveUntilSignal(options);
  if (!served.ok()) return reportError(inv, served.error());
  return kExitOk;
}

}  // namespace dsec::cli
