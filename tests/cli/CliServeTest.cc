// `dsec serve` as a subprocess on a free port, driven by `dsec run/exec/ls/pause/resume/rm` through
// DSEC_ENDPOINT/DSEC_TOKEN and through the fleet file. As root (real container sandboxes).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "ApiClient.h"
#include "BusyboxRootfs.h"
#include "CliRunner.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::testing {
namespace {

class CliServe : public ::testing::Test {
 protected:
  void SetUp() override {
    DSEC_SKIP_UNLESS_ROOT();
    if (findProgram("mkfs.erofs").empty()) GTEST_SKIP() << "mkfs.erofs missing (erofs-utils)";
    TempDir tree;
    ASSERT_OK(cli::writeBusyboxRootfs(tree.path() + "/rootfs"));
    auto built = runDsec({"layer", "build", "bb:1", "--from-dir", tree.path() + "/rootfs", "--root", root_.path()});
    ASSERT_EQ(built.exit_code, 0) << built.err;

    auto node = startServe(root_.path(), home_.path(), {"--fleet-name", "clitest", "--log-level", "info"});
    serve_ = std::move(node.process);
    ASSERT_FALSE(node.token.empty()) << "dsec serve did not come up: " << node.log;
    endpoint_ = node.endpoint;
    token_ = node.token;
    env_ = node.env;
  }
  void TearDown() override {
    if (serve_ == nullptr) return;
    // Whatever a failed test left behind goes before the server stops (a stopped server keeps sandboxes).
    auto listing = runDsec({"ls", "--json"}, env_);
    auto parsed = nlohmann::json::parse(listing.out, nullptr, false);
    if (!parsed.is_discarded() && parsed.contains("sandboxes")) {
      for (const auto& sb : parsed["sandboxes"]) runDsec({"rm", sb.value("id", "")}, env_);
    }
    EXPECT_EQ(serve_->stop(), 0) << readFile(home_.path() + "/serve.log").value();
  }
  CliResult dsec(const std::vector<std::string>& args) { return runDsec(args, env_); }

