// What an idle sandbox costs the agent in fds (ContainerSandbox.h): one, its init's pidfd, however many sandboxes
// the node holds. A node of 10,000 sandboxes fits under an RLIMIT_NOFILE of 20,000 only so (docs/density.md).
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdint>

#include "ContainerTestSupport.h"
#include "dsec/common/Directory.h"
#include "dsec/common/ProcessLimits.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {
namespace {

size_t openFds() {
  auto fds = listDirectory("/proc/self/fd");
  EXPECT_TRUE(fds.ok()) << "cannot count this process's fds: " << fds.error().toString();
  return fds.ok() ? fds->size() : SIZE_MAX;  // an unreadable count fails every bound below as well
}

class ContainerFdCostTest : public ContainerTest {
 protected:
  // Sandboxes that each ran a command, as on a node whose sandboxes started their workload and went idle.
  void createIdle(backends::Backend& backend, int count) {
    for (int i = 0; i < count; ++i) {
      auto sb = backend.create(makeSpec());
      ASSERT_OK(sb);
      held_.push_back(std::move(sb).value());
      EXPECT_EQ(sh(*held_.back(), "echo up").stdout_data, "up\n");
    }
  }
  void TearDown() override {
    for (auto& sb : held_) EXPECT_OK(sb->destroy());
    held_.clear();
    ContainerTest::TearDown();
  }

  std::vector<std::unique_ptr<backends::Sandbox>> held_;
};

TEST_F(ContainerFdCostTest, AnIdleSandboxCostsTheAgentOneFd) {
  backends::ContainerBackendOptions options;
  options.cgroup_parent = kTestCgroupParent;
  options.init_pool_size = 0;           // no inits waiting in the background (their fds come and go)
  options.join_fd_cache_sandboxes = 2;  // full after the first sandboxes: the same count at both readings
  auto backend = backends::makeContainerBackend(options);
  ASSERT_OK(backend);
  const size_t before = openFds();
  constexpr int kStep = 12;
  createIdle(**backend, kStep);
  const size_t at_first_step = openFds();
  createIdle(**backend, kStep);
  const size_t at_second_step = openFds();
  // The file API opens a sandbox's root only for the operation.
  for (auto& sb : held_) ASSERT_OK(sb->stat("/bin/sh"));
  EXPECT_EQ(openFds(), at_second_step);
  constexpr size_t kFdsPerIdleSandbox = 1;  // init's pidfd
  EXPECT_LE(at_second_step - at_first_step, kFdsPerIdleSandbox * kStep)
      << at_first_step << " fds with " << kStep << " sandboxes, " << at_second_step << " with " << 2 * kStep;
  for (auto& sb : held_) EXPECT_OK(sb->destroy());
  held_.clear();
  // What stays is the backend's own, opened on first use: the spawner's channel and pidfd, the id range lease file.
  EXPECT_LE(openFds(), before + 3) << "destroyed sandboxes left fds behind";
}

// The agent raises its own RLIMIT_NOFILE to hold thousands of sandboxes; what runs inside a sandbox gets the limit
// the agent started with back, so raising it changes nothing for sandboxed code.
TEST_F(ContainerTest, ASandboxGetsTheFileLimitTheAgentStartedWithNotTheRaisedOne) {
  rlimit before{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &before), 0);
  // An agent started with a soft limit below its hard one, as from a login shell (soft 512).
  constexpr rlim_t kStartSoft = 512;
  if (before.rlim_max <= kStartSoft) GTEST_SKIP() << "RLIMIT_NOFILE hard limit " << before.rlim_max << " is too low";
  rlimit start{kStartSoft, before.rlim_max};
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &start), 0);
  raiseProcessLimits();
  auto original = originalFileLimit();
  ASSERT_TRUE(original.has_value()) << "raiseProcessLimits raised nothing from a soft limit of " << kStartSoft;
  ASSERT_EQ(original->rlim_cur, kStartSoft);
  rlimit raised{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &raised), 0);
  ASSERT_GT(raised.rlim_cur, kStartSoft);
  auto r = sh(create(), "ulimit -n");
  ASSERT_EQ(r.exit_code, 0) << r.stderr_data;
  EXPECT_EQ(trim(r.stdout_data), std::to_string(kStartSoft)) << "the agent's raised limit is " << raised.rlim_cur;
}

}  // namespace
}  // namespace dsec::testing
