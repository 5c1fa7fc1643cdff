// dsec bench gateway: the control plane's create rate. One process holds a simulated cell: N node agents in
// simulate mode (NodeOptions::simulate: creates are validated and admitted, sandboxes hold no processes), each
// with its own node API on 127.0.0.1, and the real Gateway (placement, forwarding, watcher probing every node
// each second) on its own listener. A load generator with C keep-alive connections creates sandboxes through
// the gateway, so every create takes the real path: client -> gateway HTTP -> placement -> node HTTP API ->
// validation and admission -> response. The nodes' own books are checked afterwards (every success is a
// sandbox on the node its id names) and give the spread. The last line is one JSON object.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "BenchSupport.h"
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

// A lean HTTP/1.1 client on one keep-alive connection: the request bytes are built once, the answer is read
// with one recv per segment and only its status, length and "id" are looked at, so the load generator takes
// as little as possible of the CPUs it shares with what it measures.
class RawClient {
 public:
  RawClient(int port, std::string request) : port_(port), request_(std::move(request)) {}
  ~RawClient() { close(); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  // One create: the HTTP status (0 on a transport error, with *body saying what) and the body.
  int create(std::string* body) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (fd_ < 0 && !connect(body)) return 0;
      if (!sendAll()) {
        close();
        continue;  // a connection the server closed: once more on a new one
      }
      int status = readResponse(body);
      if (status == 0) close();
      return status;
    }
    *body = "cannot send to the gateway";
    return 0;
  }

 private:
  bool connect(std::string* why) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) {
      *why = std::string("socket: ") + strerror(errno);
      return false;
    }
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_port = htons(static_cast<uint16_t>(port_));
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&sin), sizeof(sin)) != 0) {
      *why = std::string("connect: ") + strerror(errno);
      close();
      return false;
    }
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    timeval tv{60, 0};  // a hung gateway fails the run instead of hanging it
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return true;
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    buf_.clear();
  }
  bool sendAll() {
    size_t off = 0;
    while (off < request_.size()) {
      ssize_t n = ::send(fd_, request_.data() + off, request_.size() - off, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }
  bool fill() {
    char tmp[16384];
    for (;;) {
      ssize_t n = ::recv(fd_, tmp, sizeof(tmp), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      buf_.append(tmp, static_cast<size_t>(n));
      return true;
    }
  }
  int readResponse(std::string* body) {
    size_t head_end;
    while ((head_end = buf_.find("\r\n\r\n")) == std::string::npos) {
      if (!fill()) {
        *body = "the gateway closed the connection or timed out";
        return 0;
      }
    }
    std::string head = toLower(buf_.substr(0, head_end));
    int status = 0;
    if (head.size() > 12 && startsWith(head, "http/1.1 ")) status = std::atoi(head.c_str() + 9);
    size_t length = 0;
    if (auto cl = head.find("\r\ncontent-length:"); cl != std::string::npos) {
      length = std::strtoull(head.c_str() + cl + 17, nullptr, 10);
    } else {
      *body = "answer without Content-Length: " + head;
      return 0;
    }
    bool closing = head.find("\r\nconnection: close") != std::string::npos;
    size_t need = head_end + 4 + length;
    while (buf_.size() < need) {
      if (!fill()) {
        *body = "the gateway closed the connection mid-answer";
        return 0;
      }
    }
    body->assign(buf_, head_end + 4, length);
    buf_.erase(0, need);
    if (closing) close();
    return status;
  }
  static std::string toLower(std::string s) {
    for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  }

  int port_;
  std::string request_;
  int fd_ = -1;
  std::string buf_;
};

std::string idOf(const std::string& body) {
  auto at = body.find("\"id\":\"");
  if (at == std::string::npos) return "";
  at += 6;
  auto end = body.find('"', at);
  return end == std::string::npos ? "" : body.substr(at, end - at);
}

double processCpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

double round3(double v) { return std::round(v * 1000) / 1000; }

}  // namespace

int benchGateway(const Invocation& inv) {
  CommonOptions common;
  po::options_description desc("options");
  addCommonOptions(desc, &common, false);
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
  po::variables_map vm;
  if (!parseCommandLine(inv, inv.args, desc, {}, "--simulated-nodes 160 --count N [--concurrency C]", &vm, &common)) {
    return kExitOk;
  }
  int nodes = vm["simulated-nodes"].as<int>();
  int count = vm["count"].as<int>();
  int concurrency = vm["concurrency"].as<int>();
  int warmup = vm["warmup"].as<int>();
  double node_cpus = vm["node-cpus"].as<double>();
  int64_t node_memory = parseSizeOption("node-memory", vm["node-memory"].as<std::string>());
  if (nodes <= 0 || nodes > 4096) throw UsageError("--simulated-nodes must be in 1..4096");
  if (count <= 0) throw UsageError("--count must be > 0");
  if (concurrency <= 0 || concurrency > 1024) throw UsageError("--concurrency must be in 1..1024");
  if (!(node_cpus > 0)) throw UsageError("--node-cpus must be > 0");
  if (node_memory <= 0) throw UsageError("--node-memory must be > 0");
  if (warmup < 0) warmup = std::min(5000, count / 10);
  std::string body = vm.count("body") != 0
                         ? vm["body"].as<std::string>()
                         : R"({"image":"debian:12+python:3.11","cpus":1,"memory":"512M","labels":{"bench":"gateway"}})";
  raiseFileLimit();
  // 160 nodes each announcing themselves would bury the figures: warnings only, unless --log-level says more.
  if (common.log_level.empty()) setLogLevel(LogLevel::kWarn);

  char dir_template[] = "/tmp/dsec-bench-gateway-XXXXXX";
  if (::mkdtemp(dir_template) == nullptr) return reportError(inv, Error::sys(errno, "mkdtemp"));
  std::string dir = dir_template;
  bool keep_dir = vm["keep-dir"].as<bool>();
  struct DirGuard {
    std::string path;
    bool keep;
    ~DirGuard() {
      std::error_code ec;
      if (!keep) std::filesystem::remove_all(path, ec);
    }
  } dir_guard{dir, keep_dir};

  std::string token = randomHex(64);
  double load_before = loadAverage1m();
  double t_start = monotonicSeconds();
  std::vector<std::unique_ptr<SimulatedNode>> fleet;
  fleet.reserve(static_cast<size_t>(nodes));
  for (int i = 0; i < nodes; ++i) {
    std::string name = "sim" + std::to_string(i);
    auto node = startNode(dir + "/" + name, name, token, node_memory, !vm["no-cpu-qos"].as<bool>());
    if (!node.ok()) return reportError(inv, node.error().wrap("starting simulated node " + name));
    fleet.push_back(std::move(*node));
  }
  launcher::GatewayOptions go;
  go.fleet_name = "bench";
  go.token = token;
  go.seed = 1;
  go.pool_connections = !vm["no-pool"].as<bool>();
  launcher::Gateway gateway(go);
  for (const auto& n : fleet) {
    launcher::FleetNodeSpec spec;
    spec.name = n->name;
    spec.endpoint = n->http->endpoint();
    spec.cpus = node_cpus;
    spec.memory_bytes = node_memory;
    if (auto st = gateway.registerNode(spec, /*from_seed=*/true); !st.ok()) return reportError(inv, st.error());
  }
  gateway.start();
  launcher::HttpServerOptions gho;
  gho.listen = "127.0.0.1:0";
  gho.max_connections = concurrency + 256;
  auto gateway_http = launcher::HttpServer::start(gho, &gateway);
  if (!gateway_http.ok()) return reportError(inv, gateway_http.error().wrap("starting the gateway's listener"));
  int port = (*gateway_http)->port();
  std::printf("bench gateway: %d simulated nodes (%.0f CPUs, %s each) started in %.2f s; gateway on %s\n", nodes,
              node_cpus, formatBytes(node_memory).c_str(), monotonicSeconds() - t_start,
              (*gateway_http)->endpoint().c_str());
  std::printf("%d creates (after %d warm-up) at concurrency %d, body %s\n", count, warmup, concurrency, body.c_str());
  std::fflush(stdout);

  std::string request =
      "POST /v1/sandboxes HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) + "\r\nAuthorization: Bearer " + token +
      "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;

  // Phase 0 warms the connections and pools; phase 1 is measured. Each worker keeps its own samples.
  struct Worker {
    std::vector<double> latencies_ms;
    std::vector<std::string> ids;
    int failures = 0;
    std::string first_error;
  };
  std::vector<Worker> workers(static_cast<size_t>(concurrency));
  std::atomic<int> next{0};
  int total = warmup + count;
  std::atomic<double> measure_start{0};
  std::atomic<int> warm_done{0};
  std::vector<std::thread> threads;
  threads.reserve(workers.size());
  for (size_t w = 0; w < workers.size(); ++w) {
    threads.emplace_back([&, w] {
      Worker& me = workers[w];
      me.latencies_ms.reserve(static_cast<size_t>(count) / static_cast<size_t>(concurrency) + 16);
      RawClient client(port, request);
      std::string answer;
      for (int i = next++; i < total; i = next++) {
        double t0 = monotonicSeconds();
        int status = client.create(&answer);
        double t1 = monotonicSeconds();
        bool measured = i >= warmup;
        if (!measured && ++warm_done == warmup) measure_start.store(t1);
        std::string id = status == 201 ? idOf(answer) : "";
        if (id.empty()) {
          if (measured) ++me.failures;
          if (me.first_error.empty()) me.first_error = std::to_string(status) + " " + answer.substr(0, 400);
          continue;
        }
        me.ids.push_back(std::move(id));
        if (measured) me.latencies_ms.push_back((t1 - t0) * 1000.0);
      }
    });
  }
  double cpu0 = processCpuSeconds();
  double wall0 = monotonicSeconds();
  for (auto& t : threads) t.join();
  double end = monotonicSeconds();
  double cpu_used = processCpuSeconds() - cpu0;
  double begin = warmup > 0 ? measure_start.load() : wall0;
  if (begin <= 0) begin = wall0;
  double wall = end - begin;
  double load = loadAverage1m();

  std::vector<double> latencies;
  int failures = 0;
  std::string first_error;
  std::map<std::string, int64_t> created_by_id_node;
  int64_t created = 0;
  for (auto& w : workers) {
    latencies.insert(latencies.end(), w.latencies_ms.begin(), w.latencies_ms.end());
    failures += w.failures;
    if (first_error.empty()) first_error = w.first_error;
    for (const auto& id : w.ids) created_by_id_node[launcher::nodeOfSandboxId(id)]++;
    created += static_cast<int64_t>(w.ids.size());
  }
  // The nodes' own books: every success must be a sandbox on the node its id names.
  std::vector<int64_t> per_node;
  int64_t held = 0;
  int mismatched_nodes = 0;
  for (const auto& n : fleet) {
    auto c = static_cast<int64_t>(n->agent->sandboxCount());
    per_node.push_back(c);
    held += c;
    if (created_by_id_node[n->name] != c) ++mismatched_nodes;
  }
  int64_t min_n = *std::min_element(per_node.begin(), per_node.end());
  int64_t max_n = *std::max_element(per_node.begin(), per_node.end());
  double mean_n = static_cast<double>(held) / static_cast<double>(per_node.size());

  (*gateway_http)->stop();
  gateway.stop();
  double t_down = monotonicSeconds();
  for (auto& n : fleet) n->http->stop();
  for (auto& n : fleet) n->agent->shutdown(/*destroy_sandboxes=*/true);
  double down_seconds = monotonicSeconds() - t_down;

  auto measured = static_cast<double>(latencies.size());
  double per_second = wall > 0 ? measured / wall : 0;
  std::printf(
      "created %.0f sandboxes in %.3f s: %.0f creates/s, %d failures (load average %.2f before, %.2f after; "
      "process CPU %.2f s = %.2f cores)\n",
      measured, wall, per_second, failures, load_before, load, cpu_used, cpu_used / (end - wall0));
  std::printf("latency: p50 %.3f ms  p90 %.3f ms  p99 %.3f ms  max %.3f ms\n", percentile(latencies, 50),
              percentile(latencies, 90), percentile(latencies, 99), percentile(latencies, 100));
  std::printf(
      "spread over %d nodes: min %lld  max %lld  mean %.1f  (max/mean %.3f); nodes hold %lld of %lld created%s\n",
      nodes, static_cast<long long>(min_n), static_cast<long long>(max_n), mean_n,
      mean_n > 0 ? static_cast<double>(max_n) / mean_n : 0.0, static_cast<long long>(held),
      static_cast<long long>(created), mismatched_nodes ? " (MISMATCH)" : "");
  std::printf("destroyed all and stopped the nodes in %.2f s\n", down_seconds);
  if (!first_error.empty()) std::printf("first failure: %s\n", first_error.c_str());
  if (keep_dir) std::printf("state directory kept: %s\n", dir.c_str());
  json summary{{"creates_per_second", std::round(per_second)},
               {"p50_ms", round3(percentile(latencies, 50))},
               {"p99_ms", round3(percentile(latencies, 99))},
               {"failures", failures},
               {"nodes", nodes},
               {"count", count},
               {"warmup", warmup},
               {"concurrency", concurrency},
               {"gateway_pool", go.pool_connections},
               {"seconds", round3(wall)},
               {"spread",
                {{"min", min_n},
                 {"max", max_n},
                 {"mean", std::round(mean_n * 10) / 10},
                 {"max_over_mean", mean_n > 0 ? round3(static_cast<double>(max_n) / mean_n) : 0.0}}},
               {"held_on_nodes", held},
               {"created", created},
               {"books_match", mismatched_nodes == 0 && held == created},
               {"load_average_1m", load},
               {"load_average_1m_before", load_before},
               {"process_cpu_cores", round3(cpu_used / std::max(1e-9, end - wall0))}};
  std::fflush(stdout);
  std::cout << summary.dump() << std::endl;
  return failures == 0 && mismatched_nodes == 0 && held == created ? kExitOk : kExitFailure;
}

}  // namespace dsec::cli
