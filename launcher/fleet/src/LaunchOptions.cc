#include "dsec/launcher/fleet/LaunchOptions.h"

#include <boost/program_options.hpp>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "dsec/common/Endpoint.h"
#include "dsec/launcher/api/NodeOptionTable.h"

namespace dsec::launcher::fleet {
namespace po = boost::program_options;

namespace {

constexpr NodeTableParts kLaunchParts{.root = true, .listen = false, .node_name = false};

// Fleet defaults before parsing: $DSEC_FLEET names the fleet, else the default every front shares.
LaunchOptions launchDefaults() {
  LaunchOptions o;
  const char* env_fleet = std::getenv("DSEC_FLEET");
  if (env_fleet != nullptr && *env_fleet != '\0') o.serve.node.fleet_name = env_fleet;
  o.serve.write_fleet_file = false;  // rank 0 writes the fleet's (the gateway's) fleet file
  return o;
}

// The flags of the fleet itself (the node's come from the table).
void addFleetFlags(po::options_description& desc, LaunchOptions* o) {
  auto add = desc.add_options();
  add("help,h", "print this help");
  add("fleet", po::value<std::string>(), "fleet name (the same as --fleet-name; env DSEC_FLEET)");
  add("node-name", po::value<std::string>(&o->node_name), "node name (default: the Slurm node's, made [a-z0-9-])");
  add("state-dir", po::value<std::string>(&o->state_dir),
      "this node's token, state and mounts (default ROOT/nodes/NODE)");
  add("address", po::value<std::string>(&o->address),
      "address other nodes reach this one at (default: the interface that routes to srun's host)");
  add("node-port", po::value<int>(&o->node_port)->default_value(o->node_port), "this node's API port (0: a free one)");
  add("port", po::value<int>(&o->port)->default_value(o->port),
      "the gateway's port (0: a free one, kept across gateway restarts)");
  add("gateways", po::value<int>(&o->gateways)->default_value(o->gateways),
      "how many ranks (0..K-1) run a gateway; clients fail over between them");
  add("join", po::value<std::string>(&o->join), "add this job's nodes to the running fleet NAME (no MPI)");
  add("drain-timeout", po::value<double>(&o->drain_timeout)->default_value(o->drain_timeout),
      "seconds a leaving --join node lets its sandboxes finish");
  add("no-mpi", po::bool_switch(&o->no_mpi), "a one-node fleet without MPI");
  add("lost-after", po::value<double>(&o->lost_after)->default_value(o->lost_after),
      "seconds without a heartbeat before the gateway calls a node lost");
  add("gateway-run-code-listen", po::value<std::string>(&o->gateway_run_code_listen),
      "ADDR:PORT of each gateway's second listener, WITHOUT authentication, serving only POST /run_code (bind it "
      "to a private address; docs/security.md)");
  add("gateway-e2b-listen", po::value<std::string>(&o->gateway_e2b.listen),
      "ADDR:PORT of each gateway's E2B-compatible listener (docs/e2b.md)");
  add("gateway-e2b-template", po::value<std::vector<std::string>>()->composing(),
      "NAME=IMAGE: the dsec image an E2B template id creates (repeatable)");
  add("gateway-e2b-default-image", po::value<std::string>(&o->gateway_e2b.default_image),
      "the image of E2B's default template 'base' and of templates --gateway-e2b-template does not name");
  add("gateway-only", po::bool_switch(&o->gateway_only), "run as the gateway process (started by rank 0)");
  add("gateway-config", po::value<std::string>(&o->gateway_config),
      "the gateway process's settings (written by rank 0)");
}

// Flags that are refused with a reason rather than an "unrecognised option": the gateway once had static
// admission ratios of its own. Admission is each node's (its density controller's live ratios), and a ratio a
// caller asks for is enforced or refused, never dropped.
constexpr const char* kGoneFlags[] = {"cpu-overcommit", "memory-overcommit"};

po::options_description goneFlags() {
  po::options_description gone("refused");
  for (const char* flag : kGoneFlags) gone.add_options()(flag, po::value<std::string>());
  return gone;
}

Status refuseGoneFlags(const po::variables_map& vm) {
  for (const char* flag : kGoneFlags) {
    if (vm.count(flag) == 0) continue;
    std::string resource = std::string(flag) == "cpu-overcommit" ? "cpu" : "memory";
    return Error::invalid("--" + std::string(flag) +
                          " is refused: the gateway has no admission ratio of its own; admission is each node's, "
                          "by its density controller's live ratios (set --" +
                          resource + "-ratio-start, --" + resource + "-ratio-min and --" + resource +
                          "-ratio-max for the nodes, or --overcommit off; docs/density.md)");
  }
  return okStatus();
}

po::options_description launchDescription(LaunchOptions* o, NodeOptionTable* table) {
  po::options_description fleet("fleet options", 120, 60);
  addFleetFlags(fleet, o);
  po::options_description node("node options (the same as dsec serve's)", 120, 60);
  table->addTo(node);
  po::options_description all(120, 60);
  all.add(fleet).add(node);
  return all;
}

Status checkFleetFlags(const LaunchOptions& o) {
  auto bad = [](const std::string& flag, const std::string& what) { return Error::invalid("--" + flag + " " + what); };
  if (o.node_port < 0 || o.node_port > 65535) return bad("node-port", "wants 0..65535");
  if (o.port < 0 || o.port > 65535) return bad("port", "wants 0..65535");
  if (o.gateways < 1 || o.gateways > 16) return bad("gateways", "wants 1..16");
  if (!std::isfinite(o.drain_timeout) || o.drain_timeout < 0) return bad("drain-timeout", "must be >= 0 seconds");
  if (!std::isfinite(o.lost_after) || o.lost_after < 0.5) return bad("lost-after", "must be >= 0.5 seconds");
  if (!o.gateway_run_code_listen.empty()) {
    if (auto address = parseListenAddress(o.gateway_run_code_listen); !address.ok()) {
      return bad("gateway-run-code-listen", address.error().message());
    }
  }
  DSEC_TRY(validateE2bOptions(o.gateway_e2b, "gateway-"));
  if (o.gateway_only && o.gateway_config.empty()) return Error::invalid("--gateway-only wants --gateway-config FILE");
  return okStatus();
}

// --fleet, --fleet-name and --join name one fleet.
Status resolveFleetName(const po::variables_map& vm, LaunchOptions* o) {
  std::string& name = o->serve.node.fleet_name;
  bool named = !vm["fleet-name"].defaulted();
  for (const char* flag : {"fleet", "join"}) {
    if (vm.count(flag) == 0) continue;
    std::string v = vm[flag].as<std::string>();
    if (named && v != name)
      return Error::invalid("--" + std::string(flag) + " " + v + " names another fleet than " + name);
    name = v;
    named = true;
  }
  return okStatus();
}

}  // namespace

Result<LaunchOptions> parseLaunchOptions(const std::vector<std::string>& args) {
  LaunchOptions o = launchDefaults();
  NodeOptionTable table(&o.serve, kLaunchParts);
  po::options_description desc = launchDescription(&o, &table);
  po::options_description parsed;
  parsed.add(desc).add(goneFlags());  // recognised only to be refused with the reason; not in --help
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(parsed).run(), vm);
    if (vm.count("help") != 0) {
      o.help = true;
      return o;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    return Error::invalid(e.what());
  }
  DSEC_TRY(refuseGoneFlags(vm));
  DSEC_TRY(resolveFleetName(vm, &o));
  DSEC_TRY(table.apply(vm));
  if (vm.count("gateway-e2b-template") != 0) {
    for (const auto& spec : vm["gateway-e2b-template"].as<std::vector<std::string>>()) {
      if (Status st = addE2bTemplate(o.gateway_e2b, spec); !st.ok()) {
        return Error::invalid("--gateway-e2b-template: " + st.error().message());
      }
    }
  }
  DSEC_TRY(checkFleetFlags(o));
  return o;
}

std::string launchUsage() {
  LaunchOptions o = launchDefaults();
  NodeOptionTable table(&o.serve, kLaunchParts);
  std::ostringstream out;
  out << "usage: dsec-launch [OPTIONS]                      one rank per node (srun --mpi=pmix, or mpirun)\n"
         "       dsec-launch --join NAME [OPTIONS]          add this job's nodes to the running fleet NAME\n"
         "       dsec-launch --gateway-only --gateway-config FILE   the gateway process (started by rank 0)\n"
         "Every node option is dsec serve's too.\n\n"
      << launchDescription(&o, &table);
  return out.str();
}

}  // namespace dsec::launcher::fleet
