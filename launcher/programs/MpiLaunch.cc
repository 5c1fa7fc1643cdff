// MPI only coordinates the start: rank 0 makes the fleet token, every rank starts its node agent, the ranks
// exchange endpoints and capacity once, ranks 0..K-1 start a gateway each (a supervised child process, restarted if
// it dies; several, so that the fleet outlives rank 0's node) and rank 0 writes the fleet file naming them. Then
// every rank leaves MPI and talks HTTP only, so a dead rank does not take the others down.
#include "MpiLaunch.h"

#include <arpa/inet.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/api/Credentials.h"
#include "dsec/launcher/api/StopSignals.h"
#include "dsec/launcher/fleet/GatewayProcess.h"
#include "dsec/launcher/fleet/LaunchNode.h"

namespace dsec::launcher {
namespace {

using fleet::LaunchOptions;
using fleet::RunningNode;
using nlohmann::json;
constexpr const char* kLog = "launch";
constexpr int kBlob = 1024;

struct World {
  bool mpi = false;
  int rank = 0;
  int size = 1;
};

World initMpi(const LaunchOptions& options, int* argc, char*** argv) {
  World w;
  w.mpi = !options.no_mpi;
  if (w.mpi) {
    int provided = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &w.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &w.size);
  }
  return w;
}

// Leaves MPI once start-up is over. A rank that stays a PMIx client would take the whole step down when it dies:
// the PMIx server in slurmstepd kills every task of the step on a client's lost connection, whatever
// --kill-on-bad-exit says. A finalized rank can die (and be replaced through --join) without touching the others.
// A peer that died before its fence can hold MPI_Finalize for ever, so it gets a bounded time, then this rank exits.
void finalizeMpiWithin(double seconds, int exit_code_on_timeout) {
  std::promise<void> finished;
  std::thread watchdog([done = finished.get_future(), seconds, exit_code_on_timeout] {
    if (done.wait_for(std::chrono::duration<double>(seconds)) == std::future_status::ready) return;
    DSEC_LOG(kError, kLog) << "MPI_Finalize did not end within " << seconds << " s (a peer rank died): exiting";
    ::_exit(exit_code_on_timeout);
  });
  MPI_Finalize();
  finished.set_value();
  watchdog.join();
}

// 1. The fleet token: rank 0 makes it.
std::string broadcastToken(const World& w) {
  char token_buf[65] = {};
  if (w.rank == 0) std::snprintf(token_buf, sizeof(token_buf), "%s", randomHex(64).c_str());
  if (w.mpi) MPI_Bcast(token_buf, sizeof(token_buf), MPI_CHAR, 0, MPI_COMM_WORLD);
  return token_buf;
}

// 3. Every rank's name, endpoint and capacity (or its start error) to every rank; the same table on each, so a
// failure stops every rank. Returns the table, or the failure.
Result<json> exchangeNodes(const World& w, const Result<RunningNode>& node) {
  std::string blob_text =
      node.ok() ? json{{"name", node->name},
                       {"endpoint", node->endpoint},
                       {"capacity", {{"cpus", node->capacity.cpus}, {"memory_bytes", node->capacity.memory_bytes}}}}
                      .dump()
                : json{{"error", node.error().message()}}.dump();
  std::vector<char> mine(kBlob, 0), all(static_cast<size_t>(kBlob) * w.size, 0);
  std::snprintf(mine.data(), kBlob, "%s", blob_text.c_str());
  if (w.mpi) {
    MPI_Allgather(mine.data(), kBlob, MPI_CHAR, all.data(), kBlob, MPI_CHAR, MPI_COMM_WORLD);
  } else {
    all = mine;
  }
  json nodes = json::array();
  std::map<std::string, int> names;
  for (int r = 0; r < w.size; ++r) {
    auto j = json::parse(std::string(all.data() + static_cast<size_t>(r) * kBlob), nullptr, false);
    if (!j.is_object() || j.contains("error")) {
      return Error::internal("rank " + std::to_string(r) + " could not start its node: " +
                             (j.is_object() ? j["error"].get<std::string>() : std::string("?")));
    }
    if (names.count(j["name"])) {
      return Error::invalid("ranks " + std::to_string(names[j["name"]]) + " and " + std::to_string(r) +
                            " are both node " + j["name"].get<std::string>() +
                            ": run one rank per node (--ntasks-per-node=1)");
    }
    names[j["name"]] = r;
    nodes.push_back(j);
  }
  return nodes;
}

// 4. Ranks 0..K-1: a gateway process each (the candidates), from a config file in the node's state dir. Returns
// the gateway's URL ("" if it did not start).
std::string startGateway(const LaunchOptions& options, const std::string& fleet_dir, const std::string& token,
                         const json& nodes, std::unique_ptr<fleet::GatewaySupervisor>* supervisor) {
  const std::string& fleet_name = options.serve.node.fleet_name;
  fleet::GatewayProcessConfig config;
  config.fleet_name = fleet_name;
  config.token_file = fleet_dir + "/fleet-token";
  config.seed_file = fleet_dir + "/fleet-nodes.json";
  config.port_file = fleet_dir + "/gateway-port";
  config.port = options.port;
  config.lost_after_seconds = options.lost_after;
  config.http = options.serve.http;
  config.run_code_listen = options.gateway_run_code_listen;
  config.e2b = options.gateway_e2b;
  for (const auto& [path, text] :
       {std::pair{config.token_file, token},
        std::pair{config.seed_file, json{{"fleet", fleet_name}, {"nodes", nodes}}.dump(2)}}) {
    if (auto st = writeFileAtomic(path, text, 0600); !st.ok()) {
      DSEC_LOG(kError, kLog) << "the gateway cannot start: " << st.error().message();
      return "";
    }
  }
  *supervisor = std::make_unique<fleet::GatewaySupervisor>(config, fleet_dir + "/gateway-config.json");
  auto port = (*supervisor)->start();
  if (!port.ok()) {
    DSEC_LOG(kError, kLog) << port.error().message();
    return "";
  }
  std::string gateway = "http://" + fleet::advertisedAddress(options, "") + ":" + std::to_string(*port);
  return gateway;
}

// Every candidate's gateway URL to every rank, in rank order; empty when one of them did not start (the fleet
// then stops, as when a node fails to start).
std::vector<std::string> gatherGateways(const World& w, int candidates, const std::string& mine) {
  constexpr int kUrl = 256;
  std::vector<char> own(kUrl, 0), all(static_cast<size_t>(kUrl) * w.size, 0);
  std::snprintf(own.data(), kUrl, "%s", mine.c_str());
  if (w.mpi) {
    MPI_Allgather(own.data(), kUrl, MPI_CHAR, all.data(), kUrl, MPI_CHAR, MPI_COMM_WORLD);
  } else {
    all = own;
  }
  std::vector<std::string> gateways;
  for (int r = 0; r < candidates; ++r) {
    std::string url(all.data() + static_cast<size_t>(r) * kUrl);
    if (url.empty()) return {};
    gateways.push_back(url);
  }
  return gateways;
}

// Every rank's own address (where its agent and, on ranks 0..K-1, its gateway listen), to every rank: no sandbox of
// the fleet reaches them, whatever its egress policy (their IPv4 literals go to --egress-never).
std::vector<std::string> gatherFleetAddresses(const World& w, const LaunchOptions& options) {
  constexpr int kAddress = 64;
  std::vector<char> own(kAddress, 0), all(static_cast<size_t>(kAddress) * w.size, 0);
  std::snprintf(own.data(), kAddress, "%s", fleet::advertisedAddress(options, "").c_str());
  if (w.mpi) {
    MPI_Allgather(own.data(), kAddress, MPI_CHAR, all.data(), kAddress, MPI_CHAR, MPI_COMM_WORLD);
  } else {
    all = own;
  }
  std::vector<std::string> out;
  for (int r = 0; r < w.size; ++r) {
    std::string address(all.data() + static_cast<size_t>(r) * kAddress);
    in_addr parsed{};
    if (inet_pton(AF_INET, address.c_str(), &parsed) == 1) out.push_back(address);
  }
  return out;
}

// After MPI: registers and heartbeats with every gateway over HTTP until stopped, then takes the node down.
int serveFleet(const LaunchOptions& options, const World& w, const std::vector<std::string>& gateways,
               const std::string& token, RunningNode& node, fleet::GatewaySupervisor* supervisor) {
  const std::string& fleet_name = options.serve.node.fleet_name;
  fleet::NodeRegistrar registrar(fleet::registrarOptions(gateways, token, node));
  registrar.start();
  if (w.rank == 0) {
    std::string listed;
    for (const auto& g : gateways) listed += (listed.empty() ? "" : ", ") + g;
    DSEC_LOG(kInfo, kLog) << "fleet " << fleet_name << " of " << w.size << " nodes serving on " << listed
                          << " (fleet file " << fleetFilePath(fleet_name) << ")";
  }
  fleet::runUntilStopped(node, registrar);
  DSEC_LOG(kInfo, kLog) << "node " << node.name << " stopping: destroying its sandboxes";
  // Quickest first: mpirun follows its SIGTERM with a SIGKILL soon after. Any gateway rank removes the fleet
  // file (rank 0 may be the one that died).
  if (supervisor) removeFleetFileIfOurs(fleet_name, gateways.front());
  registrar.stop();
  node.node->stop(true);
  if (supervisor) supervisor->stop();
  return 0;
}

}  // namespace

