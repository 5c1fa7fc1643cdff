// Attacks on the HTTP edge of the node API and of the fleet gateway by a user of the node without the token
// (dsec_http_attacker run as uid 65534): slow request heads, slow bodies, and one client holding many
// connections. Each test fails if the attack works: if the attacker holds more threads than its budget, keeps
// connections past the deadlines, or keeps a legitimate client from being served.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <latch>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "Attacker.h"
#include "HttpTestClient.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/api/HttpServer.h"
#include "dsec/launcher/api/Serve.h"
#include "dsec/launcher/fleet/Gateway.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::testing {
namespace {

using nlohmann::json;
namespace http = boost::beast::http;

// The limits every edge runs with here: small, so the attacks are quick, and the deadlines short.
constexpr int kMaxConnections = 64;
constexpr int kClientBudget = 8;
constexpr double kHeaderTimeout = 2;
constexpr double kBodyTimeout = 2;
constexpr double kQueueWait = 2;  // HttpServerOptions::client_queue_seconds, the default
// How much later than its deadline the server may close a connection on a loaded 2-core machine.
constexpr double kSlack = 4;

// A node API (simulated node: the transport is the same) or a gateway, on 127.0.0.1:0.
class Edge {
 public:
  static std::unique_ptr<Edge> start(const std::string& kind, int max_connections = kMaxConnections) {
    auto e = std::make_unique<Edge>();
    if (kind == "node") {
      e->root_ = std::make_unique<TempDir>();
      launcher::ServeOptions o;
      o.node.root = e->root_->path();
      o.http.listen = "127.0.0.1:0";
      o.node.fleet_name = "security-test";
      o.node.node_name = "s0";
      o.write_fleet_file = false;
      o.node.simulate = true;
      o.http.max_connections = max_connections;
      o.http.max_client_connections = kClientBudget;
      o.http.header_timeout_seconds = kHeaderTimeout;
      o.http.body_timeout_seconds = kBodyTimeout;
      auto node = launcher::EmbeddedNode::start(o);
      EXPECT_TRUE(node.ok()) << node.error().toString();
      if (!node.ok()) return nullptr;
      e->node_ = std::move(*node);
      e->endpoint_ = e->node_->endpoint();
      e->token_ = e->node_->token();
    } else {
      launcher::GatewayOptions go;
      go.token = "gateway-token";
      go.fleet_name = "security-test";
      e->gateway_ = std::make_unique<launcher::Gateway>(go);
      launcher::HttpServerOptions ho;
      ho.listen = "127.0.0.1:0";
      ho.max_connections = max_connections;
      ho.max_client_connections = kClientBudget;
      ho.header_timeout_seconds = kHeaderTimeout;
      ho.body_timeout_seconds = kBodyTimeout;
      auto server = launcher::HttpServer::start(ho, e->gateway_.get());
      EXPECT_TRUE(server.ok()) << server.error().toString();
      if (!server.ok()) return nullptr;
      e->server_ = std::move(*server);
      e->endpoint_ = e->server_->endpoint();
      e->token_ = go.token;
    }
    e->port_ = std::stoi(e->endpoint_.substr(e->endpoint_.rfind(':') + 1));
    return e;
  }
  ~Edge() {
    if (server_) server_->stop();
    if (node_) node_->stop(true);
  }

  const std::string& endpoint() const { return endpoint_; }
  const std::string& token() const { return token_; }
  int port() const { return port_; }
  // The transport's counters ("http" of GET /v1/node).
  json httpStats(HttpTestClient& client) { return client.get("/v1/node").json().value("http", json::object()); }

