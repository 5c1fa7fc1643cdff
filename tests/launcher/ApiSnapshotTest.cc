// Snapshots, forks and restores through the node API with real container sandboxes (docs/api.md, "Snapshots,
// restores and forks"): what each copy sees and what it does not, the errors, listing, deleting, retention.
#include <chrono>
#include <thread>

#include "ApiFixture.h"

namespace dsec::testing {
namespace {

using nlohmann::json;

class ApiSnapshotTest : public ApiTest {
 protected:
  std::string sh(const std::string& id, const std::string& cmd) {
    auto r = exec(id, {{"cmd", cmd}});
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? r.json().value("stdout", "") : "";
  }
  bool hasLayer(const std::string& name) {
    const json layers = client_->get("/v1/layers").json();
    for (const auto& l : layers["layers"]) {
      if (l.value("name", "") == name) return true;
    }
    return false;
  }
};

TEST_F(ApiSnapshotTest, SnapshotForkRestoreListDelete) {
  startNode();
  SKIP_WITHOUT_BACKEND();
  std::string src = createSandbox({{"labels", {{"run", "9"}}}, {"timeout", 600}, {"idle_timeout", 300}});
  ASSERT_FALSE(src.empty());
  ASSERT_EQ(sh(src, "mkdir -p /data && echo base > /data/base.txt && rm /bin/sleep && echo ok"), "ok\n");

  auto r = client_->postJson(sandboxPath(src, "/snapshot"), {{"name", "base-1"}});
  ASSERT_EQ(r.status, 201) << r.body;
  json snap = r.json();
  EXPECT_EQ(snap["name"], "base-1");
  EXPECT_EQ(snap["kind"], "filesystem");
  EXPECT_EQ(snap["backend"], "container");
  EXPECT_EQ(snap["image"], "busybox:1");
  EXPECT_EQ(snap["source"], src);
  EXPECT_EQ(snap["node"], "t0");
  EXPECT_GT(snap["bytes"].get<int64_t>(), 0);
  EXPECT_FALSE(snap["created"].get<std::string>().empty());
  EXPECT_EQ(client_->postJson(sandboxPath(src, "/snapshot"), {{"name", "base-1"}}).status, 409);
  ASSERT_EQ(sh(src, "echo after > /data/after.txt && echo ok"), "ok\n");

  // Fork: one snapshot of the source as it is now, three sandboxes from it, each with the source's parameters.
  r = client_->postJson(sandboxPath(src, "/fork"), {{"count", 3}});
  ASSERT_EQ(r.status, 201) << r.body;
  json fork = r.json();
  std::string fork_snap = fork["snapshot"]["name"];
  ASSERT_EQ(fork["sandboxes"].size(), 3u);
  std::vector<std::string> copies;
  for (const auto& info : fork["sandboxes"]) {
    copies.push_back(info["id"]);
    EXPECT_EQ(info["labels"]["run"], "9");
    EXPECT_EQ(info["timeout"], 600);
    EXPECT_EQ(info["idle_timeout"], 300);
    EXPECT_EQ(info["memory"], 64 << 20);
    EXPECT_EQ(info["snapshot"], fork_snap);
    EXPECT_EQ(info["image"], "busybox:1+" + std::string("snap-") + fork_snap + ":1");
  }
  for (size_t i = 0; i < copies.size(); ++i) {
    ASSERT_EQ(sh(copies[i], "echo " + std::to_string(i) + " > /data/mine-" + std::to_string(i) + " && echo ok"),
              "ok\n");
  }
  for (size_t i = 0; i < copies.size(); ++i) {
    EXPECT_EQ(sh(copies[i], "cat /data/base.txt /data/after.txt"), "base\nafter\n");
    EXPECT_EQ(sh(copies[i], "ls /data | grep mine"), "mine-" + std::to_string(i) + "\n")
        << "a fork sees another's file";
    EXPECT_EQ(sh(copies[i], "test -e /bin/sleep || echo deleted"), "deleted\n");
  }
  EXPECT_EQ(sh(src, "ls /data | grep -c mine"), "0\n") << "the source sees a fork's file";

  // Restore by create: the image, backend and limits are the snapshot's; labels and timeouts the request's.
  r = client_->postJson("/v1/sandboxes", {{"snapshot", "base-1"}, {"labels", {{"x", "y"}}}, {"timeout", 120}});
  ASSERT_EQ(r.status, 201) << r.body;
  json restored = r.json();
  std::string rid = restored["id"];
  EXPECT_EQ(restored["snapshot"], "base-1");
  EXPECT_EQ(restored["image"], "busybox:1+snap-base-1:1");
  EXPECT_EQ(restored["memory"], 64 << 20);
  EXPECT_EQ(restored["labels"], json({{"x", "y"}}));
  EXPECT_EQ(restored["timeout"], 120);
  EXPECT_EQ(client_->get(sandboxPath(rid)).json()["snapshot"], "base-1");
  EXPECT_EQ(sh(rid, "cat /data/base.txt; test -e /data/after.txt || echo no-after"), "base\nno-after\n");
  EXPECT_EQ(sh(src, "cat /data/after.txt"), "after\n");

  // Listing and getting.
  auto list = client_->get("/v1/snapshots");
  ASSERT_EQ(list.status, 200);
  std::set<std::string> names;
  const json listed = list.json();
  for (const auto& s : listed["snapshots"]) names.insert(s["name"]);
  EXPECT_EQ(names, (std::set<std::string>{"base-1", fork_snap}));
  EXPECT_EQ(client_->get("/v1/snapshots/base-1").json()["source"], src);
  EXPECT_EQ(client_->get("/v1/snapshots/no-such").status, 404);

  // Deleting: a snapshot in use by a sandbox goes; its layer stays until the sandbox does.
  EXPECT_EQ(client_->del("/v1/snapshots/base-1").status, 200);
  EXPECT_EQ(client_->get("/v1/snapshots/base-1").status, 404);
  EXPECT_EQ(client_->del("/v1/snapshots/base-1").status, 404);
  EXPECT_EQ(sh(rid, "cat /data/base.txt"), "base\n");
  EXPECT_TRUE(hasLayer("snap-base-1"));
  for (const auto& id : copies) EXPECT_EQ(client_->del(sandboxPath(id)).status, 200);
  EXPECT_TRUE(hasLayer("snap-" + fork_snap));
  EXPECT_EQ(client_->del("/v1/snapshots/" + fork_snap).status, 200);
  EXPECT_FALSE(hasLayer("snap-" + fork_snap)) << "the layer of a deleted snapshot nobody uses stayed";
  EXPECT_EQ(client_->postJson("/v1/sandboxes", {{"snapshot", fork_snap}}).status, 404);
}

TEST_F(ApiSnapshotTest, ErrorsSayWhatIsWrong) {
  startNode();
  SKIP_WITHOUT_BACKEND();
  std::string src = createSandbox();
  ASSERT_FALSE(src.empty());
  auto r = client_->postJson(sandboxPath(src, "/snapshot"), {{"processes", true}});
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("files only, not processes or memory"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("microvm"), std::string::npos) << r.body;
  EXPECT_EQ(client_->postJson(sandboxPath(src, "/fork"), {{"count", 2}, {"processes", true}}).status, 400);
  EXPECT_EQ(client_->postJson(sandboxPath(src, "/snapshot"), {{"name", "Bad/Name"}}).status, 400);
  EXPECT_EQ(client_->postJson(sandboxPath(src, "/snapshot"), {{"nmae", "x"}}).status, 400);
  EXPECT_EQ(client_->postJson(sandboxPath(src, "/fork"), {{"count", 0}}).status, 400);
  EXPECT_EQ(client_->postJson(sandboxPath(src, "/fork"), {{"count", 257}}).status, 400);
  EXPECT_EQ(client_->postJson(sandboxPath(src, "/fork"), json::object()).status, 400);
  EXPECT_EQ(client_->postJson(sandboxPath("t0-0000000000000000", "/snapshot"), json::object()).status, 404);
  EXPECT_EQ(client_->postJson(sandboxPath("t0-0000000000000000", "/fork"), {{"count", 1}}).status, 404);
  // An empty body is allowed: the name is generated.
  r = client_->postJson(sandboxPath(src, "/snapshot"), json::object());
  ASSERT_EQ(r.status, 201) << r.body;
  std::string name = r.json()["name"];
  EXPECT_EQ(name.rfind("snap-", 0), 0u);
  r = client_->postJson("/v1/sandboxes", {{"snapshot", name}, {"memory", "1G"}, {"image", "busybox:1"}});
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("'image', 'memory'"), std::string::npos) << r.body;
  EXPECT_EQ(client_->postJson("/v1/sandboxes", {{"snapshot", "no-such"}}).status, 404);
  EXPECT_EQ(client_->postJson("/v1/sandboxes", {{"snapshot", 5}}).status, 400);
  EXPECT_EQ(client_->get("/v1/snapshots/Bad").status, 400);
}

TEST_F(ApiSnapshotTest, RetentionRemovesOldSnapshotsAndTheirUnusedLayers) {
  launcher::ServeOptions o = options();
  o.node.snapshot_retention_seconds = 2;
  o.node.reaper_interval_seconds = 0.2;
  ASSERT_TRUE(startNode(o));
  SKIP_WITHOUT_BACKEND();
  std::string src = createSandbox();
  ASSERT_FALSE(src.empty());
  ASSERT_EQ(client_->postJson(sandboxPath(src, "/snapshot"), {{"name", "short"}}).status, 201);
  auto r = client_->postJson("/v1/sandboxes", {{"snapshot", "short"}});
  ASSERT_EQ(r.status, 201) << r.body;
  ASSERT_EQ(client_->del(sandboxPath(r.json()["id"])).status, 200);
  EXPECT_TRUE(hasLayer("snap-short"));
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    gone = client_->get("/v1/snapshots/short").status == 404 && !hasLayer("snap-short");
  }
  EXPECT_TRUE(gone) << "snapshot or layer still there 10 s after a 2 s retention";
}

}  // namespace
}  // namespace dsec::testing
