// `dsec call` against a `dsec serve` subprocess whose fncall image is built from the host's Python: code from
// the argument, -f FILE and stdin (-), --stdin/--stdin-file, --file REL=LOCALPATH, bash, the call's exit code
// as ours, and usage versus server errors.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "ApiClient.h"
#include "CliRunner.h"
#include "PythonTestImage.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::testing {
namespace {

class CliCall : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string missing = missingPythonRootfsTools();
    if (!missing.empty()) GTEST_SKIP() << missing;
    TempDir tree;
    ASSERT_OK(writePythonRootfs(tree.path() + "/rootfs"));
    auto built = runDsec({"layer", "build", "pyfn:1", "--from-dir", tree.path() + "/rootfs", "--root", root_.path()});
    ASSERT_EQ(built.exit_code, 0) << built.err;
    auto node = startServe(root_.path(), home_.path(),
                           {"--no-fleet-file", "--fncall-image", "pyfn:1", "--fncall-workers", "2"});
    serve_ = std::move(node.process);
    ASSERT_FALSE(node.token.empty()) << "dsec serve did not come up: " << node.log;
    endpoint_ = node.endpoint;
    token_ = node.token;
    env_ = node.env;
  }
  void TearDown() override {
    if (serve_) {
      EXPECT_EQ(serve_->stop(), 0) << readFile(home_.path() + "/serve.log").value();
    }
  }
  CliResult dsec(const std::vector<std::string>& args) { return runDsec(args, env_, 120); }

  TempDir root_;
  TempDir home_;
  std::string endpoint_;
  std::string token_;
  std::unique_ptr<BackgroundDsec> serve_;
  std::map<std::string, std::string> env_;
};

TEST_F(CliCall, CodeStdinFilesAndExitCode) {
  auto r = dsec({"call", "print(sum(range(1000)))"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "499500\n");

  r = dsec({"call", "--stdin", "abc",
            "import sys; print(sys.stdin.read().upper()); print('e', file=sys.stderr); "
            "sys.exit(7)"});
  EXPECT_EQ(r.exit_code, 7);
  EXPECT_EQ(r.out, "ABC\n");
  EXPECT_EQ(r.err, "e\n");

  TempDir local;
  ASSERT_OK(writeFile(local.path() + "/code.py", "print(open('in/data.txt').read() + input())\n"));
  ASSERT_OK(writeFile(local.path() + "/data.txt", "from-file"));
  ASSERT_OK(writeFile(local.path() + "/stdin.txt", "-and-stdin\n"));
  r = dsec({"call", "-f", local.path() + "/code.py", "--file", "in/data.txt=" + local.path() + "/data.txt",
            "--stdin-file", local.path() + "/stdin.txt"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "from-file-and-stdin\n");

  r = dsec({"call", "--language", "bash", "echo $((6 * 7)); exit 3"});
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.out, "42\n");
}

TEST_F(CliCall, CodeFromStdinAndTimeout) {
  auto piped = runCommand({"/bin/sh", "-c",
                           "echo 'print(6 * 7)' | DSEC_ENDPOINT=" + endpoint_ + " DSEC_TOKEN=" + token_ +
                               " HOME=" + home_.path() + " " + DSEC_CLI_PATH + " call -"});
  ASSERT_OK(piped);
  EXPECT_EQ(piped->output, "42\n");

  auto r = dsec({"call", "--timeout", "1", "import time; print('go', flush=True); time.sleep(60)"});
  EXPECT_EQ(r.exit_code, 137);
  EXPECT_EQ(r.out, "go\n");
  EXPECT_NE(r.err.find("timed out"), std::string::npos) << r.err;
}

TEST_F(CliCall, UsageAndServerErrors) {
  EXPECT_EQ(dsec({"call"}).exit_code, 2);
  EXPECT_EQ(dsec({"call", "--language", "ruby", "1"}).exit_code, 2);
  EXPECT_EQ(dsec({"call", "--timeout", "0", "1"}).exit_code, 2);
  EXPECT_EQ(dsec({"call", "--file", "noequals", "1"}).exit_code, 2);
  auto r = dsec({"call", "--image", "nope:1", "print(1)"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("nope:1"), std::string::npos) << r.err;
  r = dsec({"call", "--file", "../x=/etc/hostname", "print(1)"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(".."), std::string::npos) << r.err;
}

}  // namespace
}  // namespace dsec::testing
