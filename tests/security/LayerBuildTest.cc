// Attack: a layer build (`dsec layer build --on IMAGE --run CMD`) is code the builder does not control (an install
// script, a package's maintainer scripts). It runs in the same kind of sandbox as everything else: its own user
// namespace, its own network namespace (egress only), and it cannot write outside its upper directory, including
// through symlinks it made. A setuid-root file it leaves in the layer gains nothing, on the node or inside.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "../cli/CliRunner.h"
#include "BusyboxRootfs.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/LayerMounter.h"
#include "dsec/fs3/LayerStore.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::testing {
namespace {

namespace fs = std::filesystem;

class LayerBuildAttack : public ::testing::Test {
 protected:
  void SetUp() override {
    DSEC_SKIP_UNLESS_ROOT();
    if (findProgram("mkfs.erofs").empty()) GTEST_SKIP() << "mkfs.erofs missing (erofs-utils)";
    // Host users must be able to reach the layers (as with a store under /var/lib): the setuid check runs as one.
    ASSERT_EQ(::chmod(root_.path().c_str(), 0755), 0);
    TempDir tree;
    ASSERT_OK(cli::writeBusyboxRootfs(tree.path() + "/rootfs"));
    auto r = dsec({"layer", "build", "bb:1", "--from-dir", tree.path() + "/rootfs"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  CliResult dsec(std::vector<std::string> args, double timeout = 300) {
    args.push_back("--root");
    args.push_back(root_.path());
    return runDsec(args, {}, timeout);
  }
  TempDir root_;
};

TEST_F(LayerBuildAttack, BuildRunsConfinedAndWritesNothingOutsideItsUpper) {
  // Host files the build will aim at through symlinks and absolute paths.
  TempDir host;
  ASSERT_EQ(::chmod(host.path().c_str(), 0755), 0);
  std::ofstream(host.path() + "/resolv.conf") << "canary\n";
  std::ofstream(host.path() + "/hosts") << "canary\n";
  const std::string script =
      // Evidence of where it ran.
      "cat /proc/self/uid_map > /evidence-uidmap; cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' ' | "
      "sort | tr '\\n' ' ' > /evidence-netdev; "
      // Symlinks to the host's files, and writes through them.
      "ln -s " +
      host.path() +
      " /escape; echo pwned > /escape/hosts 2>/dev/null; echo pwned > /escape/new 2>/dev/null; "
      "ln -s " +
      host.path() +
      "/resolv.conf /escape-file; echo pwned > /escape-file 2>/dev/null; "
      // Replace /etc by a symlink to the host directory (the build's post-processing removes /etc/resolv.conf).
      "rm -rf /etc 2>/dev/null; ln -s " +
      host.path() +
      " /etc 2>/dev/null; "
      // A setuid-root program left in the layer.
      "cp /bin/busybox /busybox-suid && chmod 4755 /busybox-suid; "
      "true";
  auto r = dsec({"layer", "build", "attack:1", "--on", "bb:1", "--run", script});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;

  // Nothing on the host changed.
  auto hosts = readFile(host.path() + "/hosts");
  ASSERT_OK(hosts);
  EXPECT_EQ(*hosts, "canary\n") << "the build wrote a host file through its symlink";
  auto resolv = readFile(host.path() + "/resolv.conf");
  ASSERT_OK(resolv);
  EXPECT_EQ(*resolv, "canary\n") << "the build (or its post-processing) changed a host file";
  EXPECT_FALSE(fs::exists(host.path() + "/new")) << "the build created a host file";

  // The layer holds the symlinks as symlinks, and the evidence.
  fs3::LayerStore store(root_.path());
  fs3::LayerMounter mounter(&store);
  auto layers = fs3::parseImageRef("attack:1");
  ASSERT_OK(layers);
  auto mounted = mounter.acquire(*layers);
  ASSERT_OK(mounted);
  const std::string dir = (*mounted)->dirs().at(0);
  EXPECT_TRUE(fs::is_symlink(dir + "/escape"));
  auto uidmap = readFile(dir + "/evidence-uidmap");
  ASSERT_OK(uidmap);
  auto fields = split(trim(*uidmap), ' ');
  fields.erase(std::remove(fields.begin(), fields.end(), ""), fields.end());
  ASSERT_EQ(fields.size(), 3u) << *uidmap;
  EXPECT_EQ(fields[0], "0");
  EXPECT_NE(fields[1], "0") << "the build ran as host root";
  auto netdev = readFile(dir + "/evidence-netdev");
  ASSERT_OK(netdev);
  EXPECT_EQ(trim(*netdev), "eth0 lo") << "the build saw the node's network";

  // The setuid-root program is in the layer, owned by root with its bit, and gains nothing: the layer mount is
  // nosuid, so a node user running it stays themselves.
  struct stat st {};
  ASSERT_EQ(::stat((dir + "/busybox-suid").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0u);
  EXPECT_TRUE(st.st_mode & S_ISUID);
  struct statvfs vfs {};
  ASSERT_EQ(::statvfs(dir.c_str(), &vfs), 0);
  EXPECT_TRUE(vfs.f_flag & ST_NOSUID) << "layer mounted without nosuid";
  if (findProgram("setpriv").empty()) GTEST_SKIP() << "setpriv (util-linux) missing for the run-as-nobody check";
  auto ran =
      runCommand({"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", dir + "/busybox-suid", "id", "-u"});
  ASSERT_OK(ran);
  EXPECT_EQ(trim(ran->output), "65534") << "a setuid file of a layer made a node user root";
}

}  // namespace
}  // namespace dsec::testing
