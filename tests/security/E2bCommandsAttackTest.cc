// One E2B user reaching for another sandbox's commands (docs/security.md §6d): the listener numbers the commands it
// runs with pids anyone can guess, so a holder of sandbox B's access token tries to kill, feed or close the stdin
// of a command running in sandbox A by its pid. Each try must be refused and the command keep running; only A's
// own token stops it. Real sandboxes (busybox), real signals.
#include <gtest/gtest.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <thread>

#include "ApiFixture.h"
#include "dsec/launcher/api/ConnectEnvelope.h"
#include "dsec/launcher/api/HttpClient.h"

namespace dsec::testing {
namespace {

namespace http = boost::beast::http;
using Headers = std::vector<std::pair<std::string, std::string>>;

struct E2bSandbox {
  std::string id;
  std::string access;
};

class E2bCommandsAttack : public ApiTest {
 protected:
  void startWithE2b() {
    auto o = options();
    o.e2b.listen = "127.0.0.1:0";
    o.e2b.default_image = "busybox:1";
    ASSERT_TRUE(startNode(o));
    url_ = node_->e2bEndpoint();
  }

  E2bSandbox create() {
    launcher::client::CallOptions o;
    o.headers = {{"X-API-KEY", node_->token()}, {"Content-Type", "application/json"}};
    auto r = launcher::client::call(url_, http::verb::post, "/v2/sandboxes", "", R"({"templateID": "base"})", o);
    EXPECT_TRUE(r.ok() && r->status == 201) << (r.ok() ? r->body : r.error().message());
    if (!r.ok()) return {};
    return {r->json().value("sandboxID", ""), r->json().value("envdAccessToken", "")};
  }

  int envdCall(const E2bSandbox& as, const std::string& method, const nlohmann::json& body) {
    launcher::client::CallOptions o;
    o.headers = {{"E2b-Sandbox-Id", as.id}, {"X-Access-Token", as.access}, {"Content-Type", "application/json"}};
    auto r = launcher::client::call(url_, http::verb::post, "/process.Process/" + method, "", body.dump(), o);
    EXPECT_TRUE(r.ok());
    return r.ok() ? r->status : 0;
  }

  std::string url_;
};

TEST_F(E2bCommandsAttack, AnotherSandboxsTokenCannotSignalFeedOrCloseACommandByItsPid) {
  startWithE2b();
  SKIP_WITHOUT_BACKEND();
  const E2bSandbox victim = create();
  const E2bSandbox attacker = create();
  ASSERT_FALSE(victim.id.empty() || attacker.id.empty());

  // The victim's long command, streamed as E2B's SDK streams it; its frames are collected on a thread.
  std::atomic<uint32_t> pid{0};
  std::atomic<bool> ended{false};
  std::thread stream([&] {
    launcher::client::CallOptions o;
    o.io_timeout_ms = 120000;
    o.headers = {
        {"E2b-Sandbox-Id", victim.id}, {"X-Access-Token", victim.access}, {"Content-Type", "application/connect+json"}};
    const std::string start = launcher::connectFrame(
        0, R"({"process": {"cmd": "/bin/sh", "args": ["-c", "echo up; sleep 60"]}, "stdin": true})");
    std::string buffer;
    (void)launcher::client::callStreaming(
        url_, http::verb::post, "/process.Process/Start", "", start, o, [&](const char* data, size_t size) {
          buffer.append(data, size);
          while (buffer.size() >= 5) {
            const uint32_t n = (static_cast<uint8_t>(buffer[1]) << 24) | (static_cast<uint8_t>(buffer[2]) << 16) |
                               (static_cast<uint8_t>(buffer[3]) << 8) | static_cast<uint8_t>(buffer[4]);
            if (buffer.size() < 5 + n) break;
            auto j = nlohmann::json::parse(buffer.substr(5, n), nullptr, false);
            if (j.contains("/event/start/pid"_json_pointer)) {
              pid = j["event"]["start"]["pid"].get<uint32_t>();
            }
            if (j.contains("/event/end"_json_pointer)) ended = true;
            buffer.erase(0, 5 + n);
          }
          return true;
        });
  });
  const double deadline = monotonicSeconds() + 60;
  while (pid == 0 && monotonicSeconds() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_NE(pid.load(), 0u) << "the victim's command never started";
  const nlohmann::json selector = {{"pid", pid.load()}};

  // The attacker, with its own sandbox's valid token, names the victim's pid.
  EXPECT_EQ(envdCall(attacker, "SendSignal", {{"process", selector}, {"signal", "SIGNAL_SIGKILL"}}), 404);
  EXPECT_EQ(envdCall(attacker, "SendInput", {{"process", selector}, {"input", {{"stdin", "aGk="}}}}), 404);
  EXPECT_EQ(envdCall(attacker, "CloseStdin", {{"process", selector}}), 404);
  // ... or the victim's sandbox id with its own token.
  EXPECT_EQ(envdCall({victim.id, attacker.access}, "SendSignal", {{"process", selector}, {"signal", 9}}), 401);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(ended.load()) << "the victim's command ended after the attacker's calls";

  // The victim's own token stops it: the attacker's refusals were not for want of a working route.
  EXPECT_EQ(envdCall(victim, "SendSignal", {{"process", selector}, {"signal", "SIGNAL_SIGKILL"}}), 200);
  stream.join();
  EXPECT_TRUE(ended.load()) << "the command did not end after its own token's kill";
}

}  // namespace
}  // namespace dsec::testing
