// The gateway's routing and placement against fake nodes: real HTTP servers (HttpServer) answering like node
// agents, so forwarding, streaming, lost-node errors and fan-out are exercised over real sockets, without Slurm
// or sandboxes.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "dsec/common/Strings.h"
#include "dsec/launcher/api/HttpServer.h"
#include "dsec/launcher/fleet/Fleet.h"
#include "dsec/launcher/fleet/Gateway.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::launcher {
namespace {

using nlohmann::json;
namespace http = boost::beast::http;
using client::call;
constexpr const char* kToken = "fleet-token";

// The snapshot store every node of a fleet shares (<fleet root>/snapshots): snapshot objects by name.
struct SharedSnapshots {
  std::mutex mu;
  std::map<std::string, json> by_name;
};

// Answers like a node agent: creates (and restores from the shared snapshots), info, exec/stream, file uploads,
// sessions, snapshots and forks, /v1/node.
class FakeNode : public RequestHandler {
 public:
  explicit FakeNode(std::string name, SharedSnapshots* snapshots = nullptr)
      : name_(std::move(name)), snapshots_(snapshots) {
    HttpServerOptions o;
    o.listen = "127.0.0.1:0";
    server_ = HttpServer::start(o, this).value();
  }
  ~FakeNode() override { stop(); }
  void stop() {
    hang_ = false;
    hold_creates_ = false;
    if (server_) server_->stop();
  }
  std::string endpoint() const { return server_->endpoint(); }
  FleetNodeSpec spec() const {
    FleetNodeSpec s;
    s.name = name_;
    s.endpoint = endpoint();
    s.cpus = 4;
    s.memory_bytes = 8LL << 30;
    return s;
  }

