// The E2B-compatible listener against clients without the fleet's token, and against one sandbox's holder reaching
// for another sandbox (docs/security.md §6d): the control plane answers nothing without X-API-KEY (dsec's own Bearer
// header does not stand in for it), and a sandbox's envdAccessToken opens only that sandbox's data plane. Ids that
// are not sandbox ids never reach the dsec API.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "dsec/launcher/api/E2bFront.h"
#include "dsec/launcher/api/HttpClient.h"
#include "dsec/launcher/api/Serve.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::testing {
namespace {

namespace http = boost::beast::http;
using Headers = std::vector<std::pair<std::string, std::string>>;

class E2bListenerAttack : public ::testing::Test {
 protected:
  void SetUp() override {
    launcher::ServeOptions o;
    o.node.root = root_.path();
    o.http.listen = "127.0.0.1:0";
    o.node.fleet_name = "security-test";
    o.node.node_name = "s0";
    o.write_fleet_file = false;
    o.node.simulate = true;  // the listener and the API are the same over a simulated node
    o.e2b.listen = "127.0.0.1:0";
    o.e2b.default_image = "busybox:1";
    auto node = launcher::EmbeddedNode::start(o);
    ASSERT_OK(node);
    node_ = std::move(*node);
    url_ = node_->e2bEndpoint();
    ASSERT_FALSE(url_.empty());
  }

  launcher::client::HttpReply send(http::verb method, const std::string& target, const Headers& headers,
                                   const std::string& body = "") {
    launcher::client::CallOptions o;
    o.headers = headers;
    o.all_headers = true;
    auto r = launcher::client::call(url_, method, target, "", body, o);
    EXPECT_TRUE(r.ok()) << target;
    return r.ok() ? *r : launcher::client::HttpReply{};
  }

  // A sandbox created with the API key: (id, its envdAccessToken).
  std::pair<std::string, std::string> create() {
    auto r = send(http::verb::post, "/v2/sandboxes",
                  {{"X-API-KEY", node_->token()}, {"Content-Type", "application/json"}}, R"({"templateID": "base"})");
    EXPECT_EQ(r.status, 201) << r.body;
    auto j = r.json();
    return {j.value("sandboxID", ""), j.value("envdAccessToken", "")};
  }

  TempDir root_;
  std::unique_ptr<launcher::EmbeddedNode> node_;
  std::string url_;
};

TEST_F(E2bListenerAttack, TheControlPlaneAnswersNothingWithoutTheApiKey) {
  auto [id, access] = create();
  ASSERT_FALSE(id.empty());
  const std::vector<std::pair<http::verb, std::string>> calls = {
      {http::verb::post, "/v2/sandboxes"},
      {http::verb::get, "/v2/sandboxes"},
      {http::verb::get, "/sandboxes/" + id},
      {http::verb::delete_, "/sandboxes/" + id},
      {http::verb::post, "/sandboxes/" + id + "/timeout"},
      {http::verb::post, "/v2/sandboxes/" + id + "/connect"}};
  for (const Headers& who : std::vector<Headers>{{},
                                                 {{"X-API-KEY", "wrong"}},
                                                 {{"X-API-KEY", access}},  // a sandbox's token is not the API key
                                                 {{"Authorization", "Bearer " + node_->token()}}}) {
    for (const auto& [method, target] : calls) {
      auto r = send(method, target, who, method == http::verb::post ? R"({"templateID": "base", "timeout": 1})" : "");
      EXPECT_EQ(r.status, 401) << target << " answered without the API key: " << r.body;
      EXPECT_EQ(r.body.find(id), std::string::npos) << target;
    }
  }
  // The sandbox is still there, with its timeout untouched: none of the above reached the API.
  auto r = send(http::verb::get, "/sandboxes/" + id, {{"X-API-KEY", node_->token()}});
  EXPECT_EQ(r.status, 200) << r.body;
}

TEST_F(E2bListenerAttack, ASandboxsAccessTokenOpensOnlyThatSandbox) {
  auto [mine, my_access] = create();
  auto [theirs, their_access] = create();
  ASSERT_FALSE(mine.empty() || theirs.empty());
  EXPECT_NE(my_access, their_access);
  EXPECT_EQ(send(http::verb::get, "/health", {{"E2b-Sandbox-Id", mine}, {"X-Access-Token", my_access}}).status, 204);
  const std::vector<std::pair<http::verb, std::string>> calls = {{http::verb::get, "/health"},
                                                                 {http::verb::get, "/files?path=/etc/passwd"},
                                                                 {http::verb::post, "/files?path=/tmp/x"},
                                                                 {http::verb::post, "/filesystem.Filesystem/Stat"},
                                                                 {http::verb::post, "/filesystem.Filesystem/Remove"},
                                                                 {http::verb::post, "/process.Process/Start"}};
  for (const Headers& who :
       std::vector<Headers>{{{"E2b-Sandbox-Id", theirs}, {"X-Access-Token", my_access}},
                            {{"E2b-Sandbox-Id", theirs}},
                            {{"E2b-Sandbox-Id", theirs}, {"X-Access-Token", node_->token()}},
                            {{"E2b-Sandbox-Id", theirs}, {"X-API-KEY", node_->token()}},
                            {{"E2b-Sandbox-Id", "../v1/node"}, {"X-Access-Token", my_access}},
                            {{"E2b-Sandbox-Id", mine + "/../" + theirs}, {"X-Access-Token", my_access}}}) {
    for (const auto& [method, target] : calls) {
      auto r = send(method, target, who, method == http::verb::post ? R"({"path": "/"})" : "");
      EXPECT_EQ(r.status, 401) << target << " with another sandbox's or no access token: " << r.body;
    }
  }
  // The tokens are an HMAC under the fleet's token: a listener with another token derives other ones.
  EXPECT_EQ(launcher::E2bFront::envdAccessToken(node_->token(), theirs), their_access);
  EXPECT_NE(launcher::E2bFront::envdAccessToken(node_->token() + "x", theirs), their_access);
}

TEST_F(E2bListenerAttack, IdsThatAreNotSandboxIdsNeverReachTheApi) {
  const Headers key = {{"X-API-KEY", node_->token()}};
  for (const std::string target :
       {"/sandboxes/..%2F..%2Fv1%2Fnode", "/sandboxes/..", "/sandboxes/%2e%2e", "/sandboxes/x%2Fpause"}) {
    auto r = send(http::verb::get, target, key);
    EXPECT_NE(r.status, 200) << target << ": " << r.body;
    EXPECT_EQ(r.body.find("\"node\""), std::string::npos) << target << " reached another route";
  }
}

}  // namespace
}  // namespace dsec::testing
