// dsec bench gateway: the control plane's create rate. One process holds a simulated cell: N node agents in
// simulate mode (NodeOptions::simulate: creates are validated and admitted, sandboxes hold no processes), each
// with its own node API on 127.0.0.1, and the real Gateway (placement, forwarding, watcher probing every node
// each second) on its own listener. A load generator with C keep-alive connections creates sandboxes through
// the gateway, so every create takes the real path: client -> gateway HTTP -> placement -> node HTTP API ->
// validation and admission -> response. The nodes' own books are checked afterwards (every success is a
// sandbox on the node its id names) and give the spread. The last line is one JSON object.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>

#include "BenchGatewayLoad.h"
#include "BenchSupport.h"
#include "Progress.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/api/ApiServer.h"
#include "dsec/launcher/api/HttpServer.h"
#include "dsec/launcher/fleet/Gateway.h"
#include "dsec/launcher/node/Metrics.h"
#include "dsec/launcher/node/NodeAgent.h"

namespace dsec::cli {
namespace {

using nlohmann::json;

struct SimulatedNode {
  std::string name;
  launcher::Metrics metrics;
  std::unique_ptr<launcher::NodeAgent> agent;
  std::unique_ptr<launcher::ApiServer> api;
  std::unique_ptr<launcher::HttpServer> http;
};

Result<std::unique_ptr<SimulatedNode>> startNode(const std::string& root, const std::string& name,
                                                 const std::string& token, int64_t memory_bytes, bool cpu_qos) {
  auto node = std::make_unique<SimulatedNode>();
  node->name = name;
  launcher::NodeOptions o;
  o.root = root;
  o.node_name = name;
  o.fleet_name = "bench";
  o.max_sandboxes = int64_t{1} << 30;
  o.simulate = true;
  o.cpu_qos = cpu_qos;  // on: each create also books its cores in the node model, as on a real node
  o.memory_capacity_bytes = memory_bytes;
  DSEC_ASSIGN_OR_RETURN(node->agent, launcher::NodeAgent::start(o, &node->metrics));
  node->api = std::make_unique<launcher::ApiServer>(node->agent.get(), token);
  launcher::HttpServerOptions ho;
  ho.listen = "127.0.0.1:0";
  DSEC_ASSIGN_OR_RETURN(node->http, launcher::HttpServer::start(ho, node->api.get()));
  return node;
}

double round3(double v) { return std::round(v * 1000) / 1000; }

struct GatewayBenchConfig {
  int nodes = 0;
  int count = 0;
  int concurrency = 0;
  int warmup = 0;
  double node_cpus = 0;
  int64_t node_memory = 0;
  std::string body;
  bool cpu_qos = true;
  bool gateway_pool = true;
  bool keep_dir = false;
};

void addGatewayBenchOptions(po::options_description& desc) {
  desc.add_options()("simulated-nodes", po::value<int>()->default_value(160), "simulated node agents")(
      "count", po::value<int>()->default_value(50000), "sandboxes to create (measured)")(
      "concurrency", po::value<int>()->default_value(32), "load generator connections, one thread each")(
      "warmup", po::value<int>()->default_value(-1), "creates before the measurement (default: count/10, <= 5000)")(
      "node-cpus", po::value<double>()->default_value(192), "CPUs each simulated node registers (2x96 cores)")(
      "node-memory", po::value<std::string>()->default_value("1536G"), "memory each simulated node registers")(
      "body", po::value<std::string>(), "create request body (default: an image, 1 CPU, 512M, a label)")(
      "no-cpu-qos", po::bool_switch(), "simulated nodes without CPU QoS (no core booking per create)")(
      "no-pool", po::bool_switch(), "the gateway opens a connection per create (no keep-alive pool), to compare")(
      "keep-dir", po::bool_switch(), "keep the nodes' state directory (printed) instead of removing it");
}

GatewayBenchConfig gatewayBenchConfig(const po::variables_map& vm) {
  GatewayBenchConfig c;
  c.nodes = vm["simulated-nodes"].as<int>();
  c.count = vm["count"].as<int>();
  c.concurrency = vm["concurrency"].as<int>();
  c.warmup = vm["warmup"].as<int>();
  c.node_cpus = vm["node-cpus"].as<double>();
  c.node_memory = parseSizeOption("node-memory", vm["node-memory"].as<std::string>());
  if (c.nodes <= 0 || c.nodes > 4096) throw UsageError("--simulated-nodes must be in 1..4096");
  if (c.count <= 0) throw UsageError("--count must be > 0");
  if (c.concurrency <= 0 || c.concurrency > 1024) throw UsageError("--concurrency must be in 1..1024");
  if (!(c.node_cpus > 0)) throw UsageError("--node-cpus must be > 0");
  if (c.node_memory <= 0) throw UsageError("--node-memory must be > 0");
  if (c.warmup < 0) c.warmup = std::min(5000, c.count / 10);
  c.body = vm.count("body") != 0
               ? vm["body"].as<std::string>()
               : R"({"image":"debian:12+python:3.11","cpus":1,"memory":"512M","labels":{"bench":"gateway"}})";
  c.cpu_qos = !vm["no-cpu-qos"].as<bool>();
  c.gateway_pool = !vm["no-pool"].as<bool>();
  c.keep_dir = vm["keep-dir"].as<bool>();
  return c;
}

// The state directory of the simulated nodes, removed at the end unless --keep-dir.
struct BenchDir {
  std::string path;
  bool keep = false;
  ~BenchDir() {
    std::error_code ec;
    if (!keep && !path.empty()) std::filesystem::remove_all(path, ec);
  }
};

// The simulated cell: its nodes, and the gateway with its listener over them.
struct SimulatedCell {
  std::vector<std::unique_ptr<SimulatedNode>> nodes;
  std::unique_ptr<launcher::Gateway> gateway;
  std::unique_ptr<launcher::HttpServer> gateway_http;

