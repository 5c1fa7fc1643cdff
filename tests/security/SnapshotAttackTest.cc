// A container snapshot copies an upper the sandbox's root wrote (backends/container/src/UpperCopy.h). Hostile
// uppers: symlinks to host files and directories (copied as links, never followed: the host file's content is not
// in the layer and the host file is unchanged), a file over the byte limit, more entries than the entry limit, a
// device node, overlay xattrs that would steer a stack (only
// the opaque mark survives), fifos (never opened). A refusal is a clean error naming the cause; the snapshot dir is
// left empty, and the sandbox runs on. Entries the sandbox itself cannot make (device nodes, overlay xattrs: it has
// no CAP_MKNOD, and overlay refuses them) are planted in its upper from the host, as a kernel bug would let it. (An
// owner outside the sandbox's ids, which the copy also refuses, cannot exist in its tmpfs, which maps only those.)
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "../backends/container/ContainerTestSupport.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {
namespace {

constexpr int kUpperFd = 6;  // where init keeps its upper (backends/container/src/InitProtocol.h)

class SnapshotAttackTest : public ContainerTest {
 protected:
  SnapshotAttackTest() {
    snapshot_max_bytes_ = 8 << 20;
    snapshot_max_entries_ = 500;
  }
  void SetUp() override {
    ContainerTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    char tmpl[] = "/tmp/dsec-snap-attack-XXXXXX";
    base_ = mkdtemp(tmpl);
    dir_ = base_ + "/snap";
    ASSERT_EQ(mkdir(dir_.c_str(), 0700), 0);
  }
  void TearDown() override {
    if (mounted_) umount2((base_ + "/mnt").c_str(), MNT_DETACH);
    if (!base_.empty()) (void)removeTree(base_);
    ContainerTest::TearDown();
  }
  // The upper of a running sandbox, as the host reaches it (a copy of init's fd).
  static UniqueFd upperOf(backends::Sandbox& sb) {
    pid_t pid = sb.persistentState().at("init_pid").get<pid_t>();
    auto pidfd = pidfdOpen(pid);
    if (!pidfd.ok()) return UniqueFd();
    return UniqueFd(static_cast<int>(syscall(SYS_pidfd_getfd, pidfd->get(), kUpperFd, 0)));
  }
  std::vector<std::string> dirEntries() const {
    auto r = runCommand({"ls", "-A", dir_});
    std::vector<std::string> names;
    if (!r.ok()) return {"<ls failed>"};
    for (auto& n : split(trim(r->output), '\n'))
      if (!n.empty()) names.push_back(n);
    return names;
  }
  void expectRefusedCleanly(backends::Sandbox& sb, const std::string& why) {
    auto kind = sb.snapshot(dir_);
    ASSERT_FALSE(kind.ok()) << "the snapshot was taken";
    EXPECT_EQ(kind.error().code(), ErrorCode::kInvalidArgument) << kind.error().toString();
    EXPECT_NE(kind.error().message().find(why), std::string::npos) << kind.error().toString();
    EXPECT_TRUE(dirEntries().empty()) << "left behind: " << dirEntries()[0];
    EXPECT_EQ(sb.state(), backends::SandboxState::kRunning);
    EXPECT_EQ(sh(sb, "echo alive").stdout_data, "alive\n") << "the sandbox stayed frozen";
  }
  std::string mountSnapshot() {
    std::string mnt = base_ + "/mnt";
    mkdir(mnt.c_str(), 0755);
    if (mount((dir_ + "/upper.erofs").c_str(), mnt.c_str(), "erofs", MS_RDONLY, nullptr) != 0) return "";
    mounted_ = true;
    return mnt;
  }
  std::string base_, dir_;
  bool mounted_ = false;
};

TEST_F(SnapshotAttackTest, SymlinksToHostFilesAreCopiedAsLinksNeverFollowed) {
  const std::string secret = "host-secret-" + randomHex(24);
  const std::string host_file = base_ + "/secret";
  ASSERT_TRUE(writeFile(host_file, secret).ok());
  backends::Sandbox& sb = create();
  ASSERT_EQ(sh(sb, "ln -s " + host_file + " /work/file-link && ln -s " + base_ + " /work/dir-link && ln -s / /root/up")
                .exit_code,
            0);
  auto kind = sb.snapshot(dir_);
  ASSERT_TRUE(kind.ok()) << kind.error().toString();
  auto image = readFile(dir_ + "/upper.erofs");
  ASSERT_TRUE(image.ok());
  EXPECT_EQ(image->find(secret), std::string::npos) << "the host file's content is in the snapshot";
  EXPECT_EQ(*readFile(host_file), secret);
  std::string mnt = mountSnapshot();
  ASSERT_FALSE(mnt.empty()) << strerror(errno);
  struct stat st {};
  ASSERT_EQ(lstat((mnt + "/work/file-link").c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  ASSERT_EQ(lstat((mnt + "/work/dir-link").c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
}

TEST_F(SnapshotAttackTest, FileOverTheByteLimitIsRefused) {
  backends::Sandbox& sb = create();
  ASSERT_EQ(sh(sb, "dd if=/dev/zero of=/work/huge bs=1M count=12 2>/dev/null").exit_code, 0);
  expectRefusedCleanly(sb, "bytes");
}

TEST_F(SnapshotAttackTest, MoreEntriesThanTheLimitAreRefused) {
  backends::Sandbox& sb = create();
  ASSERT_EQ(sh(sb, "mkdir /work/many && cd /work/many && seq 1 800 | xargs touch").exit_code, 0);
  expectRefusedCleanly(sb, "files");
}

// The kernel refuses device nodes on the tmpfs upper of a sandbox with a user namespace, even to host root; a
// sandbox whose upper is a host directory (layer builds: SandboxSpec::upper_dir) is where one can appear.
TEST_F(SnapshotAttackTest, DeviceNodeIsRefused) {
  backends::SandboxSpec spec = makeSpec();
  spec.upper_dir = base_ + "/host-upper";
  ASSERT_EQ(mkdir(spec.upper_dir.c_str(), 0700), 0);
  backends::Sandbox& sb = create(spec);
  ASSERT_EQ(sh(sb, "echo x > /work/file").exit_code, 0);
  const std::string upper = spec.upper_dir + "/upper";
  ASSERT_EQ(mknod((upper + "/disk").c_str(), S_IFBLK | 0600, makedev(8, 0)), 0) << strerror(errno);
  expectRefusedCleanly(sb, "device node");
  ASSERT_EQ(unlink((upper + "/disk").c_str()), 0);
  ASSERT_EQ(mknod((upper + "/work/mem").c_str(), S_IFCHR | 0600, makedev(1, 1)), 0) << strerror(errno);
  expectRefusedCleanly(sb, "device node");
  ASSERT_EQ(unlink((upper + "/work/mem").c_str()), 0);
  auto kind = sb.snapshot(dir_);  // without them it is taken
  ASSERT_TRUE(kind.ok()) << kind.error().toString();
}

TEST_F(SnapshotAttackTest, OnlyTheOpaqueMarkOfTheOverlayXattrsSurvives) {
  backends::Sandbox& sb = create();
  ASSERT_EQ(sh(sb, "mkdir -p /work/a /work/b && rm -rf /etc && mkdir /etc && mkfifo /work/pipe").exit_code, 0);
  UniqueFd upper = upperOf(sb);
  ASSERT_TRUE(upper);
  UniqueFd work(openat(upper.get(), "work", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(work);
  UniqueFd a(openat(work.get(), "a", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  UniqueFd b(openat(work.get(), "b", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(a && b);
  ASSERT_EQ(fsetxattr(a.get(), "user.overlay.redirect", "/etc", 4, 0), 0) << strerror(errno);
  ASSERT_EQ(fsetxattr(a.get(), "user.overlay.metacopy", "", 0, 0), 0);
  ASSERT_EQ(fsetxattr(a.get(), "user.note", "kept", 4, 0), 0);
  ASSERT_EQ(fsetxattr(b.get(), "user.overlay.opaque", "x", 1, 0), 0);
  auto kind = sb.snapshot(dir_);  // the fifo is never opened: this returns
  ASSERT_TRUE(kind.ok()) << kind.error().toString();
  std::string mnt = mountSnapshot();
  ASSERT_FALSE(mnt.empty()) << strerror(errno);
  char value[16];
  EXPECT_LT(lgetxattr((mnt + "/work/a").c_str(), "user.overlay.redirect", value, sizeof value), 0);
  EXPECT_LT(lgetxattr((mnt + "/work/a").c_str(), "user.overlay.metacopy", value, sizeof value), 0);
  EXPECT_EQ(lgetxattr((mnt + "/work/a").c_str(), "user.note", value, sizeof value), 4);
  EXPECT_LT(lgetxattr((mnt + "/work/b").c_str(), "user.overlay.opaque", value, sizeof value), 0);
  ASSERT_EQ(lgetxattr((mnt + "/etc").c_str(), "user.overlay.opaque", value, sizeof value), 1) << "opaque mark lost";
  EXPECT_EQ(value[0], 'y');
  struct stat st {};
  ASSERT_EQ(lstat((mnt + "/work/pipe").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

}  // namespace
}  // namespace dsec::testing