int runLaunch(const LaunchOptions& options, int argc, char** argv) {
  World w = initMpi(options, &argc, &argv);
  std::string token = broadcastToken(w);
  (void)installStopSignals();
  // 2. every rank starts its node, its sandboxes closed off from every rank's address
  LaunchOptions node_launch = options;
  for (auto& address : gatherFleetAddresses(w, options)) node_launch.serve.node.egress_never.push_back(address);
  auto node = fleet::startLaunchNode(node_launch, token, "");
  auto nodes = exchangeNodes(w, node);
  if (!nodes.ok()) {
    if (node.ok()) node->node->stop(true);
    if (w.rank == 0) DSEC_LOG(kError, kLog) << nodes.error().message();
    if (w.mpi) finalizeMpiWithin(5, 1);
    return 1;
  }
  std::unique_ptr<fleet::GatewaySupervisor> supervisor;
  std::string gateway;
  int candidates = std::min(w.size, options.gateways);
  if (w.rank < candidates)
    gateway = startGateway(options, fleet::fleetStateDir(options, node->name), token, *nodes, &supervisor);
  std::vector<std::string> gateways = gatherGateways(w, candidates, gateway);
  if (gateways.empty()) {
    DSEC_LOG(kError, kLog) << "rank " << w.rank << ": a gateway did not start";
    if (w.mpi) MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
  // Rank 0 writes the fleet file once every candidate is known, so no client ever reads a partial list.
  if (w.rank == 0) {
    const auto& node_options = options.serve.node;
    if (auto st = writeFleetFile(node_options.fleet_name, gateways, token, "gateway", node_options.root,
                                 node_options.slurm_job);
        !st.ok()) {
      DSEC_LOG(kError, kLog) << "writing the fleet file: " << st.error().message();
    }
  }
  // From here on MPI is done: each rank registers and heartbeats over HTTP.
  if (w.mpi) finalizeMpiWithin(30, 1);
  return serveFleet(options, w, gateways, token, *node, supervisor.get());
}

}  // namespace dsec::launcher