  void stop() {
    gateway_http->stop();
    gateway->stop();
  }
};

Result<SimulatedCell> startCell(const GatewayBenchConfig& c, const std::string& dir, const std::string& token) {
  SimulatedCell cell;
  cell.nodes.reserve(static_cast<size_t>(c.nodes));
  for (int i = 0; i < c.nodes; ++i) {
    std::string name = "sim" + std::to_string(i);
    auto node = startNode(dir + "/" + name, name, token, c.node_memory, c.cpu_qos);
    if (!node.ok()) return node.error().wrap("starting simulated node " + name);
    cell.nodes.push_back(std::move(*node));
  }
  launcher::GatewayOptions go;
  go.fleet_name = "bench";
  go.token = token;
  go.seed = 1;
  go.pool_connections = c.gateway_pool;
  cell.gateway = std::make_unique<launcher::Gateway>(go);
  for (const auto& n : cell.nodes) {
    launcher::FleetNodeSpec spec;
    spec.name = n->name;
    spec.endpoint = n->http->endpoint();
    spec.cpus = c.node_cpus;
    spec.memory_bytes = c.node_memory;
    DSEC_TRY(cell.gateway->registerNode(spec, /*from_seed=*/true));
  }
  cell.gateway->start();
  launcher::HttpServerOptions gho;
  gho.listen = "127.0.0.1:0";
  gho.max_connections = c.concurrency + 256;
  auto gateway_http = launcher::HttpServer::start(gho, cell.gateway.get());
  if (!gateway_http.ok()) return gateway_http.error().wrap("starting the gateway's listener");
  cell.gateway_http = std::move(*gateway_http);
  return cell;
}

// The nodes' own books: every success must be a sandbox on the node its id names.
struct NodeBooks {
  int64_t created = 0;  // by the load's count
  int64_t held = 0;     // by the nodes' count
  int mismatched_nodes = 0;
  int64_t min_per_node = 0, max_per_node = 0;
  double mean_per_node = 0;
  bool match() const { return mismatched_nodes == 0 && held == created; }
};

NodeBooks checkBooks(const SimulatedCell& cell, const std::vector<std::string>& ids) {
  NodeBooks books;
  std::map<std::string, int64_t> created_by_id_node;
  for (const auto& id : ids) created_by_id_node[launcher::nodeOfSandboxId(id)]++;
  books.created = static_cast<int64_t>(ids.size());
  std::vector<int64_t> per_node;
  for (const auto& n : cell.nodes) {
    auto held = static_cast<int64_t>(n->agent->sandboxCount());
    per_node.push_back(held);
    books.held += held;
    if (created_by_id_node[n->name] != held) ++books.mismatched_nodes;
  }
  books.min_per_node = *std::min_element(per_node.begin(), per_node.end());
  books.max_per_node = *std::max_element(per_node.begin(), per_node.end());
  books.mean_per_node = static_cast<double>(books.held) / static_cast<double>(per_node.size());
  return books;
}

// Destroys every sandbox and stops the nodes; the seconds it took.
double stopNodes(SimulatedCell& cell) {
  double t_down = monotonicSeconds();
  for (auto& n : cell.nodes) n->http->stop();
  for (auto& n : cell.nodes) n->agent->shutdown(/*destroy_sandboxes=*/true);
  return monotonicSeconds() - t_down;
}

// What was measured, for the report.
struct GatewayBenchRun {
  CreateLoadResult load;
  NodeBooks books;
  double load_before = 0, load_after = 0;  // load averages
  double down_seconds = 0;
};

void printReport(const GatewayBenchConfig& c, const GatewayBenchRun& run, const std::string& dir) {
  const auto& latencies = run.load.latencies_ms;
  const NodeBooks& b = run.books;
  double wall = run.load.end - run.load.measure_start;
  auto measured = static_cast<double>(latencies.size());
  double per_second = wall > 0 ? measured / wall : 0;
  double cores = run.load.cpu_seconds / (run.load.end - run.load.wall_start);
  std::printf(
      "created %.0f sandboxes in %.3f s: %.0f creates/s, %d failures (load average %.2f before, %.2f after; "
      "process CPU %.2f s = %.2f cores)\n",
      measured, wall, per_second, run.load.failures, run.load_before, run.load_after, run.load.cpu_seconds, cores);
  std::printf("latency: p50 %.3f ms  p90 %.3f ms  p99 %.3f ms  max %.3f ms\n", percentile(latencies, 50),
              percentile(latencies, 90), percentile(latencies, 99), percentile(latencies, 100));
  std::printf(
      "spread over %d nodes: min %lld  max %lld  mean %.1f  (max/mean %.3f); nodes hold %lld of %lld created%s\n",
      c.nodes, static_cast<long long>(b.min_per_node), static_cast<long long>(b.max_per_node), b.mean_per_node,
      b.mean_per_node > 0 ? static_cast<double>(b.max_per_node) / b.mean_per_node : 0.0, static_cast<long long>(b.held),
      static_cast<long long>(b.created), b.mismatched_nodes ? " (MISMATCH)" : "");
  std::printf("destroyed all and stopped the nodes in %.2f s\n", run.down_seconds);
  if (!run.load.first_error.empty()) std::printf("first failure: %s\n", run.load.first_error.c_str());
  if (c.keep_dir) std::printf("state directory kept: %s\n", dir.c_str());
  json summary{
      {"creates_per_second", std::round(per_second)},
      {"p50_ms", round3(percentile(latencies, 50))},
      {"p99_ms", round3(percentile(latencies, 99))},
      {"failures", run.load.failures},
      {"nodes", c.nodes},
      {"count", c.count},
      {"warmup", c.warmup},
      {"concurrency", c.concurrency},
      {"gateway_pool", c.gateway_pool},
      {"seconds", round3(wall)},
      {"spread",
       {{"min", b.min_per_node},
        {"max", b.max_per_node},
        {"mean", std::round(b.mean_per_node * 10) / 10},
        {"max_over_mean", b.mean_per_node > 0 ? round3(static_cast<double>(b.max_per_node) / b.mean_per_node) : 0.0}}},
      {"held_on_nodes", b.held},
      {"created", b.created},
      {"books_match", b.match()},
      {"load_average_1m", run.load_after},
      {"load_average_1m_before", run.load_before},
      {"process_cpu_cores", round3(run.load.cpu_seconds / std::max(1e-9, run.load.end - run.load.wall_start))}};
  std::fflush(stdout);
  std::cout << summary.dump() << std::endl;
}

}  // namespace

int benchGateway(const Invocation& inv) {
  CommonOptions common;
  po::options_description desc("options");
  addCommonOptions(desc, &common, false);
  addGatewayBenchOptions(desc);
  po::variables_map vm;
  if (!parseCommandLine(inv, inv.args, desc, {}, "--simulated-nodes 160 --count N [--concurrency C]", &vm, &common)) {
    return kExitOk;
  }
  const GatewayBenchConfig c = gatewayBenchConfig(vm);
  raiseFileLimit();
  // 160 nodes each announcing themselves would bury the figures: warnings only, unless --log-level says more.
  if (common.log_level.empty()) setLogLevel(LogLevel::kWarn);
  char dir_template[] = "/tmp/dsec-bench-gateway-XXXXXX";
  if (::mkdtemp(dir_template) == nullptr) return reportError(inv, Error::sys(errno, "mkdtemp"));
  BenchDir dir{dir_template, c.keep_dir};

  std::string token = randomHex(64);
  GatewayBenchRun run;
  run.load_before = loadAverage1m();
  double t_start = monotonicSeconds();
  Progress progress("bench gateway");
  progress.step("starting " + std::to_string(c.nodes) + " simulated nodes");
  auto cell = startCell(c, dir.path, token);
  if (!cell.ok()) return reportError(inv, cell.error());
  int port = cell->gateway_http->port();
  std::printf("bench gateway: %d simulated nodes (%.0f CPUs, %s each) started in %.2f s; gateway on %s\n", c.nodes,
              c.node_cpus, formatBytes(c.node_memory).c_str(), monotonicSeconds() - t_start,
              cell->gateway_http->endpoint().c_str());
  std::printf("%d creates (after %d warm-up) at concurrency %d, body %s\n", c.count, c.warmup, c.concurrency,
              c.body.c_str());
  std::fflush(stdout);

  CreateLoad load;
  load.port = port;
  load.request =
      "POST /v1/sandboxes HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) + "\r\nAuthorization: Bearer " + token +
      "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(c.body.size()) + "\r\n\r\n" + c.body;
  load.warmup = c.warmup;
  load.count = c.count;
  load.concurrency = c.concurrency;
  load.progress = &progress;
  progress.step("creates through the gateway", c.warmup + c.count);
  run.load = runCreateLoad(load);
  run.load_after = loadAverage1m();
  progress.step("checking the books and stopping the nodes");
  run.books = checkBooks(*cell, run.load.ids);
  cell->stop();
  run.down_seconds = stopNodes(*cell);
  progress.finish();
  printReport(c, run, dir.path);
  return run.load.failures == 0 && run.books.match() ? kExitOk : kExitFailure;
}

}  // namespace dsec::cli
