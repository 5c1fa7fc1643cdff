// `dsec layer build|ls|rm` against a real layer store (mkfs.erofs, EROFS mounts, container sandboxes): as root.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <filesystem>
#include <fstream>

#include "BusyboxRootfs.h"
#include "CliRunner.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/LayerMounter.h"
#include "dsec/fs3/LayerStore.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::testing {
namespace {

namespace fs = std::filesystem;

class CliLayer : public ::testing::Test {
 protected:
  void SetUp() override {
    DSEC_SKIP_UNLESS_ROOT();
    if (findProgram("mkfs.erofs").empty()) GTEST_SKIP() << "mkfs.erofs missing (erofs-utils)";
  }
  CliResult dsec(std::vector<std::string> args, double timeout = 120) {
    args.push_back("--root");
    args.push_back(root_.path());
    return runDsec(args, {}, timeout);
  }
  std::vector<std::string> buildDirsLeft() {
    std::vector<std::string> left;
    if (!fs::exists(root_.path() + "/layers")) return left;
    for (const auto& e : fs::directory_iterator(root_.path() + "/layers")) {
      if (e.path().filename().string().rfind(".build-", 0) == 0) left.push_back(e.path());
    }
    return left;
  }
  void buildBusyboxBase(const std::string& ref) {
    TempDir tree;
    ASSERT_OK(cli::writeBusyboxRootfs(tree.path() + "/rootfs"));
    auto r = dsec({"layer", "build", ref, "--from-dir", tree.path() + "/rootfs"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }

  TempDir root_;
};

TEST_F(CliLayer, BuildFromDirListRefuseRebuildRemove) {
  TempDir src;
  std::ofstream(src.path() + "/hello.txt") << "hello\n";
  auto r = dsec({"layer", "build", "demo:1", "--from-dir", src.path()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("built demo:1"), std::string::npos) << r.out;
  // Not a terminal: the steps one line each, then the end, on stderr.
  EXPECT_NE(r.err.find("layer build demo:1: packing the EROFS image\n"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("layer build demo:1: checksumming and publishing\n"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("layer build demo:1: done in "), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << "a log got a terminal's status line: " << r.err;

  r = dsec({"layer", "ls"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("NAME:VERSION"), std::string::npos);
  EXPECT_NE(r.out.find("demo:1"), std::string::npos) << r.out;

  r = dsec({"layer", "build", "demo:1", "--from-dir", src.path()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("dsec layer build: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exists"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("done in"), std::string::npos) << "a refused build said it was done: " << r.err;

  // A new version of the same layer is independent.
  r = dsec({"layer", "build", "demo:2", "--from-dir", src.path()});
  ASSERT_EQ(r.exit_code, 0) << r.err;

  r = dsec({"layer", "rm", "demo:1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = dsec({"layer", "ls"});
  EXPECT_EQ(r.out.find("demo:1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("demo:2"), std::string::npos) << r.out;
  r = dsec({"layer", "rm", "demo:1"});
  EXPECT_EQ(r.exit_code, 1) << r.out;
}

TEST_F(CliLayer, RemoveRefusedWhileMounted) {
  buildBusyboxBase("base:1");
  fs3::LayerStore store(root_.path());
  fs3::LayerMounter mounter(&store);
  auto mounted = mounter.acquire({fs3::LayerRef{"base", "1"}});
  ASSERT_OK(mounted);
  auto r = dsec({"layer", "rm", "base:1"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("in use"), std::string::npos) << r.err;
  mounted->reset();
  r = dsec({"layer", "rm", "base:1"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(CliLayer, RunBuildCapturesNewFilesAndWhiteouts) {
  buildBusyboxBase("base:1");
  auto r = dsec({"layer", "build", "top:1", "--on", "base:1", "--run",
                 "echo hi > /hello; rm /etc/motd; mkdir -p /opt/tool && echo v1 > /opt/tool/version; echo built"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("built\n"), std::string::npos) << "the command's output reaches the terminal: " << r.out;
  EXPECT_TRUE(buildDirsLeft().empty());

  fs3::LayerStore store(root_.path());
  auto manifest = store.get({"top", "1"});
  ASSERT_OK(manifest);
  EXPECT_EQ(manifest->built_on, "base:1");
  EXPECT_EQ(manifest->source,
            "run:echo hi > /hello; rm /etc/motd; mkdir -p /opt/tool && echo v1 > /opt/tool/version; "
            "echo built");

  fs3::LayerMounter mounter(&store);
  auto mounted = mounter.acquire({fs3::LayerRef{"base", "1"}, fs3::LayerRef{"top", "1"}});
  ASSERT_OK(mounted);
  const auto& dirs = (*mounted)->dirs();  // bottom first
  ASSERT_EQ(dirs.size(), 2u);
  // The top layer alone: the new file, and a whiteout (char device 0:0) for the removed one.
  EXPECT_EQ(readFile(dirs[1] + "/hello").value(), "hi\n");
  struct stat st {};
  ASSERT_EQ(lstat((dirs[1] + "/etc/motd").c_str(), &st), 0) << "no whiteout captured for /etc/motd";
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_EQ(st.st_rdev, makedev(0, 0));
  EXPECT_FALSE(fs::exists(dirs[1] + "/bin/busybox")) << "the lower layer's files leaked into the upper";

  // Stacked: the whiteout hides the base layer's file.
  TempDir merged;
  std::string opts = "lowerdir=" + dirs[1] + ":" + dirs[0];
  ASSERT_EQ(mount("overlay", merged.path().c_str(), "overlay", MS_RDONLY, opts.c_str()), 0) << strerror(errno);
  EXPECT_TRUE(fs::exists(merged.path() + "/hello"));
  EXPECT_EQ(readFile(merged.path() + "/opt/tool/version").value(), "v1\n");
  EXPECT_FALSE(fs::exists(merged.path() + "/etc/motd"));
  EXPECT_TRUE(fs::exists(merged.path() + "/etc/passwd"));
  EXPECT_TRUE(fs::exists(merged.path() + "/bin/busybox"));
  umount2(merged.path().c_str(), MNT_DETACH);
}

TEST_F(CliLayer, FailingRunBuildsNothing) {
  buildBusyboxBase("base:1");
  auto r = dsec({"layer", "build", "bad:1", "--on", "base:1", "--run", "echo half-done > /x; echo boom >&2; exit 3"});
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_NE(r.err.find("boom"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exited with 3"), std::string::npos) << r.err;
  fs3::LayerStore store(root_.path());
  EXPECT_FALSE(store.exists({"bad", "1"}));
  EXPECT_TRUE(buildDirsLeft().empty());
  r = dsec({"layer", "ls"});
  EXPECT_EQ(r.out.find("bad:1"), std::string::npos) << r.out;
}

TEST_F(CliLayer, RunBuildOnMissingImageFails) {
  auto r = dsec({"layer", "build", "x:1", "--on", "nothere:1", "--run", "true"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("nothere:1"), std::string::npos) << r.err;
  EXPECT_TRUE(buildDirsLeft().empty());
}

TEST_F(CliLayer, RunBuildOfExistingLayerRefusedBeforeRunning) {
  buildBusyboxBase("base:1");
  auto r = dsec({"layer", "build", "base:1", "--on", "base:1", "--run", "echo should-not-run"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("exists"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("should-not-run"), std::string::npos);
}

}  // namespace
}  // namespace dsec::testing

namespace dsec::testing {
namespace {

TEST_F(CliLayer, PushToASharedStoreListsItAndIsIdempotent) {
  TempDir store;
  TempDir src;
  std::ofstream(src.path() + "/hello.txt") << "hello\n";
  ASSERT_EQ(dsec({"layer", "build", "demo:1", "--from-dir", src.path()}).exit_code, 0);
  // No store given: a usage error naming the flag.
  auto none = runDsec({"layer", "push", "demo:1", "--root", root_.path()}, {{"DSEC_STORE", ""}});
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.err.find("--store"), std::string::npos) << none.err;

  auto pushed = dsec({"layer", "push", "demo:1", "--store", store.path()});
  ASSERT_EQ(pushed.exit_code, 0) << pushed.err;
  EXPECT_NE(pushed.out.find("pushed demo:1 to " + store.path()), std::string::npos) << pushed.out;
  EXPECT_TRUE(fs::exists(store.path() + "/layers/demo/1/manifest.json"));
  auto again = dsec({"layer", "push", "demo:1", "--store", store.path()});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.out.find(": 0 of "), std::string::npos) << again.out;  // nothing new

  // Built with --store: built and pushed in one go; the store lists both. (Its own bytes: chunks of its own.)
  std::ofstream(src.path() + "/two.txt") << std::string(300000, 'x');
  ASSERT_EQ(dsec({"layer", "build", "demo:2", "--from-dir", src.path(), "--store", store.path()}).exit_code, 0);
  auto listed = dsec({"layer", "ls", "--store", store.path()});
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_NE(listed.out.find("demo:1"), std::string::npos) << listed.out;
  EXPECT_NE(listed.out.find("demo:2"), std::string::npos) << listed.out;
  EXPECT_NE(listed.out.find("dedup"), std::string::npos) << listed.out;

  // Another image under a pushed name and version is refused.
  std::ofstream(src.path() + "/other.txt") << "other\n";
  ASSERT_EQ(dsec({"layer", "rm", "demo:1"}).exit_code, 0);
  ASSERT_EQ(dsec({"layer", "build", "demo:1", "--from-dir", src.path()}).exit_code, 0);
  auto clash = dsec({"layer", "push", "demo:1", "--store", store.path()});
  EXPECT_NE(clash.exit_code, 0);
  EXPECT_NE(clash.err.find("immutable"), std::string::npos) << clash.err;
  auto missing = dsec({"layer", "push", "nope:1", "--store", store.path()});
  EXPECT_NE(missing.exit_code, 0);

  // Prefetch into this root's chunk cache: nothing without a recording, everything with --all, then nothing new.
  auto unrecorded = dsec({"layer", "prefetch", "demo:2", "--store", store.path()});
  ASSERT_EQ(unrecorded.exit_code, 0) << unrecorded.err;
  EXPECT_NE(unrecorded.out.find("no recording yet"), std::string::npos) << unrecorded.out;
  auto all = dsec({"layer", "prefetch", "demo:2", "--store", store.path(), "--all"});
  ASSERT_EQ(all.exit_code, 0) << all.err;
  EXPECT_EQ(all.out.find("demo:2: 0 chunks fetched"), std::string::npos) << all.out;
  EXPECT_NE(all.out.find("0 failed"), std::string::npos) << all.out;
  EXPECT_TRUE(fs::exists(root_.path() + "/chunk-cache"));
  auto warm = dsec({"layer", "prefetch", "demo:2", "--store", store.path(), "--all"});
  ASSERT_EQ(warm.exit_code, 0) << warm.err;
  EXPECT_NE(warm.out.find("demo:2: 0 chunks fetched"), std::string::npos) << warm.out;

  // Removed from the store, then its chunks collected (demo:1's stay: it still names its own).
  auto rm = dsec({"layer", "rm", "demo:2", "--store", store.path()});
  ASSERT_EQ(rm.exit_code, 0) << rm.err;
  EXPECT_FALSE(fs::exists(store.path() + "/layers/demo/2"));
  EXPECT_TRUE(fs::exists(store.path() + "/layers/demo/1/manifest.json"));
  auto gc = dsec({"layer", "gc", "--store", store.path(), "--grace", "0"});
  ASSERT_EQ(gc.exit_code, 0) << gc.err;
  EXPECT_NE(gc.out.find("removed "), std::string::npos) << gc.out;
  EXPECT_EQ(gc.out.find("removed 0 chunks"), std::string::npos) << gc.out;
  auto again_gc = dsec({"layer", "gc", "--store", store.path(), "--grace", "0"});
  EXPECT_NE(again_gc.out.find("removed 0 chunks"), std::string::npos) << again_gc.out;
}

}  // namespace
}  // namespace dsec::testing
