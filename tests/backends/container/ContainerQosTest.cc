// CPU QoS of container sandboxes (docs/qos.md) on the real kernel: every process of a batch sandbox (init, execs
// and what they fork) runs SCHED_IDLE in a cgroup with cpu.idle and a low weight; a latency sandbox runs at
// normal priority, default weight, on the cpuset its spec names; a backend with QoS off makes plain sandboxes;
// an adopted sandbox keeps its class.
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <string>

#include "ContainerTestSupport.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {
namespace {

pid_t initPidOf(const backends::Sandbox& sb) { return sb.persistentState().at("init_pid").get<pid_t>(); }

// A cgroup file of the sandbox in the given v1 hierarchy (or the v2 directory), "" when absent.
std::string cgroupValue(const std::string& hierarchy, const std::string& id, const std::string& leaf) {
  for (const std::string& dir : {std::string("/sys/fs/cgroup/") + hierarchy + "/" + kTestCgroupParent + "/" + id,
                                 std::string("/sys/fs/cgroup/") + kTestCgroupParent + "/" + id}) {
    auto text = readFile(dir + "/" + leaf);
    if (text.ok()) return trim(*text);
  }
  return "";
}

bool hasCpuIdle(const std::string& id) {
  return access(("/sys/fs/cgroup/cpu/" + std::string(kTestCgroupParent) + "/" + id + "/cpu.idle").c_str(), F_OK) == 0 ||
         access(("/sys/fs/cgroup/" + std::string(kTestCgroupParent) + "/" + id + "/cpu.idle").c_str(), F_OK) == 0;
}

class ContainerQosTest : public ContainerTest {
 protected:
  // The policy numbers of the exec'd shell and of a child it forks, as the kernel reports them inside.
  std::string policies(backends::Sandbox& sb) {
    auto r = sh(sb,
                "grep '^policy' /proc/self/sched | tr -s ' ' | cut -d' ' -f3; "
                "sh -c \"grep '^policy' /proc/self/sched\" | tr -s ' ' | cut -d' ' -f3");
    return r.stdout_data;
  }
  std::string allowedCpus(backends::Sandbox& sb) {
    return trim(sh(sb, "grep Cpus_allowed_list /proc/self/status | cut -f2").stdout_data);
  }
};

TEST_F(ContainerQosTest, BatchProcessesRunSchedIdleWithIdleLowWeightCgroup) {
  auto spec = makeSpec();
  spec.qos = backends::CpuQos::kBatch;
  auto& sb = create(spec);
  EXPECT_EQ(sched_getscheduler(initPidOf(sb)), SCHED_IDLE);
  EXPECT_EQ(policies(sb), "5\n5\n");  // SCHED_IDLE for the exec and what it forks
  if (hasCpuIdle(spec.id)) {
    // The group as a whole is idle; the kernel then reports the minimal weight (v1 shares 3).
    EXPECT_EQ(cgroupValue("cpu", spec.id, "cpu.idle"), "1");
  } else {
    // Shares 102 on v1 (weight 10), or cpu.weight 10 on v2.
    std::string shares = cgroupValue("cpu", spec.id, "cpu.shares");
    EXPECT_EQ(shares.empty() ? cgroupValue("cpu", spec.id, "cpu.weight") : shares, shares.empty() ? "10" : "102");
  }
  // The command cannot leave SCHED_IDLE (no CAP_SYS_NICE): busybox has no chrt, but renice to a higher
  // priority is refused the same way.
  auto r = sh(sb, "renice -n -5 $$ >/dev/null 2>&1; echo $?");
  EXPECT_NE(r.stdout_data, "0\n");
}

TEST_F(ContainerQosTest, LatencyRunsNormallyOnItsCpuset) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  std::string last = std::to_string(cpus - 1);
  auto spec = makeSpec();
  spec.qos = backends::CpuQos::kLatency;
  spec.cpuset_cpus = last;
  spec.cpuset_mems = "0";
  auto made = backend_->create(spec);
  if (!made.ok() && made.error().code() == ErrorCode::kUnsupported) {
    GTEST_SKIP() << "no cpuset controller here: " << made.error().toString();
  }
  ASSERT_OK(made);
  sandboxes_.push_back(std::move(made).value());
  auto& sb = *sandboxes_.back();
  EXPECT_EQ(sched_getscheduler(initPidOf(sb)), SCHED_OTHER);
  EXPECT_EQ(policies(sb), "0\n0\n");
  EXPECT_EQ(allowedCpus(sb), last);
  EXPECT_EQ(cgroupValue("cpuset", spec.id, "cpuset.cpus"), last);
  std::string shares = cgroupValue("cpu", spec.id, "cpu.shares");
  if (!shares.empty()) {
    EXPECT_EQ(shares, "1024");
  }
  if (hasCpuIdle(spec.id)) {
    EXPECT_EQ(cgroupValue("cpu", spec.id, "cpu.idle"), "0");
  }
}