  TempDir root_;
  TempDir home_;
  std::string endpoint_;
  std::string token_;
  std::unique_ptr<BackgroundDsec> serve_;
  std::map<std::string, std::string> env_;
};

TEST_F(CliServe, RunExecLsPauseResumeRm) {
  auto r = dsec({"run", "bb:1", "--label", "suite=cli", "--memory", "128M", "--env", "GREETING=hello"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string id = trim(r.out);
  ASSERT_FALSE(id.empty());

  r = dsec({"exec", id, "--", "sh", "-c", "echo out $GREETING; echo err >&2; exit 7"});
  EXPECT_EQ(r.exit_code, 7) << r.err;
  EXPECT_EQ(r.out, "out hello\n");
  EXPECT_NE(r.err.find("err\n"), std::string::npos) << r.err;

  r = dsec({"exec", id, "--cwd", "/etc", "--env", "X=1", "--", "sh", "-c", "pwd; echo $X"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "/etc\n1\n");

  r = dsec({"exec", id, "--timeout", "0.5", "--", "sleep", "30"});
  EXPECT_EQ(r.exit_code, 137);
  EXPECT_NE(r.err.find("timed out"), std::string::npos) << r.err;

  r = dsec({"ls", "--label", "suite=cli"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("ID"), std::string::npos);
  EXPECT_NE(r.out.find(id), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("running"), std::string::npos) << r.out;
  r = dsec({"ls", "--label", "suite=other"});
  EXPECT_EQ(r.out.find(id), std::string::npos) << r.out;

  r = dsec({"pause", id});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("paused"), std::string::npos) << r.out;
  r = dsec({"resume", id});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("running"), std::string::npos) << r.out;

  r = dsec({"rm", id});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = dsec({"ls"});
  EXPECT_EQ(r.out.find(id), std::string::npos) << r.out;
  r = dsec({"rm", id});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("404"), std::string::npos) << r.err;
}

// A snapshot taken, listed, restored with `dsec run --snapshot`, forked, and removed, all through the CLI.
TEST_F(CliServe, SnapshotForkRestoreAndRemove) {
  auto r = dsec({"snapshot", "ls"});
  if (r.exit_code != 0 && r.err.find("404") != std::string::npos) {
    GTEST_SKIP() << "the node has no snapshot routes yet: " << r.err;
  }
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = dsec({"run", "bb:1", "--timeout", "300"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string src = trim(r.out);
  r = dsec({"exec", src, "--", "sh", "-c", "echo kept > /work/state.txt"});
  ASSERT_EQ(r.exit_code, 0) << r.err;

  r = dsec({"snapshot", "create", src, "--name", "cli-snap"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(trim(r.out), "cli-snap");
  r = dsec({"snapshot", "create", src, "--name", "cli-snap"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("409"), std::string::npos) << r.err;
  r = dsec({"snapshot", "create", src, "--processes"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("400"), std::string::npos) << r.err;
  r = dsec({"snapshot", "ls"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("NAME"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cli-snap"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(src), std::string::npos) << r.out;

  r = dsec({"exec", src, "--", "sh", "-c", "echo moved-on > /work/state.txt"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = dsec({"run", "--snapshot", "cli-snap", "--label", "restored=1", "--", "cat", "/work/state.txt"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "kept\n");

  r = dsec({"fork", src, "-n", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto copies = split(trim(r.out), '\n');
  ASSERT_EQ(copies.size(), 2u) << r.out;
  EXPECT_NE(copies[0], copies[1]);
  for (const auto& id : copies) {
    r = dsec({"exec", id, "--", "cat", "/work/state.txt"});
    EXPECT_EQ(r.out, "moved-on\n") << r.err;
    EXPECT_EQ(dsec({"rm", id}).exit_code, 0);
  }
  EXPECT_EQ(dsec({"rm", src}).exit_code, 0);

  r = dsec({"snapshot", "rm", "cli-snap"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = dsec({"snapshot", "ls", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("cli-snap"), std::string::npos) << r.out;
  r = dsec({"snapshot", "rm", "cli-snap"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("404"), std::string::npos) << r.err;
  r = dsec({"run", "--snapshot", "cli-snap"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("cli-snap"), std::string::npos) << r.err;
}

// The stage commands on a running sandbox: its egress policy and protected paths replaced (and emptied), bad input
// refused, and what its processes were refused listed.
TEST_F(CliServe, NetworkProtectAndViolationsChangeARunningSandbox) {
  auto r = dsec({"run", "bb:1", "--network", "egress"});
  if (r.exit_code != 0 && (r.err.find("egress") != std::string::npos || r.err.find("nftables") != std::string::npos)) {
    GTEST_SKIP() << "no egress on this host: " << r.err;
  }
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string id = trim(r.out);

  r = dsec({"network", id, "--egress", "10.0.0.0/8", "--egress", "192.0.2.1:443"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind(id + " network: [", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("10.0.0.0/8"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("192.0.2.1:443"), std::string::npos) << r.out;
  r = dsec({"network", id, "--egress", "not-a-destination!"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("egress"), std::string::npos) << r.err;
  r = dsec({"network", id});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, id + " network: [] (none)\n");

  // With no egress at all, a connect out is refused and shows up in the list.
  dsec({"exec", id, "--", "sh", "-c", "echo | nc -w 1 192.0.2.1 443; true"});
  bool listed = false;
  for (int i = 0; i < 100 && !listed; ++i) {
    r = dsec({"violations", id});
    listed = r.out.find("192.0.2.1:443") != std::string::npos && r.out.find("connect") != std::string::npos;
    if (!listed) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(listed) << "the refused connect is not listed: " << r.out << r.err;
  r = dsec({"violations", id, "--json"});
  auto doc = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << r.out;
  EXPECT_GE(doc.value("count", 0), 1) << r.out;

  r = dsec({"protect", id, "/etc"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("/etc"), std::string::npos) << r.out;
  r = dsec({"exec", id, "--", "sh", "-c", "echo x > /etc/dsec-cli-test"});
  EXPECT_NE(r.exit_code, 0) << "a protected path was written";
  r = dsec({"protect", id});
  EXPECT_EQ(r.out, id + " protect: [] (none)\n");
  r = dsec({"exec", id, "--", "sh", "-c", "echo x > /etc/dsec-cli-test"});
  EXPECT_EQ(r.exit_code, 0) << "lifting the protection did not lift it: " << r.err;

  r = dsec({"violations", "no-such-sandbox"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("404"), std::string::npos) << r.err;
}

TEST_F(CliServe, RunWithCommandPrintsOutputAndCleansUp) {
  auto r = dsec({"run", "bb:1", "--", "sh", "-c", "echo hello from $(hostname); exit 4"});
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_EQ(r.out.rfind("hello from ", 0), 0u) << r.out;
  r = dsec({"ls", "--json"});
  auto listing = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(listing.is_discarded()) << r.out;
  EXPECT_TRUE(listing["sandboxes"].empty()) << r.out;

  r = dsec({"run", "bb:1", "--keep", "--", "true"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("kept sandbox"), std::string::npos) << r.err;
  r = dsec({"ls", "--json"});
  EXPECT_EQ(nlohmann::json::parse(r.out)["sandboxes"].size(), 1u);
}

TEST_F(CliServe, InterruptedRunDestroysItsSandbox) {
  BackgroundDsec run({"run", "bb:1", "--", "sh", "-c", "echo started; sleep 60"}, env_, home_.path() + "/run.log");
  bool listed = false;
  for (int i = 0; i < 200 && !listed; ++i) {
    auto listing = nlohmann::json::parse(dsec({"ls", "--json"}).out, nullptr, false);
    listed = !listing.is_discarded() && listing["sandboxes"].size() == 1;
    if (!listed) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(listed) << readFile(home_.path() + "/run.log").value();
  EXPECT_EQ(run.stop(), 128 + SIGTERM);
  EXPECT_NE(readFile(home_.path() + "/run.log").value().find("interrupted; destroyed sandbox"), std::string::npos);
  auto listing = nlohmann::json::parse(dsec({"ls", "--json"}).out);
  EXPECT_TRUE(listing["sandboxes"].empty()) << listing.dump();
}

TEST_F(CliServe, ErrorsFromTheServerAreReported) {
  auto r = dsec({"run", "nothere:1"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("dsec run: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("nothere:1"), std::string::npos) << r.err;

  auto env = env_;
  env["DSEC_TOKEN"] = "wrong";
  r = runDsec({"ls"}, env);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("401"), std::string::npos) << r.err;

  r = dsec({"exec", "n0-doesnotexist", "--", "true"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("404"), std::string::npos) << r.err;
}

TEST_F(CliServe, FleetFileIsUsedWithoutEnvironment) {
  std::map<std::string, std::string> env{{"HOME", home_.path()}, {"DSEC_ENDPOINT", ""}, {"DSEC_TOKEN", ""}};
  ASSERT_TRUE(std::filesystem::exists(home_.path() + "/.dsec/fleets/clitest.json"));
  auto r = runDsec({"ls", "--fleet", "clitest"}, env);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("ID"), std::string::npos) << r.out;
  r = runDsec({"ls", "--fleet", "nosuchfleet"}, env);
  EXPECT_EQ(r.exit_code, 1);
}

// `dsec exec` forwards its stdin: a pipe's bytes reach `cat` and its EOF ends it; a file larger than one write
// arrives whole; --no-stdin gives the command EOF at once.
TEST_F(CliServe, ExecForwardsStdin) {
  auto r = dsec({"run", "bb:1", "--label", "suite=cli-stdin"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string id = trim(r.out);

  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const std::string text = "hello\nfrom the pipe\n";
  ASSERT_EQ(write(fds[1], text.data(), text.size()), static_cast<ssize_t>(text.size()));
  close(fds[1]);  // EOF after the text: cat must end
  r = runDsec({"exec", id, "--timeout", "60", "--", "cat"}, env_, 60, fds[0]);
  close(fds[0]);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, text);

  TempDir dir;
  const std::string big(size_t{700} * 1024, 'x');  // several stdin writes
  ASSERT_OK(writeFile(dir.path() + "/in", big));
  UniqueFd in(open((dir.path() + "/in").c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(in);
  r = runDsec({"exec", id, "--", "wc", "-c"}, env_, 60, in.get());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(trim(r.out), std::to_string(big.size()));

  UniqueFd again(open((dir.path() + "/in").c_str(), O_RDONLY | O_CLOEXEC));
  r = runDsec({"exec", id, "--no-stdin", "--", "wc", "-c"}, env_, 60, again.get());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(trim(r.out), "0");

  r = dsec({"exec", id, "--connect-timeout", "0", "--", "true"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--connect-timeout"), std::string::npos) << r.err;
  EXPECT_EQ(dsec({"rm", id}).exit_code, 0);
}

}  // namespace
}  // namespace dsec::testing
