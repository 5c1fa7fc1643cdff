// The cgroup v1 driver against an in-memory tree: which files it writes with which values, and that a failure at
// any step leaves nothing behind.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "FakeCgroupFs.h"
#include "dsec/common/Cgroup.h"
#include "dsec/testing/TestSupport.h"

namespace dsec {
namespace {

using testing::FakeCgroupFs;

const std::string kRoot = "/cg";
const std::vector<std::string> kHierarchies = {"memory", "cpu", "cpuacct", "pids", "freezer"};

class CgroupV1Test : public ::testing::Test {
 protected:
  void SetUp() override {
    state_ = std::make_shared<FakeCgroupFs::State>();
    testing::setUpFakeV1Tree(*state_, kRoot);
  }
  std::unique_ptr<CgroupDriver> driver(const std::string& parent = "dsec") {
    return makeCgroupV1Driver(std::make_unique<FakeCgroupFs>(state_), kRoot, parent);
  }
  std::string dir(const std::string& h, const std::string& name) { return kRoot + "/" + h + "/dsec/" + name; }
  std::string file(const std::string& h, const std::string& name, const std::string& leaf) {
    return dir(h, name) + "/" + leaf;
  }
  // No sandbox cgroup left in any hierarchy.
  void expectNoCgroups() {
    for (const auto& h : kHierarchies) EXPECT_TRUE(state_->dirsUnder(kRoot + "/" + h + "/dsec").empty()) << h;
  }

