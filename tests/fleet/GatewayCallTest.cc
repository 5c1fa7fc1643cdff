// POST /v1/call through the gateway against fake nodes (real HTTP servers): calls are spread round robin over
// the healthy nodes that offer fncall, a node's 429 or silence sends the call to the next node, and only when
// every node refused does the client get the capacity error (with its retry hint).
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <memory>

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

class CallNode : public RequestHandler {
 public:
  CallNode(std::string name, bool fncall) : name_(std::move(name)), fncall_(fncall) {
    HttpServerOptions o;
    o.listen = "127.0.0.1:0";
    server_ = HttpServer::start(o, this).value();
  }
  ~CallNode() override { stop(); }
  void stop() {
    if (server_) server_->stop();
  }
  FleetNodeSpec spec() const {
    FleetNodeSpec s;
    s.name = name_;
    s.endpoint = server_->endpoint();
    s.cpus = 2;
    s.memory_bytes = 4LL << 30;
    s.backends = fncall_ ? std::vector<std::string>{"container", "fncall"} : std::vector<std::string>{"container"};
    return s;
  }
  void handle(HttpExchange& ex) override {
    if (std::string(ex.target()) != "/v1/call" || ex.method() != http::verb::post) {
      ex.discardBody(1 << 20);
      return ex.sendJson(200, json{{"node", name_}, {"backends", spec().backends}});
    }
    bool too_large = false;
    auto body = ex.readBody(64 << 20, &too_large);
    calls_++;
    if (full_) {
      return ex.sendError(429, "capacity", name_ + " has no free worker", {{"Retry-After", "1"}},
                          json{{"retry_after", 1}});
    }
    ex.sendJson(200, json{{"exit_code", 0}, {"stdout", name_ + ":" + json::parse(*body)["code"].get<std::string>()}});
  }

  std::string name_;
  bool fncall_;
  std::atomic<bool> full_{false};
  std::atomic<int> calls_{0};
  std::unique_ptr<HttpServer> server_;
};

class GatewayCallTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GatewayOptions o;
    o.fleet_name = "test";
    o.token = kToken;
    o.connect_timeout_ms = 500;
    gateway_ = std::make_unique<Gateway>(o);
    for (auto [n, fncall] : {std::pair{"n1", true}, std::pair{"n2", true}, std::pair{"n3", false}}) {
      nodes_[n] = std::make_unique<CallNode>(n, fncall);
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
  client::HttpReply post(const std::string& code) {
    auto r = client::call(server_->endpoint(), http::verb::post, "/v1/call", kToken, json{{"code", code}}.dump(),
                          client::CallOptions{});
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message());
    return r.ok() ? *r : client::HttpReply{};
  }

  std::unique_ptr<Gateway> gateway_;
  std::map<std::string, std::unique_ptr<CallNode>> nodes_;
  std::unique_ptr<HttpServer> server_;
};

TEST_F(GatewayCallTest, SpreadOverNodesThatOfferFncall) {
  for (int i = 0; i < 10; ++i) {
    auto r = post("print(" + std::to_string(i) + ")");
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_NE(r.json().value("stdout", "").find(":print(" + std::to_string(i) + ")"), std::string::npos);
  }
  EXPECT_EQ(nodes_["n1"]->calls_, 5);
  EXPECT_EQ(nodes_["n2"]->calls_, 5);
  EXPECT_EQ(nodes_["n3"]->calls_, 0);  // no fncall there
}

TEST_F(GatewayCallTest, AFullNodeIsSkippedAndAFullFleetIs429) {
  nodes_["n1"]->full_ = true;
  for (int i = 0; i < 4; ++i) {
    auto r = post("x");
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.json().value("stdout", ""), "n2:x");
  }
  nodes_["n2"]->full_ = true;
  auto r = post("x");
  EXPECT_EQ(r.status, 429) << r.body;
  EXPECT_EQ(r.json()["error"]["code"], "capacity");
  EXPECT_EQ(r.json()["error"].value("retry_after", 0), 1);
}

TEST_F(GatewayCallTest, ASilentNodeIsSkipped) {
  nodes_["n1"]->stop();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(post("y").json().value("stdout", ""), "n2:y");
}

TEST_F(GatewayCallTest, NoNodeWithFncallIs501AndOnlyPostIsAllowed) {
  ASSERT_OK(gateway_->removeNode("n1"));
  ASSERT_OK(gateway_->removeNode("n2"));
  auto r = post("z");
  EXPECT_EQ(r.status, 501) << r.body;
  auto get = client::call(server_->endpoint(), http::verb::get, "/v1/call", kToken, "", client::CallOptions{});
  ASSERT_OK(get);
  EXPECT_EQ(get->status, 405);
}

}  // namespace
}  // namespace dsec::launcher
