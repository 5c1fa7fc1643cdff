// dsec serve: the embedded single-node fleet, in the foreground until SIGINT/SIGTERM.
#include "Commands.h"
#include "dsec/launcher/api/Serve.h"

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
      "admission limit of this node")("no-fleet-file", po::bool_switch(), "do not write the fleet file")(
      "simulate", po::bool_switch(&options.simulate),
      "simulated node: admits sandboxes without starting them (no processes; exec and files get 501)")(
      "overcommit", po::value<std::string>()->default_value("on"),
      "on: overcommit under the density controller; off: static limits (ratio 1.0, no actions)")(
      "memory-capacity", po::value<std::string>(), "memory admission counts against (default: physical memory)")(
      "cpu-qos", po::value<std::string>()->default_value("on"),
      "on: latency sandboxes get dedicated cores, batch ones SCHED_IDLE on the rest; off: every sandbox plain")(
      "user-namespaces", po::value<std::string>()->default_value("on"),
      "on: every sandbox's root is an unprivileged host id range of its own; off: an explicit opt-out for kernels "
      "without user namespaces or idmapped mounts (sandbox root is then host root; logged, shown in /v1/node)")(
      "fncall-image", po::value<std::string>(&options.fncall.image)->default_value(options.fncall.image),
      "default image of POST /v1/call (examples/rollout.py builds debian:12+python:3.11)")(
      "fncall-workers", po::value<int>(&options.fncall.max_workers)->default_value(options.fncall.max_workers),
      "warm fncall workers at most (0 disables fncall)")(
      "fncall-queue-wait",
      po::value<double>(&options.fncall.queue_wait_seconds)->default_value(options.fncall.queue_wait_seconds),
      "seconds a call waits for a free worker before 429 capacity")(
      "max-connections", po::value<int>(&options.max_connections)->default_value(options.max_connections),
      "HTTP connections (one thread each) in all; more get 503")(
      "max-client-connections",
      po::value<int>(&options.max_client_connections)->default_value(options.max_client_connections),
      "connections one client (a local user, or a remote address) may hold before they carry the token; more "
      "wait up to 2 s, then get 429 (0: min(64, max-connections / 2))")(
      "header-timeout",
      po::value<double>(&options.header_timeout_seconds)->default_value(options.header_timeout_seconds),
      "seconds a request head (request line and headers) may take to arrive; later: 408 and closed")(
      "body-timeout", po::value<double>(&options.body_timeout_seconds)->default_value(options.body_timeout_seconds),
      "seconds a request body may take on top of what --body-min-rate allows for its size")(
      "body-min-rate", po::value<std::string>()->default_value("64k"),
      "bytes per second a request body must average after --body-timeout (slower: 408 and closed)")(
      "output-budget", po::value<std::string>(),
      "buffered exec and call output the node holds at once; over it: 429 (default: memory / 16, 64M..1G)");
  po::variables_map vm;
  if (!parseCommandLine(inv, inv.args, desc, {}, "[--listen ADDR:PORT] [--root DIR] [--fleet-name NAME]", &vm,
                        &common)) {
    return kExitOk;
  }
  if (options.listen.find(':') == std::string::npos) throw UsageError("--listen wants ADDR:PORT");
  if (options.max_sandboxes <= 0) throw UsageError("--max-sandboxes must be > 0");
  if (options.fncall.max_workers < 0) throw UsageError("--fncall-workers must be >= 0");
  if (!(options.fncall.queue_wait_seconds >= 0)) throw UsageError("--fncall-queue-wait must be >= 0");
  std::string overcommit = vm["overcommit"].as<std::string>();
  if (overcommit != "on" && overcommit != "off") throw UsageError("--overcommit wants on or off");
  options.density.overcommit = overcommit == "on";
  std::string cpu_qos = vm["cpu-qos"].as<std::string>();
  if (cpu_qos != "on" && cpu_qos != "off") throw UsageError("--cpu-qos wants on or off");
  options.cpu_qos = cpu_qos == "on";
  std::string user_namespaces = vm["user-namespaces"].as<std::string>();
  if (user_namespaces != "on" && user_namespaces != "off") throw UsageError("--user-namespaces wants on or off");
  options.user_namespaces = user_namespaces == "on";
  if (options.max_connections <= 0) throw UsageError("--max-connections must be > 0");
  if (options.max_client_connections < 0) throw UsageError("--max-client-connections must be >= 0");
  if (!(options.header_timeout_seconds > 0)) throw UsageError("--header-timeout must be > 0");
  if (!(options.body_timeout_seconds > 0)) throw UsageError("--body-timeout must be > 0");
  options.body_min_rate = static_cast<double>(parseSizeOption("body-min-rate", vm["body-min-rate"].as<std::string>()));
  if (!(options.body_min_rate > 0)) throw UsageError("--body-min-rate must be > 0");
  if (vm.count("output-budget")) {
    int64_t budget = parseSizeOption("output-budget", vm["output-budget"].as<std::string>());
    if (budget < (1 << 20)) throw UsageError("--output-budget must be at least 1M");
    options.output_budget_bytes = static_cast<uint64_t>(budget);
  }
  if (vm.count("memory-capacity")) {
    options.memory_capacity_bytes = parseSizeOption("memory-capacity", vm["memory-capacity"].as<std::string>());
  }
  options.root = common.root;
  options.write_fleet_file = !vm["no-fleet-file"].as<bool>();
  Status served = launcher::serveUntilSignal(options);
  if (!served.ok()) return reportError(inv, served.error());
  return kExitOk;
}

}  // namespace dsec::cli