TEST_F(ContainerQosTest, BatchWithPoolCpusetIsPinnedToThePool) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  if (cpus < 2) GTEST_SKIP() << "needs 2 CPUs to leave one out of the pool";
  auto spec = makeSpec();
  spec.cpuset_cpus = "0";
  auto made = backend_->create(spec);
  if (!made.ok() && made.error().code() == ErrorCode::kUnsupported) GTEST_SKIP() << made.error().toString();
  ASSERT_OK(made);
  sandboxes_.push_back(std::move(made).value());
  EXPECT_EQ(allowedCpus(*sandboxes_.back()), "0");
  EXPECT_EQ(policies(*sandboxes_.back()), "5\n5\n");
}

TEST_F(ContainerQosTest, QosOffMakesPlainSandboxes) {
  backends::ContainerBackendOptions options;
  options.cgroup_parent = kTestCgroupParent;
  options.cpu_qos = false;
  auto plain = backends::makeContainerBackend(options);
  ASSERT_OK(plain);
  auto spec = makeSpec();  // batch by default
  auto made = (*plain)->create(spec);
  ASSERT_OK(made);
  sandboxes_.push_back(std::move(made).value());
  auto& sb = *sandboxes_.back();
  EXPECT_EQ(sched_getscheduler(initPidOf(sb)), SCHED_OTHER);
  EXPECT_EQ(policies(sb), "0\n0\n");
  std::string shares = cgroupValue("cpu", spec.id, "cpu.shares");
  if (!shares.empty()) {
    EXPECT_EQ(shares, "1024");
  }
  if (hasCpuIdle(spec.id)) {
    EXPECT_EQ(cgroupValue("cpu", spec.id, "cpu.idle"), "0");
  }
}

TEST_F(ContainerQosTest, AdoptedSandboxesKeepTheirClass) {
  auto batch_spec = makeSpec();
  auto latency_spec = makeSpec();
  latency_spec.qos = backends::CpuQos::kLatency;
  nlohmann::json batch_state, latency_state;
  {
    auto b = backend_->create(batch_spec);
    ASSERT_OK(b);
    batch_state = (*b)->persistentState();
    auto l = backend_->create(latency_spec);
    ASSERT_OK(l);
    latency_state = (*l)->persistentState();
  }
  backend_.reset();
  backend_ = newBackend();
  auto b = backend_->adopt(batch_state);
  ASSERT_OK(b);
  sandboxes_.push_back(std::move(b).value());
  auto l = backend_->adopt(latency_state);
  ASSERT_OK(l);
  sandboxes_.push_back(std::move(l).value());
  EXPECT_EQ(sandboxes_[0]->spec().qos, backends::CpuQos::kBatch);
  EXPECT_EQ(sandboxes_[1]->spec().qos, backends::CpuQos::kLatency);
  EXPECT_EQ(policies(*sandboxes_[0]), "5\n5\n");
  EXPECT_EQ(policies(*sandboxes_[1]), "0\n0\n");
}

}  // namespace
}  // namespace dsec::testing