  std::shared_ptr<FakeCgroupFs::State> state_;
};

TEST_F(CgroupV1Test, DescribeNamesControllers) {
  auto d = driver();
  EXPECT_EQ(d->version(), 1);
  EXPECT_EQ(d->describe(), "v1 (memory, cpu, cpuacct, pids, freezer at /cg)");
}

TEST_F(CgroupV1Test, CreateMakesParentAndDirsAndWritesLimits) {
  auto d = driver();
  CgroupLimits limits{.memory_bytes = 64 << 20, .cpus = 0.5, .pids = 32, .cpu_weight = 200};
  auto cg = d->create("sb1", limits);
  ASSERT_OK(cg);
  EXPECT_EQ((*cg)->name(), "sb1");
  for (const auto& h : kHierarchies) {
    EXPECT_TRUE(state_->hasDir(kRoot + "/" + h + "/dsec")) << h;
    EXPECT_TRUE(state_->hasDir(dir(h, "sb1"))) << h;
  }
  EXPECT_EQ(state_->file(file("memory", "sb1", "memory.limit_in_bytes")), "67108864");
  EXPECT_EQ(state_->file(file("memory", "sb1", "memory.memsw.limit_in_bytes")), "67108864");
  // Socket buffers are bounded too: v1 charges them only under a TCP limit of the cgroup's own.
  EXPECT_EQ(state_->file(file("memory", "sb1", "memory.kmem.tcp.limit_in_bytes")), "67108864");
  EXPECT_EQ(state_->file(file("cpu", "sb1", "cpu.cfs_quota_us")), "50000");
  EXPECT_EQ(state_->file(file("cpu", "sb1", "cpu.shares")), "2048");
  EXPECT_EQ(state_->file(file("pids", "sb1", "pids.max")), "32");
  // The OOM killer stays on: an OOM must kill and be counted, not hang the sandbox.
  EXPECT_TRUE(state_->writesTo(file("memory", "sb1", "memory.oom_control")).empty());
}

TEST_F(CgroupV1Test, CreateWithoutLimitsWritesNoLimitFiles) {
  auto d = driver();
  ASSERT_OK(d->create("sb", {}));
  EXPECT_TRUE(state_->writes.empty());
  EXPECT_EQ(state_->file(file("cpu", "sb", "cpu.cfs_quota_us")), "-1");
}

TEST_F(CgroupV1Test, NestedParentIsCreated) {
  auto d = makeCgroupV1Driver(std::make_unique<FakeCgroupFs>(state_), kRoot, "dsec/node1");
  ASSERT_OK(d->create("sb", {}));
  for (const auto& h : kHierarchies) EXPECT_TRUE(state_->hasDir(kRoot + "/" + h + "/dsec/node1/sb")) << h;
}

TEST_F(CgroupV1Test, WithoutMemswOnlyMemoryLimitIsWritten) {
  state_ = std::make_shared<FakeCgroupFs::State>();
  testing::setUpFakeV1Tree(*state_, kRoot, /*memsw=*/false);
  auto d = driver();
  ASSERT_OK(d->create("sb", {.memory_bytes = 1 << 20}));
  EXPECT_EQ(state_->file(file("memory", "sb", "memory.limit_in_bytes")), "1048576");
  EXPECT_FALSE(state_->hasFile(file("memory", "sb", "memory.memsw.limit_in_bytes")));
}

TEST_F(CgroupV1Test, CreateExistingIsAlreadyExistsAndKeepsIt) {
  auto d = driver();
  ASSERT_OK(d->create("sb", {}));
  ASSERT_ERROR(d->create("sb", {.memory_bytes = 1 << 20}), ErrorCode::kAlreadyExists);
  for (const auto& h : kHierarchies) EXPECT_TRUE(state_->hasDir(dir(h, "sb"))) << h;
}

TEST_F(CgroupV1Test, FailedLimitWriteAtEachStepLeavesNothing) {
  const std::vector<std::pair<std::string, std::string>> steps = {{"memory", "memory.limit_in_bytes"},
                                                                  {"memory", "memory.memsw.limit_in_bytes"},
                                                                  {"cpu", "cpu.cfs_quota_us"},
                                                                  {"cpu", "cpu.shares"},
                                                                  {"pids", "pids.max"}};
  for (const auto& [h, leaf] : steps) {
    SCOPED_TRACE(leaf);
    SetUp();
    state_->fail_write[file(h, "sb", leaf)] = EACCES;
    auto d = driver();
    auto cg = d->create("sb", {.memory_bytes = 64 << 20, .cpus = 1, .pids = 10, .cpu_weight = 50});
    ASSERT_FALSE(cg.ok());
    EXPECT_EQ(cg.error().code(), ErrorCode::kSystem) << cg.error().toString();
    EXPECT_EQ(cg.error().sysErrno(), EACCES);
    EXPECT_NE(cg.error().message().find(leaf), std::string::npos) << cg.error().message();
    expectNoCgroups();
  }
}

TEST_F(CgroupV1Test, FailedMkdirInAnyHierarchyLeavesNothing) {
  for (const auto& h : kHierarchies) {
    SCOPED_TRACE(h);
    SetUp();
    state_->fail_mkdir[dir(h, "sb")] = ENOSPC;
    auto cg = driver()->create("sb", {.memory_bytes = 1 << 20});
    ASSERT_FALSE(cg.ok());
    EXPECT_EQ(cg.error().sysErrno(), ENOSPC);
    expectNoCgroups();
  }
}

TEST_F(CgroupV1Test, LeftoverInOneHierarchyIsAlreadyExistsAndOnlyOursIsUndone) {
  auto d = driver();
  ASSERT_OK(d->create("other", {}));  // makes the parents
  state_->addDir(dir("pids", "sb"));  // a stale directory from a crashed node
  ASSERT_ERROR(d->create("sb", {}), ErrorCode::kAlreadyExists);
  EXPECT_TRUE(state_->hasDir(dir("pids", "sb")));
  EXPECT_FALSE(state_->hasDir(dir("memory", "sb")));
  EXPECT_FALSE(state_->hasDir(dir("cpu", "sb")));
}

TEST_F(CgroupV1Test, RejectsBadNamesAndLimitsWithoutTouchingTheTree) {
  auto d = driver();
  for (const char* name : {"", ".", "..", "a/b", "../x"})
    ASSERT_ERROR(d->create(name, {}), ErrorCode::kInvalidArgument);
  ASSERT_ERROR(d->create("sb", {.memory_bytes = -1}), ErrorCode::kInvalidArgument);
  ASSERT_ERROR(d->create("sb", {.cpus = -0.5}), ErrorCode::kInvalidArgument);
  ASSERT_ERROR(d->create("sb", {.pids = -3}), ErrorCode::kInvalidArgument);
  ASSERT_ERROR(d->create("sb", {.cpu_weight = 10001}), ErrorCode::kInvalidArgument);
  ASSERT_ERROR(d->open("../etc"), ErrorCode::kInvalidArgument);
  expectNoCgroups();
  EXPECT_TRUE(state_->writes.empty());
}

TEST_F(CgroupV1Test, SetLimitsRaisesAndLowersRespectingMemsw) {
  auto d = driver();
  auto cg = d->create("sb", {.memory_bytes = 64 << 20, .cpus = 1, .pids = 10});
  ASSERT_OK(cg);
  // Up: memsw has to move first or the kernel refuses memory.limit_in_bytes > memsw.
  ASSERT_OK((*cg)->setLimits({.memory_bytes = 128 << 20, .cpus = 2, .pids = 20, .cpu_weight = 100}));
  EXPECT_EQ(state_->file(file("memory", "sb", "memory.limit_in_bytes")), "134217728");
  EXPECT_EQ(state_->file(file("memory", "sb", "memory.memsw.limit_in_bytes")), "134217728");
  EXPECT_EQ(state_->file(file("cpu", "sb", "cpu.cfs_quota_us")), "200000");
  EXPECT_EQ(state_->file(file("cpu", "sb", "cpu.cfs_period_us")), "100000");
  EXPECT_EQ(state_->file(file("cpu", "sb", "cpu.shares")), "1024");
  EXPECT_EQ(state_->file(file("pids", "sb", "pids.max")), "20");
  // Down: memory first.
  ASSERT_OK((*cg)->setLimits({.memory_bytes = 32 << 20}));
  EXPECT_EQ(state_->file(file("memory", "sb", "memory.limit_in_bytes")), "33554432");
  EXPECT_EQ(state_->file(file("memory", "sb", "memory.memsw.limit_in_bytes")), "33554432");
  // Zero means unlimited again, for every limit.
  EXPECT_EQ(state_->file(file("cpu", "sb", "cpu.cfs_quota_us")), "-1");
  EXPECT_EQ(state_->file(file("pids", "sb", "pids.max")), "max");
  EXPECT_EQ(state_->file(file("memory", "sb", "memory.kmem.tcp.limit_in_bytes")), "33554432");
  ASSERT_OK((*cg)->setLimits({}));
  EXPECT_EQ(state_->file(file("memory", "sb", "memory.limit_in_bytes")), "-1");
  EXPECT_EQ(state_->file(file("memory", "sb", "memory.memsw.limit_in_bytes")), "-1");
  EXPECT_EQ(state_->file(file("memory", "sb", "memory.kmem.tcp.limit_in_bytes")), "-1");
}

TEST_F(CgroupV1Test, AttachJoinsEveryHierarchy) {
  auto cg = driver()->create("sb", {});
  ASSERT_OK(cg);
  ASSERT_OK((*cg)->attach(4242));
  for (const auto& h : kHierarchies) EXPECT_EQ(state_->file(file(h, "sb", "cgroup.procs")), "4242\n") << h;
  auto pids = (*cg)->pids();
  ASSERT_OK(pids);
  EXPECT_EQ(*pids, std::vector<pid_t>{4242});
  std::vector<std::string> expected;
  for (const auto& h : kHierarchies) expected.push_back(file(h, "sb", "cgroup.procs"));
  EXPECT_EQ((*cg)->procsFiles(), expected);
  EXPECT_EQ((*cg)->cloneIntoPath(), "");
}

TEST_F(CgroupV1Test, FreezeWaitsForFrozenAndThawThaws) {
  auto cg = driver()->create("sb", {});
  ASSERT_OK(cg);
  state_->freeze_pending_reads = 3;  // the kernel reports FREEZING for a while
  ASSERT_OK((*cg)->freeze());
  EXPECT_EQ(state_->file(file("freezer", "sb", "freezer.state")), "FROZEN");
  EXPECT_EQ(state_->freeze_pending_reads, 0);
  auto st = (*cg)->stats();
  ASSERT_OK(st);
  EXPECT_TRUE(st->frozen);
  ASSERT_OK((*cg)->thaw());
  EXPECT_EQ(state_->file(file("freezer", "sb", "freezer.state")), "THAWED");
  EXPECT_FALSE((*cg)->stats()->frozen);
}

TEST_F(CgroupV1Test, FreezeThatNeverCompletesTimesOutAndThaws) {
  auto cg = driver()->create("sb", {});
  ASSERT_OK(cg);
  state_->never_freezes = true;
  ASSERT_ERROR((*cg)->freeze(), ErrorCode::kTimeout);
  EXPECT_EQ(state_->file(file("freezer", "sb", "freezer.state")), "THAWED");
}

TEST_F(CgroupV1Test, KillAllFreezesKillsEachThawsAndWaits) {
  auto cg = driver()->create("sb", {});
  ASSERT_OK(cg);
  for (pid_t pid : {101, 102, 103}) ASSERT_OK((*cg)->attach(pid));
  ASSERT_OK((*cg)->killAll());
  auto pids = (*cg)->pids();
  ASSERT_OK(pids);
  EXPECT_TRUE(pids->empty());
  std::vector<std::pair<pid_t, int>> expected = {{101, SIGKILL}, {102, SIGKILL}, {103, SIGKILL}};
  EXPECT_EQ(state_->signals, expected);
  std::string freezer = file("freezer", "sb", "freezer.state");
  int frozen_at = state_->writeIndex(freezer, "FROZEN");
  int thawed_at = state_->writeIndex(freezer, "THAWED");
  ASSERT_GE(frozen_at, 0);
  ASSERT_GT(thawed_at, frozen_at);
  EXPECT_EQ(state_->file(freezer), "THAWED");
  ASSERT_OK((*cg)->remove());
  expectNoCgroups();
}

TEST_F(CgroupV1Test, KillAllTimesOutIfProcessesSurvive) {
  auto cg = driver()->create("sb", {});
  ASSERT_OK(cg);
  ASSERT_OK((*cg)->attach(77));
  state_->signal_kills = false;
  ASSERT_ERROR((*cg)->killAll(), ErrorCode::kTimeout);
  EXPECT_GE(state_->signals.size(), 2u);  // it kept killing what was still listed
}

TEST_F(CgroupV1Test, RemoveIsIdempotentAndBusyIsReported) {
  auto d = driver();
  auto cg = d->create("sb", {});
  ASSERT_OK(cg);
  ASSERT_OK((*cg)->remove());
  expectNoCgroups();
  ASSERT_OK((*cg)->remove());  // already gone
  auto busy = d->create("busy", {});
  ASSERT_OK(busy);
  ASSERT_OK((*busy)->attach(55));
  auto removed = (*busy)->remove();
  ASSERT_FALSE(removed.ok());
  EXPECT_EQ(removed.error().sysErrno(), EBUSY) << removed.error().toString();
}

TEST_F(CgroupV1Test, StatsReadEveryController) {
  auto cg = driver()->create("sb", {});
  ASSERT_OK(cg);
  auto st = (*cg)->stats();
  ASSERT_OK(st);
  EXPECT_EQ(st->memory_current, 4096);
  EXPECT_EQ(st->memory_peak, 8192);
  EXPECT_EQ(st->oom_kills, 2);
  EXPECT_EQ(st->pids_current, 3);
  EXPECT_EQ(st->cpu_usage_usec, 5000u);
  EXPECT_FALSE(st->frozen);
}

TEST_F(CgroupV1Test, ComountedCpuAcctIsOneHierarchy) {
  state_ = std::make_shared<FakeCgroupFs::State>();
  testing::setUpFakeV1Tree(*state_, kRoot, true, /*comounted_cpuacct=*/true);
  auto d = driver();
  EXPECT_EQ(d->describe(), "v1 (memory, cpu,cpuacct, pids, freezer at /cg)");
  auto cg = d->create("sb", {.cpus = 1.5});
  ASSERT_OK(cg);
  EXPECT_EQ(state_->file(kRoot + "/cpu,cpuacct/dsec/sb/cpu.cfs_quota_us"), "150000");
  EXPECT_EQ((*cg)->procsFiles().size(), 4u);
  EXPECT_EQ((*cg)->stats()->cpu_usage_usec, 5000u);
}

TEST_F(CgroupV1Test, MissingControllerIsUnsupported) {
  state_ = std::make_shared<FakeCgroupFs::State>();
  testing::setUpFakeV1Tree(*state_, kRoot);
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->files.erase(kRoot + "/freezer/cgroup.procs");
  }
  auto d = driver();
  EXPECT_NE(d->describe().find("missing: freezer"), std::string::npos) << d->describe();
  auto cg = d->create("sb", {});
  ASSERT_ERROR(cg, ErrorCode::kUnsupported);
  EXPECT_NE(cg.error().message().find("freezer"), std::string::npos);
}

TEST_F(CgroupV1Test, OpenAndList) {
  auto d = driver();
  auto listed = d->list();
  ASSERT_OK(listed);
  EXPECT_TRUE(listed->empty());  // the parent does not exist yet
  ASSERT_OK(d->create("b", {}));
  ASSERT_OK(d->create("a", {}));
  listed = d->list();
  ASSERT_OK(listed);
  EXPECT_EQ(*listed, (std::vector<std::string>{"a", "b"}));
  auto opened = d->open("a");
  ASSERT_OK(opened);
  ASSERT_OK((*opened)->attach(9));
  EXPECT_EQ(state_->file(file("memory", "a", "cgroup.procs")), "9\n");
  ASSERT_ERROR(d->open("zzz"), ErrorCode::kNotFound);
}

TEST_F(CgroupV1Test, HalfMadeLeftoverIsListedOpenedKilledAndRemoved) {
  auto d = driver();
  ASSERT_OK(d->create("other", {}));
  // What a node crash between two mkdirs leaves: the cgroup in some hierarchies only, with a task in one.
  state_->addDir(dir("pids", "stale"));
  state_->setFile(file("pids", "stale", "cgroup.procs"), "31\n");
  state_->addDir(dir("cpu", "stale"));
  state_->setFile(file("cpu", "stale", "cgroup.procs"), "");
  auto listed = d->list();
  ASSERT_OK(listed);
  EXPECT_EQ(*listed, (std::vector<std::string>{"other", "stale"}));
  auto cg = d->open("stale");
  ASSERT_OK(cg);
  EXPECT_EQ(*(*cg)->pids(), std::vector<pid_t>{31});
  ASSERT_OK((*cg)->killAll());
  EXPECT_EQ(state_->signals, (std::vector<std::pair<pid_t, int>>{{31, SIGKILL}}));
  ASSERT_OK((*cg)->remove());
  EXPECT_FALSE(state_->hasDir(dir("pids", "stale")));
  EXPECT_FALSE(state_->hasDir(dir("cpu", "stale")));
  EXPECT_EQ(*d->list(), std::vector<std::string>{"other"});
}

TEST_F(CgroupV1Test, ReclaimUsesForceEmptyAndToleratesBusy) {
  auto cg = driver()->create("sb", {});
  ASSERT_OK(cg);
  ASSERT_OK((*cg)->reclaim());
  EXPECT_EQ(state_->writesTo(file("memory", "sb", "memory.force_empty")), std::vector<std::string>{"0"});
  state_->fail_write[file("memory", "sb", "memory.force_empty")] = EBUSY;
  ASSERT_OK((*cg)->reclaim());
  state_->fail_write[file("memory", "sb", "memory.force_empty")] = EACCES;
  ASSERT_ERROR((*cg)->reclaim(), ErrorCode::kSystem);
}

// With a cpuset hierarchy (this machine has one): the parent gets the root's cpus/mems and clone_children, every
// sandbox cgroup gets cpus and mems (given, else the parent's) so it can take tasks, and init joins it too.
class CgroupV1CpusetTest : public CgroupV1Test {
 protected:
  void SetUp() override {
    state_ = std::make_shared<FakeCgroupFs::State>();
    testing::setUpFakeV1Tree(*state_, kRoot, true, false, /*cpuset=*/true);
  }
};

TEST_F(CgroupV1CpusetTest, ParentAndSandboxesGetCpusAndMems) {
  auto d = driver();
  EXPECT_EQ(d->describe(), "v1 (memory, cpu, cpuacct, pids, freezer, cpuset at /cg)");
  auto batch = d->create("batch", {.cpu_weight = 10, .cpu_idle = true});
  ASSERT_OK(batch);
  EXPECT_EQ(state_->file(kRoot + "/cpuset/dsec/cpuset.cpus"), "0-3");
  EXPECT_EQ(state_->file(kRoot + "/cpuset/dsec/cpuset.mems"), "0");
  EXPECT_EQ(state_->file(kRoot + "/cpuset/dsec/cgroup.clone_children"), "1");
  EXPECT_EQ(state_->file(file("cpuset", "batch", "cpuset.cpus")), "0-3");
  EXPECT_EQ(state_->file(file("cpuset", "batch", "cpuset.mems")), "0");
  EXPECT_EQ(state_->file(file("cpu", "batch", "cpu.shares")), "102");
  EXPECT_EQ(state_->file(file("cpu", "batch", "cpu.idle")), "1");
  auto procs = (*batch)->procsFiles();
  EXPECT_NE(std::find(procs.begin(), procs.end(), file("cpuset", "batch", "cgroup.procs")), procs.end());

  auto lat = d->create("lat", {.cpus = 1, .cpuset_cpus = "3", .cpuset_mems = "0"});
  ASSERT_OK(lat);
  EXPECT_EQ(state_->file(file("cpuset", "lat", "cpuset.cpus")), "3");
  EXPECT_EQ(state_->file(file("cpu", "lat", "cpu.idle")), "0");
  EXPECT_TRUE(state_->writesTo(file("cpu", "lat", "cpu.idle")).empty());

  // The pool shrinks: the batch cgroup moves; mems untouched.
  ASSERT_OK((*batch)->setCpuset("0-2", ""));
  EXPECT_EQ(state_->file(file("cpuset", "batch", "cpuset.cpus")), "0-2");
  EXPECT_EQ(state_->writesTo(file("cpuset", "batch", "cpuset.mems")).size(), 1u);
  // setLimits without a cpuset resets to the parent's pool; idle goes off before the shares write.
  size_t before = state_->writes.size();
  ASSERT_OK((*batch)->setLimits({.cpu_weight = 20, .cpu_idle = true}));
  EXPECT_EQ(state_->file(file("cpuset", "batch", "cpuset.cpus")), "0-3");
  int off = state_->writeIndex(file("cpu", "batch", "cpu.idle"), "0", before);
  int shares = state_->writeIndex(file("cpu", "batch", "cpu.shares"), "204", before);
  int on = state_->writeIndex(file("cpu", "batch", "cpu.idle"), "1", before);
  ASSERT_GE(off, 0);
  EXPECT_LT(off, shares);
  EXPECT_LT(shares, on);

  ASSERT_OK((*lat)->remove());
  ASSERT_OK((*batch)->remove());
  EXPECT_TRUE(state_->dirsUnder(kRoot + "/cpuset/dsec").empty());
}

TEST_F(CgroupV1CpusetTest, FailedCpusetWriteLeavesNothing) {
  state_->fail_write[file("cpuset", "sb", "cpuset.cpus")] = EINVAL;
  auto d = driver();
  auto cg = d->create("sb", {.cpuset_cpus = "9"});
  ASSERT_ERROR(cg, ErrorCode::kSystem);
  EXPECT_NE(cg.error().message().find("cpuset.cpus"), std::string::npos) << cg.error().message();
  for (const auto& h : {"memory", "cpu", "cpuacct", "pids", "freezer", "cpuset"}) {
    EXPECT_TRUE(state_->dirsUnder(kRoot + "/" + h + "/dsec").empty()) << h;
  }
}

// Making a cpuset cgroup walks its siblings, so the parent holds at most `capacity` sandboxes there and the rest
// go to sub-parents of as many each, made on demand with the parent's cpus/mems and removed when empty. The other
// hierarchies keep every sandbox directly under the parent. Another driver (an agent restarted, the CPU QoS
// binder) finds them, lists them, and fills the sub-parents it finds before making new ones.
TEST_F(CgroupV1CpusetTest, SandboxesBeyondCapacityGoToSubParentsRemovedWhenEmpty) {
  auto d = makeCgroupV1Driver(std::make_unique<FakeCgroupFs>(state_), kRoot, "dsec", 2);
  std::map<std::string, std::unique_ptr<Cgroup>> made;
  for (const char* name : {"a", "b", "c", "d", "e"}) {
    auto cg = d->create(name, {});
    ASSERT_OK(cg);
    made[name] = std::move(*cg);
  }
  const std::string cpuset = kRoot + "/cpuset/dsec/";
  for (const char* name : {"a", "b"}) EXPECT_TRUE(state_->hasDir(cpuset + name)) << name;
  for (const char* name : {"c", "d"}) EXPECT_TRUE(state_->hasDir(cpuset + "shard@0001/" + name)) << name;
  EXPECT_TRUE(state_->hasDir(cpuset + "shard@0002/e"));
  EXPECT_EQ(state_->file(cpuset + "shard@0001/cpuset.cpus"), "0-3");
  EXPECT_EQ(state_->file(cpuset + "shard@0001/cpuset.mems"), "0");
  EXPECT_EQ(state_->file(cpuset + "shard@0001/c/cpuset.cpus"), "0-3");
  for (const auto& h : kHierarchies) EXPECT_TRUE(state_->hasDir(dir(h, "e"))) << h;
  auto procs = made["e"]->procsFiles();
  EXPECT_NE(std::find(procs.begin(), procs.end(), cpuset + "shard@0002/e/cgroup.procs"), procs.end());
  auto names = d->list();
  ASSERT_OK(names);
  EXPECT_EQ(*names, (std::vector<std::string>{"a", "b", "c", "d", "e"}));

  // A second driver over the same tree: opens one in a sub-parent, moves its cpuset, and fills shard@0002 next.
  auto other = makeCgroupV1Driver(std::make_unique<FakeCgroupFs>(state_), kRoot, "dsec", 2);
  auto d_again = other->open("d");
  ASSERT_OK(d_again);
  ASSERT_OK((*d_again)->setCpuset("2", ""));
  EXPECT_EQ(state_->file(cpuset + "shard@0001/d/cpuset.cpus"), "2");
  auto f = other->create("f", {});
  ASSERT_OK(f);
  EXPECT_TRUE(state_->hasDir(cpuset + "shard@0002/f"));
  ASSERT_ERROR(other->open("nope"), ErrorCode::kNotFound);

  ASSERT_OK(made["e"]->remove());
  EXPECT_TRUE(state_->hasDir(cpuset + "shard@0002"));
  ASSERT_OK((*f)->remove());
  EXPECT_FALSE(state_->hasDir(cpuset + "shard@0002"));
  ASSERT_OK(made["c"]->remove());
  EXPECT_TRUE(state_->hasDir(cpuset + "shard@0001"));
  ASSERT_OK((*d_again)->remove());
  EXPECT_FALSE(state_->hasDir(cpuset + "shard@0001"));
  EXPECT_TRUE(state_->hasDir(cpuset + "a"));

  // A sub-parent removed behind the driver's back is made again by the next create that goes there.
  auto g = d->create("g", {});
  ASSERT_OK(g);
  EXPECT_TRUE(state_->hasDir(cpuset + "shard@0001/g"));
  ASSERT_OK((*g)->remove());
  EXPECT_FALSE(state_->hasDir(cpuset + "shard@0001"));
  auto h = d->create("h", {});
  ASSERT_OK(h);
  EXPECT_TRUE(state_->hasDir(cpuset + "shard@0001/h"));
  for (const char* name : {"a", "b"}) ASSERT_OK(made[name]->remove());
  ASSERT_OK((*h)->remove());
  EXPECT_TRUE(state_->dirsUnder(kRoot + "/cpuset/dsec").empty());
  expectNoCgroups();
}

TEST_F(CgroupV1Test, CpusetWithoutHierarchyIsUnsupported) {
  auto d = driver();
  auto cg = d->create("sb", {.cpuset_cpus = "1", .cpuset_mems = "0"});
  ASSERT_ERROR(cg, ErrorCode::kUnsupported);
  EXPECT_NE(cg.error().message().find("no cpuset hierarchy"), std::string::npos) << cg.error().message();
  expectNoCgroups();
  auto plain = d->create("plain", {});
  ASSERT_OK(plain);
  ASSERT_ERROR((*plain)->setCpuset("1", ""), ErrorCode::kUnsupported);
}

TEST(CgroupLimitsTest, CpuQuota) {
  EXPECT_EQ(cpuQuotaUsec(0), -1);
  EXPECT_EQ(cpuQuotaUsec(-1), -1);
  EXPECT_EQ(cpuQuotaUsec(0.5), 50000);
  EXPECT_EQ(cpuQuotaUsec(2), 200000);
  EXPECT_EQ(cpuQuotaUsec(1.234567), 123457);
  EXPECT_EQ(cpuQuotaUsec(0.001), 1000);  // the kernel's 1 ms minimum
}

TEST(CgroupLimitsTest, WeightToShares) {
  EXPECT_EQ(cpuWeightToShares(0), 1024u);
  EXPECT_EQ(cpuWeightToShares(100), 1024u);
  EXPECT_EQ(cpuWeightToShares(200), 2048u);
  EXPECT_EQ(cpuWeightToShares(1), 10u);
  EXPECT_EQ(cpuWeightToShares(10000), 102400u);
  EXPECT_EQ(cpuWeightToShares(100000), 262144u);  // clamped
}

TEST(CgroupLimitsTest, Validation) {
  EXPECT_OK(validateCgroupLimits({}));
  EXPECT_OK(validateCgroupLimits({.memory_bytes = 1, .cpus = 64, .pids = 1, .cpu_weight = 10000}));
  EXPECT_FALSE(validateCgroupLimits({.cpus = std::nan("")}).ok());
  EXPECT_FALSE(validateCgroupLimits({.cpus = 1e9}).ok());
  EXPECT_OK(validateCgroupLimits({.cpuset_cpus = "0-3,8", .cpuset_mems = "0-1"}));
  EXPECT_FALSE(validateCgroupLimits({.cpuset_cpus = "0-3\n> /etc/x"}).ok());
  EXPECT_FALSE(validateCgroupLimits({.cpuset_mems = "1-0"}).ok());
}

}  // namespace
}  // namespace dsec
