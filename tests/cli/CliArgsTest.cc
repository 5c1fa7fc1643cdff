// Command-line handling of the real `dsec` binary: usage errors exit 2 with a message naming the problem,
// runtime errors exit 1 as "dsec <cmd>: <message>", --help exits 0.
#include <gtest/gtest.h>

#include "CliRunner.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::testing {
namespace {

// No fleet anywhere: HOME is an empty temp dir and DSEC_ENDPOINT is unset.
std::map<std::string, std::string> noFleet(const TempDir& home) {
  return {{"HOME", home.path()}, {"DSEC_ENDPOINT", ""}, {"DSEC_TOKEN", ""}};
}

TEST(CliArgs, NoCommandIsUsageError) {
  auto r = runDsec({});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("missing command"), std::string::npos) << r.err;
}

TEST(CliArgs, UnknownCommandIsUsageError) {
  auto r = runDsec({"frobnicate"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("unknown command 'frobnicate'"), std::string::npos) << r.err;
}

TEST(CliArgs, UnknownOptionIsUsageError) {
  auto r = runDsec({"ls", "--bogus"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("dsec ls: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("bogus"), std::string::npos) << r.err;
}

TEST(CliArgs, BadSizeIsUsageError) {
  TempDir home;
  auto r = runDsec({"run", "busybox:1", "--memory", "12Q"}, noFleet(home));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--memory"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("12Q"), std::string::npos) << r.err;
}

TEST(CliArgs, BadNetworkIsUsageError) {
  TempDir home;
  auto r = runDsec({"run", "busybox:1", "--network", "bridge"}, noFleet(home));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--network"), std::string::npos) << r.err;
}

TEST(CliArgs, BadServeSwitchesAreUsageErrors) {
  TempDir root;
  auto r = runDsec({"serve", "--root", root.path(), "--cpu-qos", "maybe"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--cpu-qos wants on or off"), std::string::npos) << r.err;
  r = runDsec({"serve", "--root", root.path(), "--overcommit", "sometimes"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--overcommit wants on or off"), std::string::npos) << r.err;
}

TEST(CliArgs, BadKeyValueIsUsageError) {
  TempDir home;
  auto r = runDsec({"run", "busybox:1", "--env", "NOEQUALS"}, noFleet(home));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("KEY=VALUE"), std::string::npos) << r.err;
}

TEST(CliArgs, BadLayerRefIsUsageError) {
  TempDir root;
  auto r = runDsec({"layer", "build", "Not A Ref", "--from-dir", root.path(), "--root", root.path()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("dsec layer"), std::string::npos) << r.err;
  r = runDsec({"layer", "rm", "nover", "--root", root.path()});
  EXPECT_EQ(r.exit_code, 2) << r.err;
}

TEST(CliArgs, LayerBuildNeedsExactlyOneSource) {
  TempDir root;
  auto r = runDsec({"layer", "build", "a:1", "--root", root.path()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("exactly one"), std::string::npos) << r.err;
  r = runDsec({"layer", "build", "a:1", "--run", "true", "--root", root.path()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--on and --run"), std::string::npos) << r.err;
}

TEST(CliArgs, MissingSubcommandsAndArguments) {
  EXPECT_EQ(runDsec({"layer"}).exit_code, 2);
  EXPECT_EQ(runDsec({"layer", "frob"}).exit_code, 2);
  EXPECT_EQ(runDsec({"bench"}).exit_code, 2);
  EXPECT_EQ(runDsec({"exec", "n0-1"}).exit_code, 2);
  EXPECT_EQ(runDsec({"rm"}).exit_code, 2);
  EXPECT_EQ(runDsec({"pause"}).exit_code, 2);
  EXPECT_EQ(runDsec({"bench", "create", "--count", "0"}).exit_code, 2);
  EXPECT_EQ(runDsec({"--log-level", "loud", "ls"}).exit_code, 2);
}

// Snapshot, fork and restore arguments are checked before any fleet is looked for.
TEST(CliArgs, SnapshotForkAndRestoreArguments) {
  TempDir home;
  auto env = noFleet(home);
  EXPECT_EQ(runDsec({"snapshot"}, env).exit_code, 2);
  auto r = runDsec({"snapshot", "frob"}, env);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("unknown snapshot command 'frob'"), std::string::npos) << r.err;
  r = runDsec({"snapshot", "create"}, env);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("dsec snapshot create: "), std::string::npos) << r.err;
  EXPECT_EQ(runDsec({"snapshot", "rm"}, env).exit_code, 2);
  EXPECT_EQ(runDsec({"fork"}, env).exit_code, 2);
  for (const char* count : {"0", "257", "-3", "many"}) {
    r = runDsec({"fork", "n0-0123456789abcdef", "-n", count}, env);
    EXPECT_EQ(r.exit_code, 2) << count;
    EXPECT_NE(r.err.find("dsec fork: "), std::string::npos) << r.err;
  }
  r = runDsec({"run"}, env);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--snapshot"), std::string::npos) << r.err;
  r = runDsec({"run", "busybox:1", "--snapshot", "s1"}, env);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("give no IMAGE"), std::string::npos) << r.err;
  for (const char* fixed : {"--memory", "--cpus", "--backend"}) {
    r = runDsec({"run", "--snapshot", "s1", fixed, "1"}, env);
    EXPECT_EQ(r.exit_code, 2) << fixed;
    EXPECT_NE(r.err.find("from the snapshot"), std::string::npos) << r.err;
  }
  // Well-formed: it gets as far as looking for the fleet.
  r = runDsec({"run", "--snapshot", "s1", "--timeout", "60", "--label", "a=b"}, env);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("no fleet 'default'"), std::string::npos) << r.err;
  r = runDsec({"fork", "n0-0123456789abcdef", "-n", "3"}, env);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("no fleet 'default'"), std::string::npos) << r.err;
}

TEST(CliArgs, HelpExitsZero) {
  auto r = runDsec({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("commands:"), std::string::npos) << r.out;
  r = runDsec({"run", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--memory"), std::string::npos) << r.out;
  r = runDsec({"snapshot", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("dsec run --snapshot NAME"), std::string::npos) << r.out;
  r = runDsec({"fork", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--count"), std::string::npos) << r.out;
  r = runDsec({"layer", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--from-dir"), std::string::npos) << r.out;
}

TEST(CliArgs, ClientWithoutFleetFailsWithMessage) {
  TempDir home;
  auto r = runDsec({"ls"}, noFleet(home));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("dsec ls: no fleet 'default'"), std::string::npos) << r.err;
}

TEST(CliArgs, UnreachableFleetFailsWithMessage) {
  TempDir home;
  auto env = noFleet(home);
  env["DSEC_ENDPOINT"] = "http://127.0.0.1:" + std::to_string(pickFreePort());
  env["DSEC_TOKEN"] = "x";
  auto r = runDsec({"ls"}, env);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("cannot reach the fleet"), std::string::npos) << r.err;
}

TEST(CliArgs, GlobalOptionsBeforeTheCommand) {
  TempDir root;
  auto r = runDsec({"--root", root.path(), "layer", "ls"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("NAME:VERSION"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace dsec::testing