  void handle(HttpExchange& ex) override {
    while (hang_) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::string target(ex.target());
    auto method = ex.method();
    if (ex.head()[http::field::authorization] != std::string("Bearer ") + kToken) {
      return ex.sendError(401, "unauthorized", "bad token");
    }
    requests_++;
    if (target == "/v1/node") {
      std::lock_guard lock(mu_);
      return ex.sendJson(200, json{{"node", name_},
                                   {"backends", {"container"}},
                                   {"capacity", {{"memory_committed_bytes", 0}, {"cpus", 4}}},
                                   {"sandboxes", sandboxes_.size()},
                                   {"admission", admission_}});
    }
    if (target == "/v1/sandboxes" && method == http::verb::post) {
      creates_++;
      while (hold_creates_) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      bool too_large = false;
      auto body = json::parse(*ex.readBody(1 << 20, &too_large));
      std::string snapshot = body.value("snapshot", "");
      if (!snapshot.empty()) {
        restores_++;
        std::lock_guard lock(snapshots_->mu);
        if (!snapshots_->by_name.count(snapshot)) return ex.sendError(404, "not_found", "no snapshot " + snapshot);
      }
      if (full_) return ex.sendError(429, "capacity", "full", {{"Retry-After", "1"}});
      std::string id = name_ + "-" + randomHex(16);
      std::lock_guard lock(mu_);
      sandboxes_[id] = body.value("labels", json::object());
      return ex.sendJson(201, json{{"id", id}, {"node", name_}, {"labels", sandboxes_[id]}, {"snapshot", snapshot}});
    }
    if (startsWith(target, "/v1/sandboxes?") || target == "/v1/sandboxes") {
      json list = json::array();
      std::lock_guard lock(mu_);
      for (const auto& [id, labels] : sandboxes_) list.push_back(json{{"id", id}, {"node", name_}});
      return ex.sendJson(200, json{{"sandboxes", list}});
    }
    if (startsWith(target, "/v1/sessions/")) {
      std::string name = target.substr(13);
      bool too_large = false;
      if (method == http::verb::put) (void)ex.readBody(1 << 20, &too_large);
      std::lock_guard lock(mu_);
      json ids = json::array();
      for (const auto& [id, labels] : sandboxes_) ids.push_back(id);
      return ex.sendJson(200, json{{"name", name},
                                   {"lease", 60},
                                   {"state", lapsed_ ? "lapsed" : "active"},
                                   {"expires_unix", expires_},
                                   {"lapsed_unix", lapsed_ ? json(100.0) : json(nullptr)},
                                   {"sandboxes", ids}});
    }
    if (snapshots_ != nullptr && startsWith(target, "/v1/snapshots")) {
      snapshot_requests_++;
      std::lock_guard lock(snapshots_->mu);
      if (target == "/v1/snapshots") {
        json list = json::array();
        for (const auto& [n, snap] : snapshots_->by_name) list.push_back(snap);
        return ex.sendJson(200, json{{"snapshots", list}, {"answered_by", name_}});
      }
      std::string name = target.substr(std::string("/v1/snapshots/").size());
      auto it = snapshots_->by_name.find(name);
      if (it == snapshots_->by_name.end()) return ex.sendError(404, "not_found", "no snapshot " + name);
      if (method == http::verb::delete_) {
        snapshots_->by_name.erase(it);
        return ex.sendJson(200, json{{"name", name}, {"deleted", true}});
      }
      return ex.sendJson(200, it->second);
    }
    auto parts = split(target.substr(0, target.find('?')), '/');  // "", v1, sandboxes, id, ...
    if (parts.size() >= 4 && parts[2] == "sandboxes") {
      std::string id = parts[3];
      {
        std::lock_guard lock(mu_);
        if (!sandboxes_.count(id)) return ex.sendError(404, "not_found", "no sandbox " + id + " on " + name_);
      }
      if (parts.size() == 4) return ex.sendJson(200, json{{"id", id}, {"node", name_}});
      if (parts.size() == 5 && (parts[4] == "snapshot" || parts[4] == "fork") && method == http::verb::post) {
        bool too_large = false;
        auto body = json::parse(*ex.readBody(1 << 20, &too_large));
        json snap{{"name", body.value("name", "snap-" + randomHex(6))},
                  {"kind", "filesystem"},
                  {"backend", "container"},
                  {"image", "x:1"},
                  {"source", id},
                  {"node", name_},
                  {"bytes", 4096}};
        {
          std::lock_guard lock(snapshots_->mu);
          if (snapshots_->by_name.count(snap["name"])) return ex.sendError(409, "conflict", "snapshot exists");
          snapshots_->by_name[snap["name"]] = snap;
        }
        if (parts[4] == "snapshot") return ex.sendJson(201, snap);
        json copies = json::array();
        std::lock_guard lock(mu_);
        for (int i = 0; i < body.value("count", 1); ++i) {
          std::string copy = name_ + "-" + randomHex(16);
          sandboxes_[copy] = json::object();
          copies.push_back(json{{"id", copy}, {"node", name_}, {"snapshot", snap["name"]}});
        }
        return ex.sendJson(201, json{{"snapshot", snap}, {"sandboxes", copies}});
      }
      if (parts.size() == 6 && parts[4] == "exec" && parts[5] == "stream") {
        bool too_large = false;
        (void)ex.readBody(1 << 20, &too_large);
        ex.beginStream(200, "application/x-ndjson", std::nullopt);
        for (int i = 0; i < 3; ++i) {
          std::string line = json{{"stdout", std::to_string(i) + "\n"}}.dump() + "\n";
          ex.writeStream(line.data(), line.size());
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        std::string last = json{{"exit_code", 0}, {"done", true}}.dump() + "\n";
        ex.writeStream(last.data(), last.size());
        ex.endStream();
        return;
      }
      if (parts.size() == 5 && parts[4] == "files" && method == http::verb::put) {
        uint64_t size = 0;
        (void)ex.readBodyStream([&](const char*, size_t n) {
          size += n;
          return okStatus();
        });
        return ex.sendJson(200, json{{"size", size}});
      }
      if (parts.size() == 5 && parts[4] == "files" && method == http::verb::get) {
        std::string data(3 << 20, 'x');
        ex.beginStream(200, "application/octet-stream", data.size());
        ex.writeStream(data.data(), data.size());
        ex.endStream();
        return;
      }
    }
    ex.sendError(404, "not_found", "no route " + target);
  }

  std::string name_;
  SharedSnapshots* snapshots_;
  std::unique_ptr<HttpServer> server_;
  std::mutex mu_;
  std::map<std::string, json> sandboxes_;
  json admission_ = nullptr;  // GET /v1/node "admission" (null: the node does not report one)
  std::atomic<bool> full_{false}, hang_{false}, lapsed_{false}, hold_creates_{false};
  std::atomic<int> requests_{0}, creates_{0}, restores_{0}, snapshot_requests_{0};
  double expires_ = 1000;
};

class GatewayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GatewayOptions o;
    o.fleet_name = "test";
    o.token = kToken;
    o.probe_timeout_seconds = 0.3;
    o.lost_after_seconds = 0.5;
    o.connect_timeout_ms = 500;
    o.seed = 42;
    gateway_ = std::make_unique<Gateway>(o);
    for (const char* n : {"n1", "n2", "n3"}) {
      nodes_[n] = std::make_unique<FakeNode>(n, &snapshots_);
      ASSERT_OK(gateway_->registerNode(nodes_[n]->spec()));
    }
    HttpServerOptions ho;
    ho.listen = "127.0.0.1:0";
    server_ = HttpServer::start(ho, gateway_.get()).value();
  }
  void TearDown() override {
    server_->stop();
    for (auto& [n, node] : nodes_) node->stop();
  }

