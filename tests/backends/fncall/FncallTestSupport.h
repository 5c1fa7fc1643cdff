// Fixture for fncall tests: the Python test image (built once per test process), a container backend whose
// cgroups live under fncallTestCgroupParent(), and a FunctionService over them.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "PythonTestImage.h"
#include "dsec/backends/fncall/FunctionService.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::testing {

// "dsec-test-fn-<pid>": one parent per test process, because ctest runs the tests of this binary in parallel
// processes and each checks at teardown that it left no worker cgroup.
const std::string& fncallTestCgroupParent();

class FncallTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  // Options with test-friendly defaults (no prewarm, generous queue wait); tweak, then startService().
  backends::fncall::FunctionServiceOptions options_;
  void startService();
  backends::fncall::FunctionService& service() { return *service_; }

  backends::fncall::CallRequest python(const std::string& code);
  backends::fncall::CallRequest bash(const std::string& code);
  // Runs a call that must succeed (as a call: any exit code); fails the test on an error.
  backends::ExecResult run(const backends::fncall::CallRequest& request);
  backends::ExecResult py(const std::string& code) { return run(python(code)); }

  // Ids of the worker cgroups that exist now (all belong to this test process's services).
  std::vector<std::string> workerCgroups();
  // Host pids of zygotes: children of this process running the interpreter.
  std::vector<pid_t> zygotePids();
  // CPU seconds used so far by all worker sandboxes.
  double workerCpuSeconds();
  // Checks nothing of any worker is left: cgroups, mounts, zygotes.
  void expectNothingLeft();

  std::unique_ptr<backends::Backend> backend_;
  std::unique_ptr<backends::fncall::FunctionService> service_;
  static PythonTestImage* image();
};

}  // namespace dsec::testing
