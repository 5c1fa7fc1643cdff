// What an idle sandbox costs the agent in fds (ContainerSandbox.h): one, its init's pidfd, however many sandboxes
// the node holds. A node of 10,000 sandboxes fits under an RLIMIT_NOFILE of 20,000 only so (docs/density.md).
#include <gtest/gtest.h>

#include "ContainerTestSupport.h"
#include "dsec/common/Directory.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {
namespace {

size_t openFds() {
  auto fds = listDirectory("/proc/self/fd");
  return fds.ok() ? fds->size() : 0;
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

}  // namespace
}  // namespace dsec::testing
