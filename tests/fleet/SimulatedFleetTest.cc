// Simulated nodes (NodeOptions::simulate) and the gateway's connection pool, over real sockets: a simulated
// node validates and admits like a real one but starts nothing (exec and files are 501 naming the simulated
// node); a few simulated nodes behind the real Gateway take every create and spread them; the pool reuses
// one connection per node, survives a node restarted on the same port and never keeps a closed connection.
// No timing assertions (bench gateway measures).
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "dsec/common/Strings.h"
#include "dsec/launcher/api/ConnectionPool.h"
#include "dsec/launcher/api/HttpServer.h"
#include "dsec/launcher/api/Serve.h"
#include "dsec/launcher/fleet/Fleet.h"
#include "dsec/launcher/fleet/Gateway.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::launcher {
namespace {

using nlohmann::json;
namespace http = boost::beast::http;
using client::call;

client::HttpReply mustCall(const std::string& endpoint, http::verb method, const std::string& target,
                           const std::string& token, const std::string& body = "",
                           client::ConnectionPool* pool = nullptr) {
  client::CallOptions o;
  o.io_timeout_ms = 20000;
  o.pool = pool;
  auto r = client::call(endpoint, method, target, token, body, o);
  EXPECT_TRUE(r.ok()) << method << " " << target << ": " << (r.ok() ? "" : r.error().message());
  return r.ok() ? *r : client::HttpReply{};
}

// A simulated node on its own root, with the given token (the fleet's) written where the node reads it.
std::unique_ptr<EmbeddedNode> startSimulated(const std::string& root, const std::string& name, const std::string& token,
                                             const std::function<void(ServeOptions&)>& tune = nullptr) {
  EXPECT_OK(makeDirs(root, 0700));
  {
    std::ofstream out(root + "/token");
    out << token << "\n";
  }
  ServeOptions o;
  o.node.root = root;
  o.http.listen = "127.0.0.1:0";
  o.node.fleet_name = "sim";
  o.node.node_name = name;
  o.write_fleet_file = false;
  o.node.simulate = true;
  if (tune) tune(o);
  auto node = EmbeddedNode::start(o);
  EXPECT_TRUE(node.ok()) << (node.ok() ? "" : node.error().message());
  return node.ok() ? std::move(*node) : nullptr;
}

TEST(SimulatedNode, AdmitsAndValidatesButRunsNothing) {
  testing::TempDir root;
  std::string token = randomHex(64);
  auto node = startSimulated(root.path() + "/n0", "n0", token);
  ASSERT_NE(node, nullptr);
  std::string ep = node->endpoint();

  // No layer store behind it: the image is not checked, but the request is validated in full.
  auto bad = mustCall(ep, http::verb::post, "/v1/sandboxes", token, R"({"image":"x:1","cpus":-1})");
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_EQ(mustCall(ep, http::verb::post, "/v1/sandboxes", token, R"({"image":"x:1","colour":"red"})").status, 400);
  EXPECT_EQ(mustCall(ep, http::verb::post, "/v1/sandboxes", token, R"({"image":"x:1"})", nullptr).status, 201);
  auto created = mustCall(ep, http::verb::post, "/v1/sandboxes", token,
                          R"({"image":"debian:12+python:3.11","memory":"1G","labels":{"a":"b"}})");
  ASSERT_EQ(created.status, 201) << created.body;
  auto info = created.json();
  std::string id = info.value("id", "");
  EXPECT_EQ(nodeOfSandboxId(id), "n0");
  EXPECT_EQ(info["state"], "running");
  EXPECT_EQ(info["memory"], int64_t{1} << 30);
  EXPECT_EQ(info["labels"]["a"], "b");

  auto exec = mustCall(ep, http::verb::post, "/v1/sandboxes/" + id + "/exec", token, R"({"cmd":"true"})");
  EXPECT_EQ(exec.status, 501) << exec.body;
  EXPECT_NE(exec.body.find("simulated node"), std::string::npos) << exec.body;
  EXPECT_EQ(mustCall(ep, http::verb::get, "/v1/sandboxes/" + id + "/files?path=/etc/hostname", token).status, 501);

  EXPECT_EQ(mustCall(ep, http::verb::post, "/v1/sandboxes/" + id + "/pause", token).json()["state"], "paused");
  EXPECT_EQ(mustCall(ep, http::verb::post, "/v1/sandboxes/" + id + "/resume", token).json()["state"], "running");
  auto node_info = mustCall(ep, http::verb::get, "/v1/node", token).json();
  EXPECT_EQ(node_info["sandboxes"], 2);
  EXPECT_EQ(node_info["capacity"]["memory_committed_bytes"], (int64_t{1} << 30) + (int64_t{512} << 20));
  EXPECT_EQ(mustCall(ep, http::verb::get, "/v1/sandboxes?label=a=b", token).json()["sandboxes"].size(), 1u);

  EXPECT_EQ(mustCall(ep, http::verb::delete_, "/v1/sandboxes/" + id, token).status, 200);
  EXPECT_EQ(mustCall(ep, http::verb::get, "/v1/sandboxes/" + id, token).status, 404);
  node->stop(/*destroy_sandboxes=*/true);
}

TEST(SimulatedFleet, EveryCreateThroughTheGatewaySucceedsAndSpreads) {
  constexpr int kNodes = 4, kThreads = 4, kPerThread = 50;
  testing::TempDir root;
  std::string token = randomHex(64);
  std::vector<std::unique_ptr<EmbeddedNode>> nodes;
  GatewayOptions go;
  go.fleet_name = "sim";
  go.token = token;
  go.seed = 7;
  Gateway gateway(go);
  for (int i = 0; i < kNodes; ++i) {
    std::string name = "s" + std::to_string(i);
    nodes.push_back(startSimulated(root.path() + "/" + name, name, token));
    ASSERT_NE(nodes.back(), nullptr);
    FleetNodeSpec spec;
    spec.name = name;
    spec.endpoint = nodes.back()->endpoint();
    spec.cpus = 64;
    spec.memory_bytes = 256LL << 30;
    ASSERT_OK(gateway.registerNode(spec, true));
  }
  gateway.start();
  HttpServerOptions ho;
  ho.listen = "127.0.0.1:0";
  auto server = HttpServer::start(ho, &gateway);
  ASSERT_OK(server);
  std::string gw = (*server)->endpoint();

  std::mutex mu;
  std::vector<std::string> ids;
  std::atomic<int> failures{0};
  std::string first_failure;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      client::ConnectionPool client_pool;  // the client's own keep-alive connection, like the bench's
      for (int i = 0; i < kPerThread; ++i) {
        client::CallOptions o;
        o.io_timeout_ms = 20000;
        o.pool = &client_pool;
        auto r = client::call(gw, http::verb::post, "/v1/sandboxes", token, R"({"image":"x:1","cpus":0.5})", o);
        std::lock_guard lock(mu);
        if (!r.ok() || r->status != 201) {
          ++failures;
          if (first_failure.empty()) first_failure = r.ok() ? r->body : r.error().message();
          continue;
        }
        ids.push_back(r->json().value("id", ""));
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0) << first_failure;
  ASSERT_EQ(ids.size(), static_cast<size_t>(kThreads * kPerThread));

  // The nodes' books: each holds exactly the sandboxes whose ids name it, and every node got some.
  std::map<std::string, int> by_id;
  for (const auto& id : ids) by_id[nodeOfSandboxId(id)]++;
  int64_t held = 0;
  for (int i = 0; i < kNodes; ++i) {
    std::string name = "s" + std::to_string(i);
    auto info = mustCall(nodes[i]->endpoint(), http::verb::get, "/v1/node", token).json();
    EXPECT_EQ(info.value("sandboxes", -1), by_id[name]) << name;
    EXPECT_GE(by_id[name], kThreads * kPerThread / kNodes / 4) << name << " got too few: placement did not spread";
    held += info.value("sandboxes", 0);
  }
  EXPECT_EQ(held, kThreads * kPerThread);

  // Requests naming a sandbox reach its node in one hop; exec says the node is simulated.
  for (size_t i = 0; i < ids.size(); i += 37) {
    EXPECT_EQ(mustCall(gw, http::verb::get, "/v1/sandboxes/" + ids[i], token).json()["node"], nodeOfSandboxId(ids[i]));
    EXPECT_EQ(mustCall(gw, http::verb::post, "/v1/sandboxes/" + ids[i] + "/exec", token, R"({"cmd":"true"})").status,
              501);
    EXPECT_EQ(mustCall(gw, http::verb::delete_, "/v1/sandboxes/" + ids[i], token).status, 200);
  }
  (*server)->stop();
  gateway.stop();
  for (auto& n : nodes) n->stop(true);
}

// Three simulated nodes behind the real gateway, registered as a `sbatch -N3 -c1` fleet registers them (1 CPU
// each), with no watcher running: the gateway learns each node's admission state from one probe and places by it.
class SimulatedOneCpuFleet : public ::testing::Test {
 protected:
  void start(const std::function<void(const std::string&, ServeOptions&)>& tune = nullptr) {
    go_.fleet_name = "sim";
    go_.token = token_;
    go_.seed = 3;
    gateway_ = std::make_unique<Gateway>(go_);
    for (const char* name : {"n1", "n2", "n3"}) {
      auto node = startSimulated(root_.path() + "/" + name, name, token_, [&](ServeOptions& o) {
        if (tune) tune(name, o);
      });
      ASSERT_NE(node, nullptr);
      FleetNodeSpec spec;
      spec.name = name;
      spec.endpoint = node->endpoint();
      spec.cpus = 1;
      spec.memory_bytes = 4000LL << 20;
      ASSERT_OK(gateway_->registerNode(spec, true));
      nodes_[name] = std::move(node);
    }
    gateway_->probeAll();
    for (const auto& n : gateway_->nodesJson()) ASSERT_TRUE(n["admission"].is_object()) << n.dump();
    HttpServerOptions ho;
    ho.listen = "127.0.0.1:0";
    auto server = HttpServer::start(ho, gateway_.get());
    ASSERT_OK(server);
    server_ = std::move(*server);
  }
  void TearDown() override {
    if (server_) server_->stop();
    for (auto& [name, node] : nodes_) node->stop(true);
  }
  client::HttpReply create(const std::string& body = R"({"image":"x:1"})") {
    return mustCall(server_->endpoint(), http::verb::post, "/v1/sandboxes", token_, body);
  }
  json nodeInfo(const std::string& name) {
    return mustCall(nodes_[name]->endpoint(), http::verb::get, "/v1/node", token_).json();
  }

