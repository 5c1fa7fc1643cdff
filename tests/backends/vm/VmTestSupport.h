// Shared fixture for the microvm/vm backend tests: a busybox EROFS layer file (built once per process) attached
// to real QEMU guests under TCG here. Skips, naming what is missing, where QEMU, its TCG module or the guest
// kernel is absent.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "dsec/backends/BackendKind.h"
#include "dsec/backends/Sandbox.h"
#include "dsec/backends/vm/VmBackend.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::testing {

constexpr const char* kVmTestCgroupParent = "dsec-test-vm";

// The busybox layer file; empty with a reason when it cannot be made.
struct VmTestLayer {
  std::string file;
  std::string skip_reason;
  std::string error;
};
const VmTestLayer& vmBusyboxLayer();

class VmTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  virtual backends::BackendKind kind() const { return backends::BackendKind::kMicrovm; }
  std::unique_ptr<backends::Backend> newBackend();
  backends::SandboxSpec makeSpec();
  // Creates a sandbox (destroyed at TearDown if the test did not); fails the test when it cannot.
  backends::Sandbox& create(const backends::SandboxSpec& spec);
  backends::Sandbox& create() { return create(makeSpec()); }
  backends::Sandbox& adopt(std::unique_ptr<backends::Sandbox> sandbox);
  backends::ExecResult sh(backends::Sandbox& sb, const std::string& cmd, double timeout = 60);
  // Runs cmd until its output differs from `than` (polled, up to timeout seconds under TCG on a loaded host);
  // the last output.
  std::string shUntilChanged(backends::Sandbox& sb, const std::string& cmd, const std::string& than,
                             double timeout = 30);
  // The sandbox's run dir and cgroup dirs that exist on the host.
  std::vector<std::string> leftoversOf(const std::string& id) const;

  std::unique_ptr<backends::Backend> backend_;
  std::vector<std::unique_ptr<backends::Sandbox>> sandboxes_;
};

}  // namespace dsec::testing
