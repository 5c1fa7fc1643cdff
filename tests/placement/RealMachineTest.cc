// The real machine: its topology loads, and the real binder really binds (a child process, a cpuset cgroup).
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dsec/common/Strings.h"
#include "dsec/placement/Binder.h"
#include "dsec/placement/NodeModel.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::placement {
namespace {

TEST(PlacementRealMachine, TopologyLoads) {
  auto model = NodeModel::fromSystem();
  ASSERT_OK(model);
  NodeSummary s = model->summary();
  EXPECT_GE(s.cores, 1);
  EXPECT_GE(s.pus, s.cores);
  EXPECT_GE(s.numa_domains, 1);
  EXPECT_GE(s.packages, 1);
  EXPECT_EQ(s.pus, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  EXPECT_GT(s.memory_bytes, 0);
  EXPECT_EQ(NodeModel::fromSpec("system")->summary().pus, s.pus);
}

// A child that sleeps until killed; reaped at scope exit.
class Child {
 public:
  Child() {
    pid_ = fork();
    if (pid_ == 0) {
      while (true) pause();
    }
  }
  ~Child() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_;
};

TEST(PlacementRealMachine, RealBinderBindsAChildToCpu0) {
  Child child;
  ASSERT_GT(child.pid(), 0);
  auto binder = makeRealBinder();
  ASSERT_OK(binder->bindCpus(BindTarget::process(child.pid()), "0"));
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(child.pid(), sizeof(set), &set), 0);
  EXPECT_EQ(CPU_COUNT(&set), 1);
  EXPECT_TRUE(CPU_ISSET(0, &set));
  // Best effort: SCHED_IDLE needs no privilege.
  ASSERT_OK(binder->setSchedPolicy(BindTarget::process(child.pid()), SCHED_IDLE));
  EXPECT_EQ(sched_getscheduler(child.pid()), SCHED_IDLE);
  // Memory of another process can only be bound through its cgroup, and the binder says so.
  auto memory = binder->bindMemory(BindTarget::process(child.pid()), "0");
  ASSERT_ERROR(memory, ErrorCode::kUnsupported);
  ASSERT_ERROR(binder->bindCpus(BindTarget::process(child.pid()), ""), ErrorCode::kInvalidArgument);
}

TEST(PlacementRealMachine, RealBinderBindsTheCallingThreadsMemory) {
  // In a child, so the test process keeps its policy.
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto binder = makeRealBinder();
    if (!binder->bindMemory(BindTarget::process(0), "0").ok()) _exit(1);
    int mode = -1;
    unsigned long mask[16] = {};
    if (syscall(SYS_get_mempolicy, &mode, mask, sizeof(mask) * 8, nullptr, 0) != 0) _exit(2);
    _exit(mode == 2 /* MPOL_BIND */ && (mask[0] & 1) ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: bindMemory failed, 2: get_mempolicy failed, 3: policy not MPOL_BIND";
}

TEST(PlacementRealMachine, RealBinderWritesACpusetCgroup) {
  DSEC_SKIP_UNLESS_ROOT();
  // cgroup v1 cpuset hierarchy, or v2 with the cpuset controller at the root.
  std::string root;
  struct stat st {};
  if (stat("/sys/fs/cgroup/cpuset/cpuset.cpus", &st) == 0) {
    root = "/sys/fs/cgroup/cpuset";
  } else if (stat("/sys/fs/cgroup/cgroup.subtree_control", &st) == 0 &&
             readFile("/sys/fs/cgroup/cgroup.subtree_control")->find("cpuset") != std::string::npos) {
    root = "/sys/fs/cgroup";
  } else {
    GTEST_SKIP() << "no cpuset controller (v1 /sys/fs/cgroup/cpuset or v2 subtree_control) on this machine";
  }
  std::string dir = root + "/dsec-placement-test-" + randomHex(8);
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0) << dir << ": " << strerror(errno);
  auto binder = makeRealBinder();
  auto target = BindTarget::cgroup(dir);
  Status cpus = binder->bindCpus(target, "0");
  Status mems = binder->bindMemory(target, "0");
  auto cpus_read = readFile(dir + "/cpuset.cpus");
  auto mems_read = readFile(dir + "/cpuset.mems");
  rmdir(dir.c_str());
  ASSERT_OK(cpus);
  ASSERT_OK(mems);
  ASSERT_OK(cpus_read);
  ASSERT_OK(mems_read);
  EXPECT_EQ(trim(*cpus_read), "0");
  EXPECT_EQ(trim(*mems_read), "0");
}

}  // namespace
}  // namespace dsec::placement
