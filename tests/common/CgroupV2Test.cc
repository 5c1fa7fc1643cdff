// The cgroup v2 driver against an in-memory unified tree (real clusters run pure v2; this machine is hybrid).
#include <gtest/gtest.h>
#include <signal.h>

#include <memory>

#include "FakeCgroupFs.h"
#include "dsec/common/Cgroup.h"
#include "dsec/testing/TestSupport.h"

namespace dsec {
namespace {

using testing::FakeCgroupFs;

const std::string kRoot = "/cg2";

class CgroupV2Test : public ::testing::Test {
 protected:
  void SetUp() override { reset(true); }
  void reset(bool with_kill) {
    state_ = std::make_shared<FakeCgroupFs::State>();
    testing::setUpFakeV2Tree(*state_, kRoot, with_kill);
  }
  std::unique_ptr<CgroupDriver> driver(const std::string& parent = "dsec") {
    return makeCgroupV2Driver(std::make_unique<FakeCgroupFs>(state_), kRoot, parent);
  }
  std::string dir(const std::string& name) { return kRoot + "/dsec/" + name; }
  std::string file(const std::string& name, const std::string& leaf) { return dir(name) + "/" + leaf; }

  std::shared_ptr<FakeCgroupFs::State> state_;
};

TEST_F(CgroupV2Test, DescribeNamesControllers) {
  auto d = driver();
  EXPECT_EQ(d->version(), 2);
  EXPECT_EQ(d->describe(), "v2 (memory, cpu, pids at /cg2)");
}

TEST_F(CgroupV2Test, CreateEnablesControllersAndWritesLimits) {
  auto d = driver();
  auto cg = d->create("sb1", {.memory_bytes = 512 << 20, .cpus = 0.5, .pids = 1024, .cpu_weight = 300});
  ASSERT_OK(cg);
  // Controllers are switched on from the root down to the parent, so the sandbox cgroup has their files.
  // cpuset too, where offered (CPU QoS), so that a latency sandbox can be pinned.
  EXPECT_EQ(state_->file(kRoot + "/cgroup.subtree_control"), "memory cpu pids cpuset");
  EXPECT_EQ(state_->file(kRoot + "/dsec/cgroup.subtree_control"), "memory cpu pids cpuset");
  EXPECT_TRUE(state_->hasDir(dir("sb1")));
  EXPECT_EQ(state_->file(file("sb1", "memory.max")), "536870912");
  EXPECT_EQ(state_->file(file("sb1", "cpu.max")), "50000 100000");
  EXPECT_EQ(state_->file(file("sb1", "cpu.weight")), "300");
  EXPECT_EQ(state_->file(file("sb1", "pids.max")), "1024");
  // Swap is left at its default; memory.oom.group is not set (an OOM kills one process and is counted).
  EXPECT_TRUE(state_->writesTo(file("sb1", "memory.swap.max")).empty());
  EXPECT_EQ((*cg)->cloneIntoPath(), dir("sb1"));
  EXPECT_EQ((*cg)->procsFiles(), std::vector<std::string>{file("sb1", "cgroup.procs")});
}

TEST_F(CgroupV2Test, ParentIsPreparedOnceAndOnlyMissingControllersAreRequested) {
  state_->setFile(kRoot + "/cgroup.subtree_control", "cpu");
  auto d = driver();
  ASSERT_OK(d->create("a", {}));
  ASSERT_OK(d->create("b", {}));
  EXPECT_EQ(state_->writesTo(kRoot + "/cgroup.subtree_control"),
            (std::vector<std::string>{"+memory +pids", "+cpuset"}));
  EXPECT_EQ(state_->writesTo(kRoot + "/dsec/cgroup.subtree_control"),
            (std::vector<std::string>{"+memory +cpu +pids", "+cpuset"}));
}

TEST_F(CgroupV2Test, NestedParent) {
  auto d = driver("dsec/node1");
  ASSERT_OK(d->create("sb", {.pids = 5}));
  EXPECT_EQ(state_->file(kRoot + "/dsec/cgroup.subtree_control"), "memory cpu pids cpuset");
  EXPECT_EQ(state_->file(kRoot + "/dsec/node1/cgroup.subtree_control"), "memory cpu pids cpuset");
  EXPECT_EQ(state_->file(kRoot + "/dsec/node1/sb/pids.max"), "5");
}

TEST_F(CgroupV2Test, FailedLimitWriteAtEachStepLeavesNothing) {
  for (const char* leaf : {"memory.max", "cpu.max", "cpu.weight", "pids.max"}) {
    SCOPED_TRACE(leaf);
    SetUp();
    state_->fail_write[file("sb", leaf)] = EINVAL;
    auto cg = driver()->create("sb", {.memory_bytes = 1 << 20, .cpus = 1, .pids = 10, .cpu_weight = 10});
    ASSERT_FALSE(cg.ok());
    EXPECT_EQ(cg.error().sysErrno(), EINVAL);
    EXPECT_NE(cg.error().message().find(leaf), std::string::npos) << cg.error().message();
    EXPECT_FALSE(state_->hasDir(dir("sb")));
    EXPECT_TRUE(state_->hasDir(kRoot + "/dsec"));  // the shared parent stays
  }
}

TEST_F(CgroupV2Test, FailedMkdirOrControllerEnableFails) {
  state_->fail_mkdir[dir("sb")] = ENOSPC;
  auto cg = driver()->create("sb", {});
  ASSERT_FALSE(cg.ok());
  EXPECT_EQ(cg.error().sysErrno(), ENOSPC);
  SetUp();
  state_->fail_write[kRoot + "/cgroup.subtree_control"] = EBUSY;
  cg = driver()->create("sb", {});
  ASSERT_FALSE(cg.ok());
  EXPECT_EQ(cg.error().sysErrno(), EBUSY);
  EXPECT_FALSE(state_->hasDir(dir("sb")));
}

TEST_F(CgroupV2Test, CreateExistingIsAlreadyExists) {
  auto d = driver();
  ASSERT_OK(d->create("sb", {}));
  ASSERT_ERROR(d->create("sb", {.pids = 3}), ErrorCode::kAlreadyExists);
  EXPECT_TRUE(state_->hasDir(dir("sb")));
  EXPECT_EQ(state_->file(file("sb", "pids.max")), "max");
}

TEST_F(CgroupV2Test, SetLimitsZeroMeansUnlimited) {
  auto cg = driver()->create("sb", {.memory_bytes = 1 << 30, .cpus = 2, .pids = 7, .cpu_weight = 50});
  ASSERT_OK(cg);
  ASSERT_OK((*cg)->setLimits({}));
  EXPECT_EQ(state_->file(file("sb", "memory.max")), "max");
  EXPECT_EQ(state_->file(file("sb", "cpu.max")), "max 100000");
  EXPECT_EQ(state_->file(file("sb", "cpu.weight")), "100");
  EXPECT_EQ(state_->file(file("sb", "pids.max")), "max");
  ASSERT_ERROR((*cg)->setLimits({.cpu_weight = 20000}), ErrorCode::kInvalidArgument);
}

TEST_F(CgroupV2Test, AttachFreezeThaw) {
  auto cg = driver()->create("sb", {});
  ASSERT_OK(cg);
  ASSERT_OK((*cg)->attach(321));
  EXPECT_EQ(state_->file(file("sb", "cgroup.procs")), "321\n");
  ASSERT_OK((*cg)->freeze());
  EXPECT_EQ(state_->file(file("sb", "cgroup.freeze")), "1");
  auto st = (*cg)->stats();
  ASSERT_OK(st);
  EXPECT_TRUE(st->frozen);
  ASSERT_OK((*cg)->thaw());
  EXPECT_EQ(state_->file(file("sb", "cgroup.freeze")), "0");
  EXPECT_FALSE((*cg)->stats()->frozen);
}

TEST_F(CgroupV2Test, FreezeTimeoutUnfreezes) {
  auto cg = driver()->create("sb", {});
  ASSERT_OK(cg);
  state_->never_freezes = true;
  ASSERT_ERROR((*cg)->freeze(), ErrorCode::kTimeout);
  EXPECT_EQ(state_->file(file("sb", "cgroup.freeze")), "0");
}

TEST_F(CgroupV2Test, KillAllUsesCgroupKill) {
  auto cg = driver()->create("sb", {});
  ASSERT_OK(cg);
  ASSERT_OK((*cg)->attach(11));
  ASSERT_OK((*cg)->attach(12));
  ASSERT_OK((*cg)->killAll());
  EXPECT_EQ(state_->writesTo(file("sb", "cgroup.kill")), std::vector<std::string>{"1"});
  EXPECT_TRUE(state_->signals.empty());
  EXPECT_TRUE((*cg)->pids()->empty());
  ASSERT_OK((*cg)->remove());
  EXPECT_FALSE(state_->hasDir(dir("sb")));
  ASSERT_OK((*cg)->remove());  // idempotent
}

TEST_F(CgroupV2Test, KillAllWithoutCgroupKillFreezesAndSignals) {
  reset(/*with_kill=*/false);
  auto cg = driver()->create("sb", {});
  ASSERT_OK(cg);
  ASSERT_OK((*cg)->attach(11));
  ASSERT_OK((*cg)->attach(12));
  ASSERT_OK((*cg)->killAll());
  std::vector<std::pair<pid_t, int>> expected = {{11, SIGKILL}, {12, SIGKILL}};
  EXPECT_EQ(state_->signals, expected);
  EXPECT_EQ(state_->writesTo(file("sb", "cgroup.freeze")), (std::vector<std::string>{"1", "0"}));
  EXPECT_TRUE((*cg)->pids()->empty());
}

TEST_F(CgroupV2Test, RemoveBusyIsReported) {
  auto cg = driver()->create("sb", {});
  ASSERT_OK(cg);
  ASSERT_OK((*cg)->attach(5));
  auto removed = (*cg)->remove();
  ASSERT_FALSE(removed.ok());
  EXPECT_EQ(removed.error().sysErrno(), EBUSY);
}

TEST_F(CgroupV2Test, Stats) {
  auto cg = driver()->create("sb", {});
  ASSERT_OK(cg);
  auto st = (*cg)->stats();
  ASSERT_OK(st);
  EXPECT_EQ(st->memory_current, 12345);
  EXPECT_EQ(st->memory_peak, 23456);
  EXPECT_EQ(st->oom_kills, 1);  // oom_kill, not oom_group_kill or oom
  EXPECT_EQ(st->pids_current, 2);
  EXPECT_EQ(st->cpu_usage_usec, 777u);
  EXPECT_FALSE(st->frozen);
}

TEST_F(CgroupV2Test, StatsWithoutMemoryPeak) {
  state_->templates[kRoot].erase("memory.peak");
  auto cg = driver()->create("sb", {});
  ASSERT_OK(cg);
  auto st = (*cg)->stats();
  ASSERT_OK(st);
  EXPECT_EQ(st->memory_peak, 0);
  EXPECT_EQ(st->memory_current, 12345);
}

TEST_F(CgroupV2Test, ReclaimAsksForCurrentUsage) {
  auto cg = driver()->create("sb", {});
  ASSERT_OK(cg);
  ASSERT_OK((*cg)->reclaim());
  EXPECT_EQ(state_->writesTo(file("sb", "memory.reclaim")), std::vector<std::string>{"12345"});
  state_->fail_write[file("sb", "memory.reclaim")] = EAGAIN;  // reclaimed less than asked: fine
  ASSERT_OK((*cg)->reclaim());
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->files.erase(file("sb", "memory.reclaim"));
  }
  ASSERT_ERROR((*cg)->reclaim(), ErrorCode::kUnsupported);
}

TEST_F(CgroupV2Test, OpenAndList) {
  auto d = driver();
  auto listed = d->list();
  ASSERT_OK(listed);
  EXPECT_TRUE(listed->empty());
  ASSERT_OK(d->create("y", {}));
  ASSERT_OK(d->create("x", {}));
  listed = d->list();
  ASSERT_OK(listed);
  EXPECT_EQ(*listed, (std::vector<std::string>{"x", "y"}));
  ASSERT_OK(d->open("x"));
  ASSERT_ERROR(d->open("nope"), ErrorCode::kNotFound);
  ASSERT_ERROR(d->create("a/b", {}), ErrorCode::kInvalidArgument);
}

TEST_F(CgroupV2Test, CpusetAndIdleAreWrittenWhenAsked) {
  auto d = driver();
  auto cg = d->create("lat", {.cpus = 2, .cpuset_cpus = "2-3", .cpuset_mems = "0"});
  ASSERT_OK(cg);
  EXPECT_EQ(state_->file(file("lat", "cpuset.cpus")), "2-3");
  EXPECT_EQ(state_->file(file("lat", "cpuset.mems")), "0");
  EXPECT_TRUE(state_->writesTo(file("lat", "cpu.idle")).empty());
  // A batch cgroup inherits the pool (empty cpuset.cpus) and is idle as a whole.
  ASSERT_OK(d->create("batch", {.cpu_weight = 10, .cpu_idle = true}));
  EXPECT_TRUE(state_->writesTo(file("batch", "cpuset.cpus")).empty());
  EXPECT_EQ(state_->file(file("batch", "cpu.weight")), "10");
  EXPECT_EQ(state_->file(file("batch", "cpu.idle")), "1");
  // Moving it: only what is given is written.
  ASSERT_OK((*cg)->setCpuset("1", ""));
  EXPECT_EQ(state_->file(file("lat", "cpuset.cpus")), "1");
  EXPECT_EQ(state_->writesTo(file("lat", "cpuset.mems")), std::vector<std::string>{"0"});
}

TEST_F(CgroupV2Test, WeightIsWrittenWhileNotIdle) {
  auto d = driver();
  auto cg = d->create("sb", {.cpu_weight = 10, .cpu_idle = true});
  ASSERT_OK(cg);
  size_t before = state_->writes.size();
  // The kernel refuses cpu.weight on an idle group: idle goes off first and back on after.
  ASSERT_OK((*cg)->setLimits({.cpu_weight = 20, .cpu_idle = true}));
  int off = state_->writeIndex(file("sb", "cpu.idle"), "0", before);
  int weight = state_->writeIndex(file("sb", "cpu.weight"), "20", before);
  int on = state_->writeIndex(file("sb", "cpu.idle"), "1", before);
  ASSERT_GE(off, 0);
  EXPECT_LT(off, weight);
  EXPECT_LT(weight, on);
  // Limits without cpuset reset it to the parent's (empty).
  EXPECT_EQ(state_->file(file("sb", "cpuset.cpus")), "");
}

TEST_F(CgroupV2Test, CpusetWithoutControllerIsUnsupportedAndLeavesNothing) {
  state_ = std::make_shared<FakeCgroupFs::State>();
  testing::setUpFakeV2Tree(*state_, kRoot, true, /*cpuset=*/false);
  auto d = driver();
  auto cg = d->create("lat", {.cpuset_cpus = "1", .cpuset_mems = "0"});
  ASSERT_ERROR(cg, ErrorCode::kUnsupported);
  EXPECT_NE(cg.error().message().find("cpuset controller is not enabled"), std::string::npos) << cg.error().message();
  EXPECT_FALSE(state_->hasDir(dir("lat")));
  // Without a cpuset asked for, creates work as before.
  ASSERT_OK(d->create("plain", {.cpu_idle = true}));
}

TEST_F(CgroupV2Test, BadCpusetListIsRejected) {
  auto d = driver();
  for (const char* bad : {"1;2", "3-1", "a", "1,", "-1", "0-99999999"}) {
    SCOPED_TRACE(bad);
    ASSERT_ERROR(d->create("sb", {.cpuset_cpus = bad}), ErrorCode::kInvalidArgument);
  }
  ASSERT_ERROR(d->create("sb", {.cpuset_mems = "x"}), ErrorCode::kInvalidArgument);
  EXPECT_FALSE(state_->hasDir(dir("sb")));
  ASSERT_OK(validateCpusetList("0-3,8,10-11", "cpus"));
  ASSERT_OK(validateCpusetList("", "cpus"));
}

TEST_F(CgroupV2Test, RootWithoutWantedControllersSkipsEnabling) {
  state_->setFile(kRoot + "/cgroup.controllers", "hugetlb");  // like the unified mount of a hybrid host
  auto d = driver();
  EXPECT_EQ(d->describe(), "v2 (no controllers at /cg2)");
  ASSERT_OK(d->create("sb", {}));
  EXPECT_TRUE(state_->writesTo(kRoot + "/cgroup.subtree_control").empty());
}

}  // namespace
}  // namespace dsec