  client::HttpReply call(http::verb method, const std::string& target, const std::string& body = "",
                         const std::string& token = kToken) {
    client::CallOptions o;
    o.io_timeout_ms = 10000;
    auto r = client::call(server_->endpoint(), method, target, token, body, o);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message());
    return r.ok() ? *r : client::HttpReply{};
  }
  std::string create(const std::string& extra = "") {
    auto r = call(http::verb::post, "/v1/sandboxes", R"({"image":"x:1","cpus":0.5)" + extra + "}");
    EXPECT_EQ(r.status, 201) << r.body;
    return r.json().value("id", "");
  }

  // Every node reports `admission` (GET /v1/node) and the gateway probes them once (no watcher runs here).
  void report(const std::map<std::string, json>& admission) {
    for (const auto& [n, a] : admission) {
      std::lock_guard lock(nodes_[n]->mu_);
      nodes_[n]->admission_ = a;
    }
    gateway_->probeAll();
  }

  SharedSnapshots snapshots_;  // before the nodes, which use it
  std::unique_ptr<Gateway> gateway_;
  std::map<std::string, std::unique_ptr<FakeNode>> nodes_;
  std::unique_ptr<HttpServer> server_;
};

// A node's admission state as its density controller reports it: calm, 8 GiB x 8, 4 CPUs x 1024.
json calmAdmission(int64_t memory_committed = 0) {
  return json{{"admitting", true},
              {"level", "calm"},
              {"reason", ""},
              {"memory_ratio", 8.0},
              {"cpu_ratio", 1024.0},
              {"memory_capacity_bytes", 8LL << 30},
              {"memory_committed_bytes", memory_committed},
              {"cpus", 4.0},
              {"cpu_committed", 0.0},
              {"free_dedicated_cores", 3},
              {"free_sandboxes", 4096}};
}

json pressedAdmission() {
  json a = calmAdmission();
  a["admitting"] = false;
  a["level"] = "stop_admitting";
  a["reason"] = "memory PSI some avg10 31.0%";
  return a;
}

TEST(GatewayPure, SandboxIdNamesItsNode) {
  EXPECT_EQ(nodeOfSandboxId("n2-3fa9c2d1e4b5a6c7"), "n2");
  EXPECT_EQ(nodeOfSandboxId("gpu-node-7-3fa9c2d1e4b5a6c7"), "gpu-node-7");
  EXPECT_EQ(nodeOfSandboxId("nodash"), "");
  EXPECT_EQ(nodeOfSandboxId("-abc"), "");
}

TEST(GatewayPure, NodeSpecIsValidated) {
  auto ok = parseNodeSpec(json{{"name", "n1"}, {"endpoint", "http://10.0.0.1:80"}, {"capacity", {{"cpus", 8}}}});
  ASSERT_OK(ok);
  EXPECT_EQ(ok->cpus, 8);
  EXPECT_FALSE(parseNodeSpec(json{{"name", "N_1"}, {"endpoint", "http://10.0.0.1:80"}}).ok());
  EXPECT_FALSE(parseNodeSpec(json{{"name", "n1"}, {"endpoint", "10.0.0.1"}}).ok());
  EXPECT_FALSE(parseNodeSpec(json{{"endpoint", "http://10.0.0.1:80"}}).ok());
  auto ep = dsec::parseEndpoint("http://[::1]:8470/");
  ASSERT_OK(ep);
  EXPECT_EQ(ep->host, "::1");
  EXPECT_EQ(ep->port, 8470);
}

