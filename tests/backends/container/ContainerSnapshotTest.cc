// Container snapshots: the upper (written files, deleted layer files, opaque directories, ownership, modes, links)
// packed as an EROFS layer while the sandbox is frozen, and restored by stacking that layer over the image of a
// new sandbox, as the node does. Attacks on the copy: tests/security/SnapshotAttackTest.cc.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ContainerTestSupport.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {
namespace {

// A snapshot directory and the mount of its layer, removed at the end.
class SnapshotDir {
 public:
  SnapshotDir() {
    char tmpl[] = "/tmp/dsec-ct-snap-XXXXXX";
    base_ = mkdtemp(tmpl);
    dir_ = base_ + "/snap";
    mkdir(dir_.c_str(), 0700);
  }
  ~SnapshotDir() {
    if (mounted_) umount2(mnt().c_str(), MNT_DETACH);
    (void)removeTree(base_);
  }
  const std::string& dir() const { return dir_; }
  std::string mnt() const { return base_ + "/mnt"; }
  // Mounts dir/upper.erofs read-only (as the node mounts a layer); "" or why not.
  std::string mountLayer() {
    mkdir(mnt().c_str(), 0755);
    if (mount((dir_ + "/upper.erofs").c_str(), mnt().c_str(), "erofs", MS_RDONLY, nullptr) != 0) {
      return std::string("mount upper.erofs: ") + strerror(errno);
    }
    mounted_ = true;
    return "";
  }

 private:
  std::string base_, dir_;
  bool mounted_ = false;
};

class ContainerSnapshotTest : public ContainerTest {};

TEST_F(ContainerSnapshotTest, RestoredSandboxSeesWritesDeletionsAndOpaqueDirectories) {
  backends::Sandbox& source = create();
  auto r = sh(source,
              "echo kept > /work/new.txt && chown 1000:1001 /work/new.txt && chmod 0640 /work/new.txt && "
              "mkdir -p /work/d/e && echo deep > /work/d/e/f && ln -s /etc/shadow /work/link && mkfifo /work/fifo && "
              "rm /layer-file && rm -rf /etc && mkdir /etc && echo only > /etc/only");
  ASSERT_EQ(r.exit_code, 0) << r.stderr_data;
  SnapshotDir snap;
  auto kind = source.snapshot(snap.dir());
  ASSERT_TRUE(kind.ok()) << kind.error().toString();
  EXPECT_EQ(*kind, backends::SnapshotKind::kFilesystem);
  EXPECT_EQ(access((snap.dir() + "/upper.erofs").c_str(), F_OK), 0);
  EXPECT_NE(access((snap.dir() + "/.upper-tree").c_str(), F_OK), 0) << "the staged copy is left behind";
  // The source runs on, thawed, and what it writes now is not in the snapshot.
  EXPECT_EQ(source.state(), backends::SandboxState::kRunning);
  ASSERT_EQ(sh(source, "echo later > /work/later.txt").exit_code, 0);

  std::string why = snap.mountLayer();
  ASSERT_TRUE(why.empty()) << why;
  backends::SandboxSpec spec = makeSpec();
  spec.lower_dirs.push_back(snap.mnt());
  backends::Sandbox& restored = create(spec);
  EXPECT_EQ(sh(restored, "cat /work/new.txt").stdout_data, "kept\n");
  EXPECT_EQ(sh(restored, "stat -c %u:%g:%a /work/new.txt").stdout_data, "1000:1001:640\n");
  EXPECT_EQ(sh(restored, "cat /work/d/e/f").stdout_data, "deep\n");
  EXPECT_EQ(sh(restored, "readlink /work/link").stdout_data, "/etc/shadow\n");
  EXPECT_EQ(sh(restored, "test -p /work/fifo && echo fifo").stdout_data, "fifo\n");
  EXPECT_EQ(sh(restored, "test -e /layer-file || echo gone").stdout_data, "gone\n") << "the whiteout was lost";
  EXPECT_EQ(sh(restored, "ls /etc").stdout_data, "only\n") << "the opaque directory let the image's /etc through";
  EXPECT_EQ(sh(restored, "test -e /work/later.txt || echo absent").stdout_data, "absent\n");
  // The restored sandbox writes on its own upper, over the snapshot's layer.
  ASSERT_EQ(sh(restored, "echo changed > /work/new.txt && rm /work/d/e/f").exit_code, 0);
  EXPECT_EQ(sh(restored, "cat /work/new.txt").stdout_data, "changed\n");
  EXPECT_EQ(sh(source, "cat /work/d/e/f").stdout_data, "deep\n");
}

TEST_F(ContainerSnapshotTest, PausedSandboxStaysPausedAndRunningOneIsFrozenOnlyForTheCopy) {
  backends::Sandbox& sb = create();
  ASSERT_EQ(sh(sb, "echo a > /work/a").exit_code, 0);
  ASSERT_TRUE(sb.pause().ok());
  SnapshotDir snap;
  auto kind = sb.snapshot(snap.dir());
  ASSERT_TRUE(kind.ok()) << kind.error().toString();
  EXPECT_EQ(sb.state(), backends::SandboxState::kPaused);
  ASSERT_TRUE(sb.resume().ok());
  EXPECT_EQ(sh(sb, "cat /work/a").stdout_data, "a\n");
}

TEST_F(ContainerSnapshotTest, ReadOnlyRootHasNothingToSnapshot) {
  backends::SandboxSpec spec = makeSpec();
  spec.read_only_root = true;
  backends::Sandbox& sb = create(spec);
  SnapshotDir snap;
  auto kind = sb.snapshot(snap.dir());
  ASSERT_FALSE(kind.ok());
  EXPECT_EQ(kind.error().code(), ErrorCode::kUnsupported);
}

TEST_F(ContainerSnapshotTest, DestroyedSandboxIsNotFound) {
  backends::Sandbox& sb = create();
  ASSERT_TRUE(sb.destroy().ok());
  SnapshotDir snap;
  auto kind = sb.snapshot(snap.dir());
  ASSERT_FALSE(kind.ok());
  EXPECT_EQ(kind.error().code(), ErrorCode::kNotFound);
}

}  // namespace
}  // namespace dsec::testing
