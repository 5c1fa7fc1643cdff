// Shared fixture for the container backend tests: a tiny busybox rootfs packed into an EROFS image and
// mounted read-only (file-backed), exactly as fs3 mounts layers in production.
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "dsec/backends/Sandbox.h"
#include "dsec/backends/container/ContainerBackend.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::testing {

constexpr const char* kTestCgroupParent = "dsec-test-ct";

// The mounted busybox layer (built once per test process); empty with a reason if it cannot be made.
struct TestLayer {
  std::string mount_dir;    // lower dir for sandboxes
  std::string skip_reason;  // a missing tool or kernel feature
  std::string error;        // a failure building it
};
const TestLayer& busyboxLayer();

class ContainerTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  backends::SandboxSpec makeSpec();
  // Creates a sandbox (destroyed at TearDown if the test did not).
  backends::Sandbox& create(const backends::SandboxSpec& spec);
  backends::Sandbox& create() { return create(makeSpec()); }
  backends::ExecResult sh(backends::Sandbox& sb, const std::string& cmd, double timeout = 20);
  std::unique_ptr<backends::Backend> newBackend();

  std::unique_ptr<backends::Backend> backend_;
  std::vector<std::unique_ptr<backends::Sandbox>> sandboxes_;
  // Inits started ahead of time by backends this fixture makes; a derived fixture may set it in its constructor.
  int init_pool_size_ = backends::ContainerBackendOptions{}.init_pool_size;
  std::vector<std::string> egress_never_;  // ContainerBackendOptions::egress_never
  std::string dns_upstream_;               // ContainerBackendOptions::dns_upstream
  int64_t snapshot_max_bytes_ = backends::ContainerBackendOptions{}.snapshot_max_bytes;
  int64_t snapshot_max_entries_ = backends::ContainerBackendOptions{}.snapshot_max_entries;
};

// Leftovers of a sandbox id on the host: cgroup directories under every hierarchy.
std::vector<std::string> cgroupDirsOf(const std::string& id);
// Host mounts (lines of /proc/self/mountinfo) that belong to sandboxes: on the shared scratch dir every init
// mounts its root on (inside its own namespace), or naming the id. Must always be 0 in the host namespace.
size_t sandboxMountsInHost(const std::string& id = "");
bool processAlive(pid_t pid);

}  // namespace dsec::testing
