// The density controller in a real node: real sandboxes fill memory in a memory-limited parent cgroup of a
// node given a small capacity, and the controller must reclaim, stop admitting and pause, in that order,
// visibly (sandbox info, /v1/node, /metrics), then reopen admission and resume when the memory goes.
// The level here is driven by the sandboxes' working set against the node's capacity: the host's PSI is
// shared with whatever else runs on this machine, so its thresholds are set out of reach (the PSI path is
// covered by the recorded traces in tests/placement). No timing assertions: bounded waits only.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <thread>

#include "ApiFixture.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/node/NodeAgent.h"

namespace dsec::testing {
namespace {

using nlohmann::json;

constexpr int64_t kMiB = 1 << 20;
constexpr int64_t kCapacity = 384 * kMiB;
constexpr int64_t kParentLimit = 768 * kMiB;

class DensityTest : public ApiTest {
 protected:
  void SetUp() override {
    ApiTest::SetUp();
    if (!missingRoot().empty()) return;
    // The node's parent cgroup gets a hard limit, so nothing here can eat the host's memory.
    parent_ = launcher::cgroupParentForRoot(root_->path());
    memory_dir_ = "/sys/fs/cgroup/memory/" + parent_;
    if (::access("/sys/fs/cgroup/memory/cgroup.procs", F_OK) == 0) {
      ::mkdir(memory_dir_.c_str(), 0755);
      limited_ = writeFile(memory_dir_ + "/memory.limit_in_bytes", std::to_string(kParentLimit)).ok();
    } else if (::access("/sys/fs/cgroup/cgroup.controllers", F_OK) == 0) {
      memory_dir_ = "/sys/fs/cgroup/" + parent_;
      (void)writeFile("/sys/fs/cgroup/cgroup.subtree_control", "+memory");
      ::mkdir(memory_dir_.c_str(), 0755);
      limited_ = writeFile(memory_dir_ + "/memory.max", std::to_string(kParentLimit)).ok();
    }
  }
  void TearDown() override {
    ApiTest::TearDown();
    if (!memory_dir_.empty()) ::rmdir(memory_dir_.c_str());  // the node removes it when empty; this is a backstop
  }

  launcher::ServeOptions densityOptions() {
    launcher::ServeOptions o = options();
    o.node.memory_capacity_bytes = kCapacity;
    o.node.cpu_qos = false;  // CPU QoS (cpusets, SCHED_IDLE) is not under test here
    placement::DensityConfig& c = o.node.density;
    for (int i = 0; i < 3; ++i) {
      c.psi_some_enter[i] = c.psi_some_leave[i] = c.psi_full_enter[i] = c.psi_full_leave[i] = 101;
    }
    // Working set / capacity: reclaim from 30%, stop admitting from 55%, pause from 75%.
    c.use_enter[0] = 0.30, c.use_enter[1] = 0.55, c.use_enter[2] = 0.75;
    c.use_leave[0] = 0.20, c.use_leave[1] = 0.45, c.use_leave[2] = 0.65;
    c.reclaim_min_idle_seconds = 1;
    c.pause_min_idle_seconds = 2;
    c.max_pauses_per_tick = 1;
    c.release_hold_seconds = 1;
    return o;
  }

