// `dsec layer serve --store DIR --listen ADDR:PORT`: the shared layer store over HTTP (StoreServer.h), for nodes
// started with `--store http://ADDR:PORT`.
#include <cstdlib>
#include <iostream>

#include "Commands.h"
#include "SharedStoreCommands.h"
#include "dsec/fs3/SharedStore.h"
#include "dsec/launcher/api/StopSignals.h"
#include "dsec/launcher/api/StoreServer.h"

namespace dsec::cli {

int layerServe(const Invocation& inv) {
  CommonOptions common;
  po::options_description desc("options");
  addCommonOptions(desc, &common, false);
  desc.add_options()("store", po::value<std::string>()->default_value(defaultStore()),
                     "the store's directory (env DSEC_STORE)")(
      "listen", po::value<std::string>()->default_value("127.0.0.1:8480"), "ADDR:PORT to serve on (port 0: any)")(
      "latency-ms", po::value<int>()->default_value(0),
      "milliseconds added to every answer (to stand in for a cluster file system's round trip)")(
      "accept-recordings", po::bool_switch(),
      "store the prefetch recordings nodes send (checked against the layer), so every node prefetches them")(
      "accept-leases", po::bool_switch(),
      "keep the leases nodes send, so `dsec layer gc` on the store's directory sees the layers they use");
  po::variables_map vm;
  if (!parseCommandLine(inv, inv.args, desc, {},
                        "--store DIR [--listen ADDR:PORT] [--latency-ms N] [--accept-recordings] [--accept-leases]",
                        &vm, &common)) {
    return kExitOk;
  }
  launcher::StoreServerOptions options;
  options.store_dir = vm["store"].as<std::string>();
  if (options.store_dir.empty()) throw UsageError("missing --store (or DSEC_STORE)");
  if (fs3::isHttpStore(options.store_dir)) throw UsageError("--store must be the store's directory");
  options.http.listen = vm["listen"].as<std::string>();
  options.latency_ms = vm["latency-ms"].as<int>();
  if (options.latency_ms < 0 || options.latency_ms > 10000) throw UsageError("--latency-ms: 0 to 10000");
  options.accept_recordings = vm["accept-recordings"].as<bool>();
  options.accept_leases = vm["accept-leases"].as<bool>();
  if (const char* token = std::getenv("DSEC_STORE_TOKEN"); token != nullptr) options.token = token;
  if (Status st = launcher::installStopSignals(); !st.ok()) return reportError(inv, st.error());
  auto server = launcher::StoreServer::start(options);
  if (!server.ok()) return reportError(inv, server.error());
  // The bound address, on its own line, for scripts that start it on port 0.
  std::cout << "serving " << options.store_dir << " at " << (*server)->endpoint() << std::endl;
  launcher::waitForStopSignal(-1);
  launcher::restoreStopSignals();
  (*server)->stop();
  const auto& stats = (*server)->stats();
  std::cout << "served " << stats.requests.load() << " requests, " << stats.chunks_served.load() << " chunks, "
            << stats.bytes_served.load() << " bytes" << std::endl;
  return kExitOk;
}

}  // namespace dsec::cli