TEST_F(GatewayTest, NeedsTheFleetToken) {
  EXPECT_EQ(call(http::verb::get, "/v1/sandboxes", "", "wrong").status, 401);
  EXPECT_EQ(call(http::verb::get, "/healthz", "", "").status, 200);
  // The scheme in any case and blanks around the token, as the node accepts them (one check for both).
  auto status_line = [&](const std::string& authorization) {
    client::CallOptions o;
    auto fd = client::connectTo(server_->endpoint(), o);
    EXPECT_OK(fd);
    if (!fd.ok()) return std::string();
    std::string req =
        "GET /v1/sandboxes HTTP/1.1\r\nHost: x\r\nAuthorization: " + authorization + "\r\nConnection: close\r\n\r\n";
    EXPECT_EQ(::send(fd->get(), req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
    std::string got;
    char buf[4096];
    // The socket is non-blocking: poll it for up to 5 s.
    for (auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
         got.find("\r\n") == std::string::npos && std::chrono::steady_clock::now() < end;) {
      ssize_t n = ::recv(fd->get(), buf, sizeof(buf), MSG_DONTWAIT);
      if (n > 0) got.append(buf, static_cast<size_t>(n));
      if (n == 0) break;
      if (n < 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return got.substr(0, got.find("\r\n"));
  };
  EXPECT_EQ(status_line(std::string("bearer  ") + kToken + " "), "HTTP/1.1 200 OK");
  EXPECT_EQ(status_line(std::string("BEARER ") + kToken), "HTTP/1.1 200 OK");
  EXPECT_EQ(status_line(std::string("Basic ") + kToken), "HTTP/1.1 401 Unauthorized");
  EXPECT_EQ(status_line("Bearer "), "HTTP/1.1 401 Unauthorized");
}

TEST_F(GatewayTest, CreatesSpreadOverNodesAndRequestsFindTheirNode) {
  std::map<std::string, int> per_node;
  std::vector<std::string> ids;
  for (int i = 0; i < 30; ++i) {
    auto id = create();
    ids.push_back(id);
    per_node[nodeOfSandboxId(id)]++;
  }
  ASSERT_EQ(per_node.size(), 3u);
  for (const auto& [n, count] : per_node) EXPECT_GE(count, 5) << n;  // least loaded of 2: close to even
  for (const auto& id : ids) {
    auto r = call(http::verb::get, "/v1/sandboxes/" + id);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.json()["node"], nodeOfSandboxId(id));
  }
  auto list = call(http::verb::get, "/v1/sandboxes?label=a=b");
  EXPECT_EQ(list.json()["sandboxes"].size(), 30u);
  EXPECT_EQ(call(http::verb::get, "/v1/sandboxes/n9-00").status, 503);  // unknown node right after start
}

TEST_F(GatewayTest, AFullNodeIsPlacedAroundAndAFullFleetIs429) {
  nodes_["n1"]->full_ = true;
  nodes_["n2"]->full_ = true;
  for (int i = 0; i < 5; ++i) EXPECT_EQ(nodeOfSandboxId(create()), "n3");
  nodes_["n3"]->full_ = true;
  auto r = call(http::verb::post, "/v1/sandboxes", R"({"image":"x:1"})");
  EXPECT_EQ(r.status, 429);
  EXPECT_EQ(r.json()["error"]["code"], "capacity");
}

TEST_F(GatewayTest, ANodeThatDoesNotAdmitIsNotAsked) {
  report({{"n1", calmAdmission()}, {"n2", pressedAdmission()}, {"n3", calmAdmission()}});
  for (int i = 0; i < 20; ++i) EXPECT_NE(nodeOfSandboxId(create()), "n2");
  EXPECT_EQ(nodes_["n2"]->creates_, 0) << "the gateway sent a create to a node under pressure";
  for (const auto& n : call(http::verb::get, "/v1/fleet/nodes").json()["nodes"]) {
    EXPECT_EQ(n["admission"]["admitting"], n["name"] != "n2") << n.dump();
  }
  // The whole fleet under pressure: 429 at once, in the nodes' words, and no node is asked.
  report({{"n1", pressedAdmission()}, {"n3", pressedAdmission()}});
  int before = nodes_["n1"]->creates_ + nodes_["n3"]->creates_;
  auto r = call(http::verb::post, "/v1/sandboxes", R"({"image":"x:1"})");
  EXPECT_EQ(r.status, 429);
  std::string message = r.json()["error"]["message"];
  EXPECT_NE(message.find("3 not admitting"), std::string::npos) << message;
  EXPECT_NE(message.find("admission is closed (memory PSI some avg10 31.0%)"), std::string::npos) << message;
  EXPECT_EQ(nodes_["n1"]->creates_ + nodes_["n3"]->creates_, before);
  // Pressure falls on n2: the next report opens it again.
  report({{"n2", calmAdmission()}});
  EXPECT_EQ(nodeOfSandboxId(create()), "n2");
}

TEST_F(GatewayTest, RegistrationsCarryTheNodesAdmissionState) {
  json reg = {{"name", "n2"},
              {"endpoint", nodes_["n2"]->endpoint()},
              {"capacity", {{"cpus", 4}, {"memory_bytes", 8LL << 30}}},
              {"admission", pressedAdmission()},
              {"sandboxes", 0}};
  ASSERT_EQ(call(http::verb::post, "/v1/fleet/nodes", reg.dump()).status, 200);
  for (int i = 0; i < 10; ++i) EXPECT_NE(nodeOfSandboxId(create()), "n2");
  EXPECT_EQ(nodes_["n2"]->creates_, 0);
  reg["admission"].erase("cpu_ratio");
  auto bad = call(http::verb::post, "/v1/fleet/nodes", reg.dump());
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("cpu_ratio"), std::string::npos) << bad.body;
}

TEST_F(GatewayTest, CreatesInFlightCountUntilTheNodeAnswers) {
  // n1 has room for one 768 MiB sandbox (1 GiB x 1); the others do not admit.
  json small = calmAdmission();
  small["memory_ratio"] = 1.0;
  small["memory_capacity_bytes"] = 1LL << 30;
  report({{"n1", small}, {"n2", pressedAdmission()}, {"n3", pressedAdmission()}});
  nodes_["n1"]->hold_creates_ = true;
  client::HttpReply first;
  std::thread t([&] { first = call(http::verb::post, "/v1/sandboxes", R"({"image":"x:1","memory":"768M"})"); });
  for (auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
       nodes_["n1"]->creates_ == 0 && std::chrono::steady_clock::now() < end;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(nodes_["n1"]->creates_, 1);
  // The first create is still in flight on n1: its 768 MiB are spoken for, so n1 is not even asked.
  auto second = call(http::verb::post, "/v1/sandboxes", R"({"image":"x:1","memory":"512M"})");
  EXPECT_EQ(second.status, 429) << second.body;
  EXPECT_NE(second.body.find("memory: 768 MiB committed + 512 MiB asked > 1.00 x 1024 MiB"), std::string::npos)
      << second.body;
  EXPECT_EQ(nodes_["n1"]->creates_, 1);
  nodes_["n1"]->hold_creates_ = false;
  t.join();
  EXPECT_EQ(first.status, 201) << first.body;
  // Confirmed, it stays counted until n1's next report, which then has it in its books.
  EXPECT_EQ(call(http::verb::post, "/v1/sandboxes", R"({"image":"x:1","memory":"512M"})").status, 429);
  report({{"n1", [&] {
             json a = small;
             a["memory_committed_bytes"] = 768LL << 20;
             return a;
           }()}});
  EXPECT_EQ(call(http::verb::post, "/v1/sandboxes", R"({"image":"x:1","memory":"512M"})").status, 429);
  EXPECT_EQ(nodes_["n1"]->creates_, 1);
  // The sandbox is gone from n1's books: room again.
  report({{"n1", small}});
  EXPECT_EQ(nodeOfSandboxId(create(R"(,"memory":"512M")")), "n1");
}

TEST_F(GatewayTest, DrainedNodesGetNoNewSandboxes) {
  EXPECT_EQ(call(http::verb::post, "/v1/fleet/nodes/n2/drain").status, 200);
  for (int i = 0; i < 10; ++i) EXPECT_NE(nodeOfSandboxId(create()), "n2");
  auto nodes = call(http::verb::get, "/v1/fleet/nodes").json()["nodes"];
  for (const auto& n : nodes) EXPECT_EQ(n["state"], n["name"] == "n2" ? "draining" : "healthy");
}

TEST_F(GatewayTest, StreamsExecOutputAndFileBodies) {
  auto id = create();
  auto r = call(http::verb::post, "/v1/sandboxes/" + id + "/exec/stream", R"({"cmd":"x"})");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.body,
            "{\"stdout\":\"0\\n\"}\n{\"stdout\":\"1\\n\"}\n{\"stdout\":\"2\\n\"}\n{\"done\":true,\"exit_code\":0}\n");
  {
    // Line by line: the first output reaches the client long before the command ends (150 ms).
    client::CallOptions o;
    auto fd = client::connectTo(server_->endpoint(), o);
    ASSERT_OK(fd);
    std::string req = "POST /v1/sandboxes/" + id + "/exec/stream HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                      kToken + "\r\nContent-Length: 2\r\n\r\n{}";
    ASSERT_EQ(::send(fd->get(), req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
    auto t0 = std::chrono::steady_clock::now();
    std::string got;
    std::chrono::steady_clock::duration first{}, last{};
    char buf[4096];
    while (got.find("done") == std::string::npos && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) {
      ssize_t n = ::recv(fd->get(), buf, sizeof(buf), MSG_DONTWAIT);
      if (n > 0) {
        got.append(buf, n);
        if (got.find("\"0\\n\"") != std::string::npos && first == std::chrono::steady_clock::duration{}) {
          first = std::chrono::steady_clock::now() - t0;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    last = std::chrono::steady_clock::now() - t0;
    EXPECT_NE(got.find("\"done\":true"), std::string::npos) << got;
    EXPECT_LT(first + std::chrono::milliseconds(80), last) << "output was not streamed";
  }
  std::string big(5 << 20, 'y');
  auto put = call(http::verb::put, "/v1/sandboxes/" + id + "/files?path=/a", big);
  ASSERT_EQ(put.status, 200) << put.body;
  EXPECT_EQ(put.json()["size"], big.size());
  auto get = call(http::verb::get, "/v1/sandboxes/" + id + "/files?path=/a");
  EXPECT_EQ(get.body.size(), 3u << 20);
  EXPECT_EQ(call(http::verb::get, "/v1/sandboxes/" + nodeOfSandboxId(id) + "-ffff").status, 404);
}

TEST_F(GatewayTest, ALostNodeIsReportedAtOnceAndComesBack) {
  std::vector<std::string> ids;
  for (int i = 0; i < 12; ++i) ids.push_back(create());
  nodes_["n2"]->stop();
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  gateway_->probeAll();
  for (const auto& id : ids) {
    auto t0 = std::chrono::steady_clock::now();
    auto r = call(http::verb::get, "/v1/sandboxes/" + id);
    if (nodeOfSandboxId(id) == "n2") {
      EXPECT_EQ(r.status, 503);
      EXPECT_NE(r.json()["error"]["message"].get<std::string>().find("node n2 is lost"), std::string::npos) << r.body;
      EXPECT_NE(r.body.find("sandbox " + id + " is lost"), std::string::npos);
      EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(500));
    } else {
      EXPECT_EQ(r.status, 200);
    }
  }
  for (int i = 0; i < 6; ++i) EXPECT_NE(nodeOfSandboxId(create()), "n2");
  auto list = call(http::verb::get, "/v1/sandboxes").json();
  EXPECT_EQ(list["unreachable_nodes"], json::array({"n2"}));
  // A new agent for n2 registers: healthy again.
  nodes_["n2"] = std::make_unique<FakeNode>("n2");
  ASSERT_OK(gateway_->registerNode(nodes_["n2"]->spec()));
  for (const auto& n : call(http::verb::get, "/v1/fleet/nodes").json()["nodes"]) EXPECT_EQ(n["state"], "healthy");
}

TEST_F(GatewayTest, ARequestToAHangingNodeEndsWhenTheNodeIsDeclaredLost) {
  auto id = create();
  std::string node = nodeOfSandboxId(id);
  nodes_[node]->hang_ = true;
  std::atomic<bool> done{false};
  int status = 0;
  std::string body;
  std::thread t([&] {
    auto r = call(http::verb::get, "/v1/sandboxes/" + id);
    status = r.status;
    body = r.body;
    done = true;
  });
  auto t0 = std::chrono::steady_clock::now();
  while (!done && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) {
    gateway_->probeAll();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  nodes_[node]->hang_ = false;
  t.join();
  EXPECT_EQ(status, 503);
  EXPECT_NE(body.find("is lost"), std::string::npos) << body;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
}

TEST_F(GatewayTest, SessionsFanOutAndMerge) {
  for (int i = 0; i < 9; ++i) create();
  auto r = call(http::verb::put, "/v1/sessions/run-42", R"({"lease":60})");
  ASSERT_EQ(r.status, 200) << r.body;
  auto s = r.json();
  EXPECT_EQ(s["sandboxes"].size(), 9u);
  EXPECT_EQ(s["state"], "active");
  EXPECT_EQ(s["nodes"], 3);
  for (auto& [n, node] : nodes_) node->lapsed_ = true;
  nodes_["n1"]->expires_ = 2000;
  s = call(http::verb::get, "/v1/sessions/run-42").json();
  EXPECT_EQ(s["state"], "lapsed");
  EXPECT_EQ(s["expires_unix"], 2000.0);
  EXPECT_EQ(s["lapsed_unix"], 100.0);
  nodes_["n3"]->lapsed_ = false;
  EXPECT_EQ(call(http::verb::get, "/v1/sessions/run-42").json()["state"], "active");
}

}  // namespace
}  // namespace dsec::launcher

namespace dsec::launcher {
namespace {

// Snapshots and forks go to the sandbox's node (the id names it), which forks all copies itself.
TEST_F(GatewayTest, SnapshotsAndForksGoToTheSandboxesNode) {
  std::vector<std::string> ids;
  for (int i = 0; i < 6; ++i) ids.push_back(create());
  for (const auto& id : ids) {
    std::string node = nodeOfSandboxId(id);
    auto r = call(http::verb::post, "/v1/sandboxes/" + id + "/snapshot", R"({"name":"s-)" + id + R"("})");
    ASSERT_EQ(r.status, 201) << r.body;
    EXPECT_EQ(r.json()["node"], node);
    EXPECT_EQ(r.json()["source"], id);
    r = call(http::verb::post, "/v1/sandboxes/" + id + "/snapshot", R"({"name":"s-)" + id + R"("})");
    EXPECT_EQ(r.status, 409) << r.body;  // the node's answer, relayed

    r = call(http::verb::post, "/v1/sandboxes/" + id + "/fork", R"({"count":3})");
    ASSERT_EQ(r.status, 201) << r.body;
    auto copies = r.json()["sandboxes"];
    ASSERT_EQ(copies.size(), 3u);
    for (const auto& copy : copies) {
      std::string copy_id = copy["id"];
      EXPECT_EQ(nodeOfSandboxId(copy_id), node);
      EXPECT_EQ(call(http::verb::get, "/v1/sandboxes/" + copy_id).status, 200);
    }
  }
  EXPECT_EQ(call(http::verb::post, "/v1/sandboxes/n9-0123456789abcdef/fork", R"({"count":1})").status, 503);
}

// Listings, lookups and deletes of snapshots ask one live node (the store is shared), the next one if it cannot
// be reached.
TEST_F(GatewayTest, SnapshotListingsAskOneLiveNodeAndFallBack) {
  auto id = create();
  ASSERT_EQ(call(http::verb::post, "/v1/sandboxes/" + id + "/snapshot", R"({"name":"shared-1"})").status, 201);
  auto asked = [&] {
    std::map<std::string, int> out;
    for (auto& [n, node] : nodes_) out[n] = node->snapshot_requests_.exchange(0);
    return out;
  };
  asked();
  auto r = call(http::verb::get, "/v1/snapshots");
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_EQ(r.json()["snapshots"].size(), 1u);
  EXPECT_EQ(r.json()["snapshots"][0]["name"], "shared-1");
  auto counts = asked();
  EXPECT_EQ(counts["n1"] + counts["n2"] + counts["n3"], 1);

  std::string first = r.json()["answered_by"];
  nodes_[first]->stop();  // not answering, not yet declared lost
  r = call(http::verb::get, "/v1/snapshots/shared-1");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["source"], id);
  r = call(http::verb::get, "/v1/snapshots");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.json()["answered_by"], first);
  EXPECT_EQ(call(http::verb::get, "/v1/snapshots/nope").status, 404);
  EXPECT_EQ(call(http::verb::delete_, "/v1/snapshots/shared-1").status, 200);
  EXPECT_EQ(call(http::verb::delete_, "/v1/snapshots/shared-1").status, 404);
  EXPECT_EQ(call(http::verb::post, "/v1/snapshots").status, 405);

  for (auto& [n, node] : nodes_) node->stop();
  r = call(http::verb::get, "/v1/snapshots");
  EXPECT_EQ(r.status, 503) << r.body;
}

// A restore is placed like any create, on any node (the store is shared): around drained and full nodes, and a
// missing snapshot or a bad name is answered before any node is asked to create.
TEST_F(GatewayTest, RestoresArePlacedLikeCreates) {
  auto id = create();
  ASSERT_EQ(call(http::verb::post, "/v1/sandboxes/" + id + "/snapshot", R"({"name":"r-1"})").status, 201);
  std::map<std::string, int> per_node;
  for (int i = 0; i < 30; ++i) {
    auto r = call(http::verb::post, "/v1/sandboxes", R"({"snapshot":"r-1","timeout":60,"labels":{"k":"v"}})");
    ASSERT_EQ(r.status, 201) << r.body;
    EXPECT_EQ(r.json()["snapshot"], "r-1");
    EXPECT_EQ(r.json()["labels"], json({{"k", "v"}}));
    per_node[r.json()["node"]]++;
  }
  ASSERT_EQ(per_node.size(), 3u);
  for (const auto& [n, count] : per_node) EXPECT_GE(count, 5) << n;

  std::string source_node = nodeOfSandboxId(id);
  ASSERT_EQ(call(http::verb::post, "/v1/fleet/nodes/" + source_node + "/drain").status, 200);
  for (int i = 0; i < 10; ++i) {
    auto r = call(http::verb::post, "/v1/sandboxes", R"({"snapshot":"r-1"})");
    ASSERT_EQ(r.status, 201) << r.body;
    EXPECT_NE(r.json()["node"], source_node);
  }
  for (auto& [n, node] : nodes_) node->full_ = n != "n2";
  ASSERT_EQ(call(http::verb::post, "/v1/fleet/nodes/" + source_node + "/undrain").status, 200);
  for (int i = 0; i < 5; ++i) {
    auto r = call(http::verb::post, "/v1/sandboxes", R"({"snapshot":"r-1"})");
    ASSERT_EQ(r.status, 201) << r.body;
    EXPECT_EQ(r.json()["node"], "n2");
  }

  int restores = 0;
  for (auto& [n, node] : nodes_) restores += node->restores_.exchange(0);
  EXPECT_GE(restores, 45);
  auto r = call(http::verb::post, "/v1/sandboxes", R"({"snapshot":"gone-1"})");
  EXPECT_EQ(r.status, 404) << r.body;
  EXPECT_NE(r.body.find("gone-1"), std::string::npos) << r.body;
  for (const char* bad : {R"({"snapshot":"../x"})", R"({"snapshot":""})", R"({"snapshot":7})"}) {
    r = call(http::verb::post, "/v1/sandboxes", bad);
    EXPECT_EQ(r.status, 400) << bad << " " << r.body;
  }
  for (auto& [n, node] : nodes_) EXPECT_EQ(node->restores_.load(), 0) << n;
}

}  // namespace
}  // namespace dsec::launcher