  // Polls until pred holds or ~60 s passed (a loaded 2-core machine can be slow; the loop ticks every 1 s).
  bool waitFor(const std::function<bool()>& pred) {
    for (int i = 0; i < 240; ++i) {
      if (pred()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    return pred();
  }
  json density() { return client_->get("/v1/node").json().value("density", json::object()); }
  json info(const std::string& id) { return client_->get(sandboxPath(id)).json(); }
  void fill(const std::string& hog, const std::string& file, int mib) {
    auto r = exec(
        hog, {{"cmd", "dd if=/dev/zero of=/tmp/" + file + " bs=1M count=" + std::to_string(mib) + " 2>/dev/null; sync"},
              {"timeout", 120}});
    ASSERT_EQ(r.status, 200) << r.body;
    ASSERT_EQ(r.json().value("exit_code", -1), 0) << r.body;
  }
  int64_t firstSeq(const json& d, const std::string& action) {
    for (const auto& a : d["last_actions"]) {
      if (a["action"] == action) return a["seq"].get<int64_t>();
    }
    return -1;
  }

  std::string parent_, memory_dir_;
  bool limited_ = false;
};

TEST_F(DensityTest, ReclaimsThenStopsAdmittingThenPausesAndReleases) {
  DSEC_SKIP_UNLESS_ROOT();
  ASSERT_TRUE(startNode(densityOptions()));
  SKIP_WITHOUT_BACKEND();
  ASSERT_TRUE(limited_) << "could not limit the node's parent cgroup " << memory_dir_;

  json d = density();
  EXPECT_EQ(d["mode"], "overcommit");
  EXPECT_EQ(d["memory_capacity_bytes"], kCapacity);
  EXPECT_TRUE(d["admitting"].get<bool>());
  EXPECT_EQ(d["level"], "calm");

  std::string old_idle = createSandbox();
  ASSERT_FALSE(old_idle.empty());
  std::string young_idle = createSandbox();
  ASSERT_FALSE(young_idle.empty());
  std::string hog = createSandbox({{"memory", "380M"}, {"disk", "380M"}});
  ASSERT_FALSE(hog.empty());
  // old_idle has been idle longest: it is paused first.
  ASSERT_EQ(exec(young_idle, {{"cmd", "true"}}).status, 200);

  // 1. ~40% of the capacity: reclaim the idle sandboxes, still admitting.
  fill(hog, "f1", 150);
  ASSERT_TRUE(waitFor([&] { return !info(old_idle)["density"]["reclaimed_unix"].is_null(); })) << density().dump(2);
  d = density();
  EXPECT_TRUE(d["admitting"].get<bool>()) << d.dump(2);
  EXPECT_GE(d["actions_total"]["reclaim"].get<int>(), 1);
  EXPECT_EQ(d["actions_total"]["pause"], 0);

  // 2. ~66%: admission closes, a create gets 429 naming why.
  fill(hog, "f2", 100);
  ASSERT_TRUE(waitFor([&] { return !density()["admitting"].get<bool>(); })) << density().dump(2);
  auto refused = client_->postJson("/v1/sandboxes", {{"image", "busybox:1"}, {"memory", "64M"}});
  EXPECT_EQ(refused.status, 429) << refused.body;
  EXPECT_NE(refused.body.find("memory"), std::string::npos) << refused.body;
  EXPECT_NE(refused.body.find("admission is closed"), std::string::npos) << refused.body;
  EXPECT_NE(refused.body.find("retry_after"), std::string::npos) << refused.body;
  EXPECT_NE(client_->get("/metrics").body.find("dsec_density_admitting 0"), std::string::npos);

  // 3. ~82%: the idle sandboxes are paused, longest idle first, paused_by "density".
  fill(hog, "f3", 70);
  ASSERT_TRUE(waitFor([&] { return info(old_idle)["paused_by"] == "density"; })) << density().dump(2);
  json i = info(old_idle);
  EXPECT_EQ(i["state"], "paused");
  EXPECT_GE(i["density"]["pauses"].get<int>(), 1);
  bool event = false;
  for (const auto& e : i["events"]) event = event || e["type"] == "density_pause";
  EXPECT_TRUE(event) << i.dump(2);

  d = density();
  int64_t reclaim = firstSeq(d, "reclaim"), stop = firstSeq(d, "stop_admitting"), pause = firstSeq(d, "pause");
  ASSERT_GT(reclaim, 0) << d.dump(2);
  EXPECT_LT(reclaim, stop);
  EXPECT_LT(stop, pause);
  std::string metrics = client_->get("/metrics").body;
  EXPECT_NE(metrics.find("dsec_density_actions_total{action=\"pause\"}"), std::string::npos);
  EXPECT_EQ(metrics.find("dsec_density_actions_total{action=\"pause\"} 0"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("dsec_density_memory_ratio"), std::string::npos);
  EXPECT_NE(metrics.find("dsec_density_psi{resource=\"memory\",kind=\"some\"}"), std::string::npos);

  // 4. The memory goes (the exec resumes the hog if it was paused too): admission reopens and the
  // controller resumes what it paused.
  auto rm = exec(hog, {{"cmd", "rm -f /tmp/f1 /tmp/f2 /tmp/f3"}});
  ASSERT_EQ(rm.status, 200) << rm.body;
  ASSERT_TRUE(waitFor([&] { return density()["admitting"].get<bool>(); })) << density().dump(2);
  ASSERT_TRUE(waitFor([&] { return info(old_idle)["state"] == "running"; })) << info(old_idle).dump(2);
  EXPECT_TRUE(info(old_idle)["paused_by"].is_null());
  d = density();
  EXPECT_GT(firstSeq(d, "reopen_admission"), pause) << d.dump(2);
  // The ratio fell to 1 under pressure (508 MiB are committed on 384): it climbs back while calm.
  ASSERT_TRUE(waitFor([&] {
    json now = density();
    return now["memory_admissible_bytes"].get<int64_t>() >= now["memory_committed_bytes"].get<int64_t>() + 64 * kMiB;
  })) << density().dump(2);
  std::string again = createSandbox();
  EXPECT_FALSE(again.empty());
  auto r = exec(young_idle, {{"cmd", "echo alive"}});
  EXPECT_EQ(r.json().value("stdout", ""), "alive\n") << r.body;
  EXPECT_EQ(info(young_idle)["state"], "running");
}

TEST_F(DensityTest, OomInsideASandboxIsReportedToItsOwner) {
  DSEC_SKIP_UNLESS_ROOT();
  ASSERT_TRUE(startNode(densityOptions()));
  SKIP_WITHOUT_BACKEND();
  std::string id = createSandbox({{"memory", "32M"}});
  ASSERT_FALSE(id.empty());
  auto r = exec(id, {{"cmd", "dd if=/dev/zero of=/dev/null bs=128M count=1"}, {"timeout", 60}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(r.json().value("oom_killed", false)) << r.body;
  json i = info(id);
  EXPECT_GE(i["usage"]["oom_kills"].get<int>(), 1) << i.dump(2);
  ASSERT_TRUE(waitFor([&] {
    json now = info(id);
    for (const auto& e : now["events"]) {
      if (e["type"] == "oom_kill") return true;
    }
    return false;
  })) << info(id).dump(2);
  json after = info(id);
  for (const auto& e : after["events"]) {
    if (e["type"] == "oom_kill") {
      EXPECT_NE(e["message"].get<std::string>().find("memory limit"), std::string::npos);
    }
  }
  // A sandbox's own OOM is its business: the node keeps admitting.
  EXPECT_TRUE(density()["admitting"].get<bool>());
  EXPECT_NE(client_->get("/metrics").body.find("dsec_sandbox_oom_events_total 1"), std::string::npos);
}

TEST_F(DensityTest, StaticModeAdmitsByCommittedLimitsOnly) {
  DSEC_SKIP_UNLESS_ROOT();
  launcher::ServeOptions o = options();
  o.node.density.overcommit = false;
  o.node.memory_capacity_bytes = 160 * kMiB;
  o.node.cpu_qos = false;
  ASSERT_TRUE(startNode(o));
  SKIP_WITHOUT_BACKEND();
  EXPECT_EQ(density()["mode"], "static");
  EXPECT_EQ(density()["memory_ratio"], 1.0);
  ASSERT_FALSE(createSandbox({{"memory", "64M"}, {"cpus", 0}}).empty());
  ASSERT_FALSE(createSandbox({{"memory", "64M"}, {"cpus", 0}}).empty());
  auto refused = client_->postJson("/v1/sandboxes", {{"image", "busybox:1"}, {"memory", "64M"}, {"cpus", 0}});
  EXPECT_EQ(refused.status, 429) << refused.body;
  EXPECT_NE(refused.body.find("128 MiB committed + 64 MiB asked > 1.00 x 160 MiB"), std::string::npos) << refused.body;
}

}  // namespace
}  // namespace dsec::testing