 private:
  std::unique_ptr<TempDir> root_;
  std::unique_ptr<launcher::EmbeddedNode> node_;
  std::unique_ptr<launcher::Gateway> gateway_;
  std::unique_ptr<launcher::HttpServer> server_;
  std::string endpoint_, token_;
  int port_ = 0;
};

// Samples the edge's connection counts while an attack runs (an authenticated client: it is not budgeted).
class Sampler {
 public:
  Sampler(Edge& edge) : edge_(edge), client_(edge.endpoint(), edge.token()) {
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        try {
          json h = edge_.httpStats(client_);
          // The client holding the most unauthenticated connections (the attacker; the checks hold one or two).
          max_unauthenticated_ = std::max<int64_t>(max_unauthenticated_, h.value("largest_client_unauthenticated", 0));
          max_connections_ = std::max<int64_t>(max_connections_, h.value("connections", 0));
          samples_++;
        } catch (const std::exception&) {
          errors_++;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
  }
  ~Sampler() { stop(); }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // Blocks until pred(stats) holds or timeout; false on timeout.
  bool waitFor(const std::function<bool(const json&)>& pred, double timeout_seconds) {
    HttpTestClient c(edge_.endpoint(), edge_.token());
    double deadline = monotonicSeconds() + timeout_seconds;
    while (monotonicSeconds() < deadline) {
      last_ = edge_.httpStats(c);
      if (pred(last_)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  const json& last() const { return last_; }
  int64_t maxUnauthenticated() const { return max_unauthenticated_; }
  int64_t maxConnections() const { return max_connections_; }
  int samples() const { return samples_; }
  int errors() const { return errors_; }

 private:
  Edge& edge_;
  HttpTestClient client_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> max_unauthenticated_{0}, max_connections_{0};
  std::atomic<int> samples_{0}, errors_{0};
  json last_;
};

// Root is checked in SetUp: a start that fails here is a broken build or environment, never a reason to skip.
#define START_ATTACKER(var, ...)                                       \
  auto var##_started = AttackerProcess::start(__VA_ARGS__);            \
  ASSERT_TRUE(var##_started.ok()) << var##_started.error().toString(); \
  auto var = std::move(*var##_started)

class HttpEdgeTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    DSEC_SKIP_UNLESS_ROOT();
    edge_ = Edge::start(GetParam());
    ASSERT_NE(edge_, nullptr);
  }
  void TearDown() override { edge_.reset(); }

  // A legitimate client: a fresh connection with the token, as root (another user than the attacker).
  void expectServedPromptly(const char* when) {
    HttpTestClient legit(edge_->endpoint(), edge_->token());
    double t0 = monotonicSeconds();
    HttpReply r;
    try {
      r = legit.get("/v1/node");
    } catch (const std::exception& e) {
      ADD_FAILURE() << when << ": the legitimate request failed: " << e.what();
      return;
    }
    double took = monotonicSeconds() - t0;
    EXPECT_EQ(r.status, 200) << when << ": " << r.body;
    EXPECT_LT(took, 5.0) << when << ": the legitimate request took " << took << " s";
  }

  // Every attacker connection was closed by the server within `bound` seconds and none got a 2xx answer.
  static void expectAllClosedWithin(const json& report, double bound, const char* attack) {
    int n = 0;
    for (const auto& c : report["connections"]) {
      ++n;
      SCOPED_TRACE(std::string(attack) + " connection " + std::to_string(n) + ": " + c.dump());
      EXPECT_TRUE(c["connected"].get<bool>());
      ASSERT_FALSE(c["closed_after"].is_null()) << "the server still held this connection when the attack ended";
      EXPECT_LE(c["closed_after"].get<double>(), bound);
      int status = c["status"].get<int>();
      EXPECT_TRUE(status == 0 || status >= 400) << "the attacker was served " << status;
    }
    EXPECT_GT(n, 0);
  }

  // The attack is under way once the server has accepted all of its connections (and the sampler's two).
  static std::function<bool(const json&)> attackArrived(int connections) {
    return [connections](const json& h) { return h.value("accepted", 0) >= connections + 2; };
  }

  static int countStatus(const json& report, int status) {
    int n = 0;
    for (const auto& c : report["connections"]) n += c["status"].get<int>() == status;
    return n;
  }

  std::unique_ptr<Edge> edge_;
};

TEST_P(HttpEdgeTest, SlowRequestHeadsAreCutAtTheDeadlineWhileOthersAreServed) {
  Sampler sampler(*edge_);
  // More connections than the server has threads, each trickling a head that never ends.
  const int connections = kMaxConnections + 36;
  START_ATTACKER(attacker, {"slow-head", "--port", std::to_string(edge_->port()), "--connections",
                            std::to_string(connections), "--interval-ms", "200", "--for", "15", "--path", "/v1/node"});
  ASSERT_TRUE(sampler.waitFor(attackArrived(connections), 30)) << "the attack never arrived: " << sampler.last().dump();
  expectServedPromptly("while slow heads hold their client's budget");
  std::string other_user = rawRequest(edge_->port(), "127.0.0.2", "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 10);
  EXPECT_EQ(statusOf(other_user), 200) << "a client without the token (another user) was not served: " << other_user;

  auto report = attacker->finish();
  ASSERT_OK(report);
  sampler.stop();
  expectAllClosedWithin(*report, kHeaderTimeout + kQueueWait + kSlack, "slow head");
  EXPECT_GT(countStatus(*report, 408), 0) << report->dump();
  EXPECT_LE(sampler.maxUnauthenticated(), kClientBudget) << "the attacker held more connections than its budget";
  EXPECT_LE(sampler.maxConnections(), kClientBudget + 3);  // + the sampler's, the checks' and one in flight
  EXPECT_GT(sampler.samples(), 0);
  HttpTestClient c(edge_->endpoint(), edge_->token());
  json h = edge_->httpStats(c);
  EXPECT_GT(h.value("header_timeouts", 0), 0) << h.dump();
  EXPECT_LE(h.value("connections", 0), 2) << h.dump();
  expectServedPromptly("after the attack");
}

TEST_P(HttpEdgeTest, SlowRequestBodiesAreCutAtTheMinimumRate) {
  Sampler sampler(*edge_);
  // Node and gateway share one edge: both read (and drop) a body sent with GET /healthz, which needs no token
  // (a request that needs one is answered 401 before its body is read).
  START_ATTACKER(attacker,
                 {"slow-body", "--port", std::to_string(edge_->port()), "--connections", "20", "--interval-ms", "200",
                  "--for", "15", "--method", "GET", "--path", "/healthz", "--length", "100000"});
  ASSERT_TRUE(sampler.waitFor(attackArrived(20), 30)) << "the attack never arrived: " << sampler.last().dump();
  expectServedPromptly("while slow bodies hold their client's budget");
  auto report = attacker->finish();
  ASSERT_OK(report);
  sampler.stop();
  expectAllClosedWithin(*report, kBodyTimeout + kQueueWait + kSlack, "slow body");
  EXPECT_GT(countStatus(*report, 408), 0) << report->dump();
  for (const auto& c : (*report)["connections"]) {
    // A body at one byte per 200 ms sends a handful of bytes before the deadline, never the promised 100000.
    EXPECT_LT(c["sent"].get<int64_t>(), 2000) << c.dump();
  }
  EXPECT_LE(sampler.maxUnauthenticated(), kClientBudget);
  HttpTestClient c(edge_->endpoint(), edge_->token());
  EXPECT_GT(edge_->httpStats(c).value("body_timeouts", 0), 0);
}

TEST_P(HttpEdgeTest, OneClientCannotHoldMoreThanItsConnectionBudget) {
  Sampler sampler(*edge_);
  // Forty idle connections, each from another loopback address: a local user can pick any of 127.0.0.0/8, so
  // the budget must follow the user, not the address.
  START_ATTACKER(attacker, {"hold", "--port", std::to_string(edge_->port()), "--connections", "40", "--for", "12",
                            "--sources", "127.0.0.2-127.0.0.41"});
  ASSERT_TRUE(sampler.waitFor(attackArrived(40), 30)) << "the attack never arrived: " << sampler.last().dump();
  // Another client, from one of the very addresses the attacker uses, with and without the token.
  std::string healthz = rawRequest(edge_->port(), "127.0.0.2", "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 10);
  EXPECT_EQ(statusOf(healthz), 200) << healthz;
  std::string info = rawRequest(
      edge_->port(), "127.0.0.2",
      "GET /v1/node HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + edge_->token() + "\r\nConnection: close\r\n\r\n",
      10);
  EXPECT_EQ(statusOf(info), 200) << info;
  expectServedPromptly("while one client holds its budget");

  auto report = attacker->finish();
  ASSERT_OK(report);
  sampler.stop();
  expectAllClosedWithin(*report, kHeaderTimeout + kQueueWait + kSlack, "idle");
  // At most the budget got a thread at a time; the rest were told why, in JSON, within the queue wait.
  int refused = 0;
  for (const auto& c : (*report)["connections"]) {
    if (c["status"].get<int>() != 429) continue;
    ++refused;
    json body = bodyOf(c["answer"].get<std::string>());
    ASSERT_TRUE(body.is_object()) << c.dump();
    EXPECT_EQ(body["error"]["code"], "too_many_connections") << body.dump();
    EXPECT_EQ(body["error"]["limit"], kClientBudget);
    EXPECT_LE(c["closed_after"].get<double>(), kQueueWait + kSlack);
  }
  // Beyond the budget and the client's place in the acceptor's queue (max(budget, max connections / 4)), a
  // connection is refused at once; queued ones are refused (or started, if a slot frees) after the queue wait.
  EXPECT_GE(refused, 40 - kClientBudget - std::max(kClientBudget, kMaxConnections / 4)) << report->dump();
  EXPECT_LE(sampler.maxUnauthenticated(), kClientBudget);
}

TEST_P(HttpEdgeTest, ConnectionsWithoutTheTokenDoNotIdleAfterTheirAnswer) {
  Sampler sampler(*edge_);
  // Each connection asks GET /healthz (no token needed) and then keeps the connection open, silent: without
  // the token, the keep-alive wait for a next request is the head deadline, not the 120 s idle timeout.
  START_ATTACKER(attacker, {"keepalive", "--port", std::to_string(edge_->port()), "--connections",
                            std::to_string(kClientBudget), "--for", "12", "--path", "/healthz"});
  ASSERT_TRUE(sampler.waitFor(attackArrived(kClientBudget), 30)) << "the attack never arrived: " << sampler.last();
  auto report = attacker->finish();
  ASSERT_OK(report);
  for (const auto& c : (*report)["connections"]) {
    EXPECT_EQ(c["status"].get<int>(), 200) << c.dump();
    ASSERT_FALSE(c["closed_after"].is_null()) << "the server still held this connection: " << c.dump();
    EXPECT_LE(c["closed_after"].get<double>(), kHeaderTimeout + kSlack) << c.dump();
  }
}

TEST_P(HttpEdgeTest, ABurstOfAuthenticatedConnectionsFromOneClientIsNotRefused) {
  // A trainer opening many connections at once (all with the token) from one user and address: each counts
  // against the unauthenticated budget only until its first request is read, so none may be refused.
  edge_.reset();
  edge_ = Edge::start(GetParam(), /*max_connections=*/512);
  ASSERT_NE(edge_, nullptr);
  constexpr int kBurst = 200;
  std::latch ready(kBurst);
  std::atomic<int> ok{0};
  std::vector<std::string> failures(kBurst);
  std::vector<std::thread> threads;
  for (int i = 0; i < kBurst; ++i) {
    threads.emplace_back([&, i] {
      HttpTestClient c(edge_->endpoint(), edge_->token());
      ready.arrive_and_wait();
      try {
        auto r = c.get("/v1/node");
        if (r.status == 200) {
          ok++;
        } else {
          failures[i] = std::to_string(r.status) + " " + r.body;
        }
      } catch (const std::exception& e) {
        failures[i] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kBurst);
  for (const auto& f : failures) {
    if (!f.empty()) ADD_FAILURE() << f;
  }
}

TEST_P(HttpEdgeTest, ASlowButSteadyBodyIsAccepted) {
  // A slow upload: 384 KiB at about 128 KiB/s takes longer than the body timeout (2 s) alone, but stays above
  // the minimum rate (64 KiB/s), so it must be read to the end. Both edges read (and drop) the body of a PUT to
  // /healthz before their 405.
  HttpTestClient c(edge_->endpoint(), edge_->token());
  constexpr uint64_t kSize = uint64_t{384} * 1024;
  constexpr uint64_t kPiece = uint64_t{16} * 1024;
  double t0 = monotonicSeconds();
  auto r = c.putStreamed("/healthz", kSize, [&](uint64_t offset) {
    // Paced by the clock: piece k leaves no earlier than k/8 s after the start.
    double due = t0 + static_cast<double>(offset) / static_cast<double>(kPiece) / 8.0;
    while (monotonicSeconds() < due) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return std::string(kPiece, 'x');
  });
  EXPECT_EQ(r.status, 405) << r.body;
  EXPECT_GT(monotonicSeconds() - t0, kBodyTimeout) << "the upload was not slow enough to test anything";
  HttpTestClient stats(edge_->endpoint(), edge_->token());
  EXPECT_EQ(edge_->httpStats(stats).value("body_timeouts", -1), 0);
}

// A create without the token announcing a large body and sending none of it: the edge answers 401 from the head
// and closes, rather than holding a thread to read (or wait for) a body it would drop. Waiting for the body would
// end in 408 after the body timeout instead.
TEST_P(HttpEdgeTest, AnUnauthenticatedUploadIsAnsweredFromItsHead) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_TRUE(fd);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(edge_->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  std::string head =
      "POST /v1/sandboxes HTTP/1.1\r\nHost: edge\r\nContent-Type: application/json\r\n"
      "Content-Length: 100000\r\n\r\n";
  ASSERT_EQ(::send(fd.get(), head.data(), head.size(), MSG_NOSIGNAL), static_cast<ssize_t>(head.size()));
  std::string answer;
  bool closed = false;
  double deadline = monotonicSeconds() + kBodyTimeout + kSlack;
  while (!closed && monotonicSeconds() < deadline) {
    pollfd p{fd.get(), POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char buf[4096];
    ssize_t n = ::recv(fd.get(), buf, sizeof(buf), 0);
    if (n <= 0) {
      closed = true;
    } else {
      answer.append(buf, static_cast<size_t>(n));
    }
  }
  EXPECT_TRUE(startsWith(answer, "HTTP/1.1 401")) << answer;
  EXPECT_TRUE(closed) << "the connection stayed open after the refusal";
}

INSTANTIATE_TEST_SUITE_P(Edges, HttpEdgeTest, ::testing::Values("node", "gateway"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace dsec::testing
