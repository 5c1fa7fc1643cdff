// Node restarts: sandboxes outlive the agent and are re-adopted; what cannot be adopted is reaped.
#include <signal.h>

#include <thread>

#include "ApiFixture.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {
namespace {

using nlohmann::json;

TEST_F(ApiTest, RestartReadoptsRunningSandboxes) {
  startNode();
  SKIP_WITHOUT_BACKEND();
  std::string id = createSandbox({{"labels", {{"keep", "yes"}}}});
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(exec(id, {{"cmd", "echo state > /tmp/kept; sleep 1000 > /dev/null 2>&1 &"}}).json()["exit_code"], 0);
  ASSERT_EQ(client_->request(boost::beast::http::verb::post, sandboxPath(id, "/pause")).status, 200);
  node_->stop(/*destroy_sandboxes=*/false);
  node_.reset();

  startNode();
  auto info = client_->get(sandboxPath(id));
  ASSERT_EQ(info.status, 200) << info.body;
  EXPECT_EQ(info.json()["labels"]["keep"], "yes");
  EXPECT_EQ(info.json()["state"], "paused");
  auto e = exec(id, {{"cmd", "cat /tmp/kept; ps -o args | grep -c '^sleep 1000'"}});
  ASSERT_EQ(e.status, 200) << e.body;
  EXPECT_EQ(e.json()["stdout"], "state\n1\n") << "the background process did not survive the restart";
  EXPECT_EQ(client_->get("/v1/sandboxes").json()["sandboxes"].size(), 1u);
  ASSERT_EQ(client_->del(sandboxPath(id)).status, 200);
}

TEST_F(ApiTest, RestartReapsDeadSandboxesAndJunkState) {
  startNode();
  SKIP_WITHOUT_BACKEND();
  std::string alive = createSandbox();
  std::string dead = createSandbox();
  ASSERT_FALSE(alive.empty() || dead.empty());
  node_->stop(false);
  node_.reset();
  std::string state_dir = root_->path() + "/state/sandboxes/";
  auto state = json::parse(*readFile(state_dir + dead + ".json"));
  ASSERT_TRUE(state["backend_state"].contains("init_pid")) << state.dump();
  pid_t init = state["backend_state"]["init_pid"].get<pid_t>();
  ASSERT_EQ(::kill(init, SIGKILL), 0);
  for (int i = 0; i < 100 && ::kill(init, 0) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_OK(writeFile(state_dir + "t0-garbage00000000.json", "{ not json"));
  ASSERT_OK(
      writeFile(state_dir + "t0-ffffffffffffffff.json",
                json{{"id", "t0-ffffffffffffffff"}, {"image", "busybox:1"}, {"backend_state", json::object()}}.dump()));

  startNode();
  EXPECT_EQ(client_->get(sandboxPath(alive)).status, 200);
  EXPECT_EQ(client_->get(sandboxPath(dead)).status, 404);
  EXPECT_NE(::access((state_dir + dead + ".json").c_str(), F_OK), 0) << "state of a dead sandbox kept";
  EXPECT_NE(::access((state_dir + "t0-garbage00000000.json").c_str(), F_OK), 0);
  EXPECT_NE(::access((state_dir + "t0-ffffffffffffffff.json").c_str(), F_OK), 0);
  EXPECT_EQ(::access((state_dir + alive + ".json").c_str(), F_OK), 0);
  EXPECT_EQ(client_->get("/v1/sandboxes").json()["sandboxes"].size(), 1u);
}

TEST_F(ApiTest, StopWithDestroyLeavesNothing) {
  startNode();
  SKIP_WITHOUT_BACKEND();
  std::string id = createSandbox();
  ASSERT_FALSE(id.empty());
  node_->stop(/*destroy_sandboxes=*/true);
  node_.reset();
  std::string state_dir = root_->path() + "/state/sandboxes/";
  EXPECT_NE(::access((state_dir + id + ".json").c_str(), F_OK), 0);
  startNode();
  EXPECT_EQ(client_->get("/v1/sandboxes").json()["sandboxes"].size(), 0u);
}

}  // namespace
}  // namespace dsec::testing