  testing::TempDir root_;
  std::string token_ = randomHex(64);
  GatewayOptions go_;
  std::unique_ptr<Gateway> gateway_;
  std::map<std::string, std::unique_ptr<EmbeddedNode>> nodes_;
  std::unique_ptr<HttpServer> server_;
};

// Idle sandboxes with the default 1 CPU: a static gateway ratio of 8 refused the 25th; the nodes' own CPU ratio
// (1024 while the sandboxes use nothing) admits all 30, and the gateway places them as the nodes admit.
TEST_F(SimulatedOneCpuFleet, ThirtyDefaultSandboxesAreAllAdmittedOverAllThreeNodes) {
  start();
  std::map<std::string, int> by_node;
  for (int i = 0; i < 30; ++i) {
    auto r = create();
    ASSERT_EQ(r.status, 201) << "sandbox " << i + 1 << ": " << r.body;
    EXPECT_EQ(r.json()["cpus"], 1.0);  // the default
    by_node[r.json()["node"].get<std::string>()]++;
  }
  ASSERT_EQ(by_node.size(), 3u) << "the 30 sandboxes did not spread over all 3 nodes";
  gateway_->probeAll();
  for (const auto& n : gateway_->nodesJson()) {
    std::string name = n["name"];
    json own = nodeInfo(name);
    EXPECT_EQ(own["sandboxes"], by_node[name]) << name;
    EXPECT_EQ(own["density"]["refusals"], 0) << name << " refused a create the gateway sent";
    // The gateway holds the node's own books: one admission truth.
    EXPECT_EQ(n["admission"]["cpu_committed"], static_cast<double>(by_node[name])) << n.dump();
    EXPECT_EQ(n["admission"]["cpu_ratio"], own["admission"]["cpu_ratio"]) << n.dump();
    EXPECT_GT(n["admission"]["cpu_ratio"].get<double>(), 8.0) << n.dump();
  }
}

// Every node's density controller holds its memory ratio at 1: n1 and n3 on 8 GiB (16 sandboxes of 512 MiB
// each), n2 on 1 GiB (2). The gateway fills the fleet exactly as far as the nodes admit, never sending a node a
// create it would refuse, and then says no itself, in the nodes' words.
TEST_F(SimulatedOneCpuFleet, TheGatewaySaysYesAndNoAsTheNodesDo) {
  start([](const std::string& name, ServeOptions& o) {
    o.node.density.memory_ratio_start = o.node.density.memory_ratio_min = o.node.density.memory_ratio_max = 1.0;
    o.node.memory_capacity_bytes = (name == "n2" ? 1LL : 8LL) << 30;
  });
  std::map<std::string, int> by_node;
  for (int i = 0; i < 34; ++i) {
    auto r = create();
    ASSERT_EQ(r.status, 201) << "sandbox " << i + 1 << ": " << r.body;
    by_node[r.json()["node"].get<std::string>()]++;
  }
  EXPECT_EQ(by_node["n1"], 16);
  EXPECT_EQ(by_node["n2"], 2);
  EXPECT_EQ(by_node["n3"], 16);
  auto full = create();
  EXPECT_EQ(full.status, 429) << full.body;
  EXPECT_NE(full.body.find("of 3 nodes 3 are full"), std::string::npos) << full.body;
  EXPECT_NE(full.body.find("committed + 512 MiB asked > 1.00 x"), std::string::npos) << full.body;
  for (const char* name : {"n1", "n2", "n3"}) {
    json own = nodeInfo(name);
    EXPECT_EQ(own["density"]["refusals"], 0) << name << " refused a create the gateway sent it";
    EXPECT_EQ(own["admission"]["memory_committed_bytes"], own["admission"]["memory_capacity_bytes"]) << name;
  }
}

// Counts the connections a server accepted (each runs serveConnection once).
class CountingNode : public RequestHandler {
 public:
  void handle(HttpExchange& ex) override {
    (void)ex.discardBody(1 << 20);
    if (close_) ex.forceClose();
    ex.sendJson(200, json{{"ok", true}});
  }
  std::atomic<bool> close_{false};
};

TEST(ConnectionPool, ReusesOneConnectionPerNodeAndSurvivesARestart) {
  CountingNode handler;
  HttpServerOptions o;
  o.listen = "127.0.0.1:0";
  auto server = HttpServer::start(o, &handler);
  ASSERT_OK(server);
  std::string ep = (*server)->endpoint();
  client::ConnectionPool pool;
  for (int i = 0; i < 20; ++i) EXPECT_EQ(mustCall(ep, http::verb::post, "/x", "t", "{}", &pool).status, 200);
  EXPECT_EQ(pool.reused(), 19u);
  EXPECT_EQ(pool.idle(ep), 1u);
  EXPECT_EQ((*server)->activeConnections(), 1);

  // The node restarts on the same port: the idle connection is dead; the call still succeeds on a new one.
  int port = (*server)->port();
  (*server)->stop();
  o.listen = "127.0.0.1:" + std::to_string(port);
  auto again = HttpServer::start(o, &handler);
  ASSERT_OK(again);
  EXPECT_EQ(mustCall(ep, http::verb::get, "/x", "t", "", &pool).status, 200);
  EXPECT_EQ(pool.idle(ep), 1u);

  // An answer that closes the connection is not kept.
  handler.close_ = true;
  EXPECT_EQ(mustCall(ep, http::verb::get, "/x", "t", "", &pool).status, 200);
  EXPECT_EQ(pool.idle(ep), 0u);
  handler.close_ = false;

  // A node that is gone: the error says so, nothing is kept.
  (*again)->stop();
  client::CallOptions co;
  co.pool = &pool;
  co.connect_timeout_ms = 2000;
  auto gone = client::call(ep, http::verb::get, "/x", "t", "", co);
  EXPECT_FALSE(gone.ok());
  EXPECT_EQ(pool.idle(ep), 0u);
  pool.drop(ep);
}

}  // namespace
}  // namespace dsec::launcher
