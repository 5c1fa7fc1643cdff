// The HTTP surface without sandboxes: auth, routing, validation, limits, abuse. Runs wherever the node
// starts (no root needed); creates that need the backend are in ApiSandboxTest.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>

#include "ApiFixture.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/api/Credentials.h"

namespace dsec::testing {
namespace {

using boost::beast::http::verb;
using nlohmann::json;

TEST_F(ApiTest, HealthzNeedsNoTokenEverythingElseDoes) {
  startNode();
  auto h = client_->request(verb::get, "/healthz", "", {}, /*auth=*/false);
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.json()["status"], "ok");
  EXPECT_EQ(h.json()["node"], "t0");
  EXPECT_EQ(h.json()["fleet"], "launcher-test");
  for (const char* target : {"/v1/node", "/metrics", "/v1/sandboxes", "/v1/layers", "/v1/nothing"}) {
    auto r = client_->request(verb::get, target, "", {}, /*auth=*/false);
    EXPECT_EQ(r.status, 401) << target;
    EXPECT_EQ(r.errorCode(), "unauthorized") << target;
  }
  client_->setToken(std::string(64, '0'));
  EXPECT_EQ(client_->get("/v1/node").status, 401);
  auto lower = client_->request(verb::get, "/v1/node", "", {{"Authorization", "bearer " + node_->token()}}, false);
  EXPECT_EQ(lower.status, 200) << "the scheme is case-insensitive";
  client_->setToken(node_->token());
  auto node = client_->get("/v1/node");
  ASSERT_EQ(node.status, 200);
  EXPECT_EQ(node.json()["node"], "t0");
  EXPECT_TRUE(node.json()["capacity"].contains("max_sandboxes"));
}

TEST_F(ApiTest, TokenIsPrivateAndSurvivesRestart) {
  startNode();
  std::string token = node_->token();
  struct stat st;
  ASSERT_EQ(::stat((root_->path() + "/token").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  node_->stop(false);
  startNode();
  EXPECT_EQ(node_->token(), token);
}

TEST_F(ApiTest, FleetFileWrittenAndRemoved) {
  TempDir home;
  std::string saved = std::getenv("HOME") ? std::getenv("HOME") : "";
  ::setenv("HOME", home.path().c_str(), 1);
  auto o = options();
  o.write_fleet_file = true;
  ASSERT_TRUE(startNode(o));
  std::string path = home.path() + "/.dsec/fleets/launcher-test.json";
  auto text = readFile(path);
  ASSERT_OK(text);
  auto j = json::parse(*text);
  EXPECT_EQ(j["endpoint"], node_->endpoint());
  EXPECT_EQ(j["token"], node_->token());
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  node_->stop(false);
  EXPECT_NE(::access(path.c_str(), F_OK), 0) << "fleet file left after a clean stop";
  if (!saved.empty()) ::setenv("HOME", saved.c_str(), 1);
}

TEST_F(ApiTest, ServeUntilSignalStopsCleanlyOnSigterm) {
  TempDir home;
  std::string saved = std::getenv("HOME") ? std::getenv("HOME") : "";
  ::setenv("HOME", home.path().c_str(), 1);
  auto o = options();
  o.write_fleet_file = true;
  o.node.fleet_name = "sigterm-test";
  Status result = Error::internal("not returned");
  std::thread server([&] { result = launcher::serveUntilSignal(o); });
  std::string path = home.path() + "/.dsec/fleets/sigterm-test.json";
  for (int i = 0; i < 200 && ::access(path.c_str(), F_OK) != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  auto text = readFile(path);
  EXPECT_OK(text);
  if (text.ok()) {
    auto j = json::parse(*text);
    HttpTestClient c(j["endpoint"], j["token"]);
    EXPECT_EQ(c.get("/v1/node").status, 200);
  }
  ::kill(::getpid(), SIGTERM);
  server.join();
  EXPECT_OK(result);
  EXPECT_NE(::access(path.c_str(), F_OK), 0) << "fleet file left after SIGTERM";
  if (!saved.empty()) ::setenv("HOME", saved.c_str(), 1);
}

TEST_F(ApiTest, RoutesAndMethods) {
  startNode();
  auto r = client_->get("/v1/nothing");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.errorCode(), "not_found");
  r = client_->request(verb::put, "/v1/sandboxes");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.headers["allow"], "GET, POST");
  r = client_->get("/v1/sandboxes/t0-0123456789abcdef");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.errorCode(), "not_found");
  EXPECT_EQ(client_->del("/v1/sandboxes/t0-0123456789abcdef").status, 404);
  EXPECT_EQ(client_->postJson("/v1/sandboxes/t0-0123456789abcdef/exec", {{"cmd", "true"}}).status, 404);
  EXPECT_EQ(client_->get("/v1/sandboxes/t0-0123456789abcdef/files?path=/etc/passwd").status, 404);
  r = client_->get("/v1/sandboxes/t0-0123456789abcdef/files?path=etc/passwd");
  EXPECT_EQ(r.status, 400) << "a relative path is invalid whatever the sandbox";
  EXPECT_NE(r.body.find("absolute"), std::string::npos) << r.body;
  EXPECT_EQ(client_->get("/v1/sandboxes/t0-0123456789abcdef/files").status, 400);
  EXPECT_EQ(client_->get("/v1/sandboxes?label=novalue").status, 400);
  auto list = client_->get("/v1/sandboxes");
  ASSERT_EQ(list.status, 200);
  EXPECT_TRUE(list.json()["sandboxes"].is_array());
  auto layers = client_->get("/v1/layers");
  ASSERT_EQ(layers.status, 200) << layers.body;
  if (layer_error_.empty()) {
    ASSERT_EQ(layers.json()["layers"].size(), 1u);
    EXPECT_EQ(layers.json()["layers"][0]["name"], "busybox");
    EXPECT_EQ(layers.json()["layers"][0]["version"], "1");
    EXPECT_FALSE(layers.json()["layers"][0]["sha256"].get<std::string>().empty());
  }
}

TEST_F(ApiTest, BadCreateBodiesAre4xxNamingTheProblem) {
  startNode();
  struct Case {
    std::string body;
    int status;
    std::string mention;
  };
  for (const auto& c : std::vector<Case>{
           {"{not json", 400, "malformed JSON"},
           {"[]", 400, "JSON object"},
           {"", 400, "malformed JSON"},
           {R"({"image": 12})", 400, "image"},
           {R"({"image": "busybox:1", "memory": -1})", 400, "memory"},
           {R"({"image": "busybox:1", "memory": "1P"})", 400, "memory"},
           {R"({"image": "busybox:1", "cpus": "x"})", 400, "cpus"},
           {R"({"image": "busybox:1", "pids": 1e400})", 400, "malformed JSON"},
           {R"({"image": "busybox:1", "extra": 1})", 400, "unknown field 'extra'"},
           {R"({"image": "busybox:1+nosuch:7"})", 404, "nosuch:7"},
           {R"({"image": "busybox:1", "backend": "lxc"})", 400, "backend"},
           {R"({"image": "busybox:1", "backend": "fncall"})", 400, "/v1/call"},
       }) {
    auto r = client_->request(verb::post, "/v1/sandboxes", c.body, {{"Content-Type", "application/json"}});
    EXPECT_EQ(r.status, c.status) << c.body << " -> " << r.body;
    EXPECT_NE(r.body.find(c.mention), std::string::npos) << c.body << " -> " << r.body;
    EXPECT_FALSE(r.errorCode().empty()) << r.body;
  }
  auto bad_exec = client_->request(verb::post, "/v1/sandboxes/t0-0123456789abcdef/exec", R"({"cmd": 5})");
  EXPECT_EQ(bad_exec.status, 400) << bad_exec.body;
  EXPECT_NE(bad_exec.body.find("cmd"), std::string::npos);
}

TEST_F(ApiTest, OversizedBodiesGet413) {
  startNode();
  std::string big(2 << 20, 'x');
  auto r = client_->request(verb::post, "/v1/sandboxes", big, {{"Content-Type", "application/json"}});
  EXPECT_EQ(r.status, 413) << r.body;
  EXPECT_EQ(r.errorCode(), "too_large");
  std::string huge((64 << 20) + 100, ' ');
  r = client_->request(verb::post, "/v1/sandboxes/t0-0123456789abcdef/exec", huge);
  EXPECT_EQ(r.status, 413) << r.body;
  // The server is still fine afterwards.
  EXPECT_EQ(client_->get("/v1/node").status, 200);
}

TEST_F(ApiTest, SurvivesGarbageAndAbandonedRequests) {
  startNode();
  std::string garbage;
  for (int i = 0; i < 5000; ++i) garbage.push_back(static_cast<char>((i * 7919) % 256));
  std::string reply = client_->raw(garbage, 3);
  EXPECT_TRUE(reply.empty() || reply.rfind("HTTP/1.1 400", 0) == 0) << reply.substr(0, 200);
  // Header larger than the limit.
  reply = client_->raw("GET /healthz HTTP/1.1\r\nX-Big: " + std::string(100000, 'a') + "\r\n\r\n", 3);
  EXPECT_EQ(reply.rfind("HTTP/1.1 400", 0), 0u) << reply.substr(0, 200);
  // A body promised and never sent, then the client leaves.
  (void)client_->raw("POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + node_->token() +
                         "\r\nContent-Length: 1000\r\n\r\n{\"image\"",
                     0.3);
  // Half a request line, then gone.
  (void)client_->raw("GET /v1/no", 0.2);
  // Pipelined requests on one connection both get answers.
  reply = client_->raw(
      "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 3);
  size_t first = reply.find("HTTP/1.1 200");
  ASSERT_NE(first, std::string::npos) << reply;
  EXPECT_NE(reply.find("HTTP/1.1 200", first + 1), std::string::npos) << reply;
  auto h = client_->request(verb::get, "/healthz", "", {}, false);
  EXPECT_EQ(h.status, 200);
}

TEST_F(ApiTest, ConnectionLimitAnswers503) {
  auto o = options();
  o.http.max_connections = 2;
  ASSERT_TRUE(startNode(o));
  HttpTestClient a(node_->endpoint(), node_->token()), b(node_->endpoint(), node_->token());
  ASSERT_EQ(a.get("/v1/node").status, 200);  // both stay connected (keep-alive)
  ASSERT_EQ(b.get("/v1/node").status, 200);
  std::string reply = client_->raw("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 3);
  EXPECT_EQ(reply.rfind("HTTP/1.1 503", 0), 0u) << reply;
}

TEST_F(ApiTest, MetricsText) {
  startNode();
  (void)client_->get("/v1/nothing");
  auto m = client_->get("/metrics");
  ASSERT_EQ(m.status, 200);
  EXPECT_EQ(m.headers["content-type"].rfind("text/plain", 0), 0u);
  for (const char* want :
       {"dsec_sandbox_creates_total ", "dsec_sandbox_create_failures_total ", "dsec_execs_total ",
        "dsec_sandbox_create_seconds_bucket{le=\"+Inf\"}", "dsec_http_requests_total{code=\"404\"} 1",
        "dsec_sandboxes{state=\"running\"} 0", "dsec_layer_mounts ", "dsec_node_memory_committed_bytes 0"}) {
    EXPECT_NE(m.body.find(want), std::string::npos) << want << "\n" << m.body;
  }
}

}  // namespace
}  // namespace dsec::testing
