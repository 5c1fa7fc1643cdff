// --dsec-mount sources are opened with the job user's credentials (spank/src/MountSource.h): an unprivileged user
// (nobody here) tries to reach what it must not — another user's 0700 directory, a readable directory below
// one, the same through symlinks it planted, /proc magic links and /proc itself. Each attempt must be refused;
// what the user may read must still open.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "MountSource.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::spank {
namespace {

constexpr uid_t kNobody = 65534;
constexpr gid_t kNogroup = 65534;
constexpr gid_t kFriends = 64999;  // a group no user of the machine has: only the credentials grant it

JobCredentials nobody(std::vector<gid_t> groups = {}) { return {kNobody, kNogroup, std::move(groups)}; }

class MountSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DSEC_SKIP_UNLESS_ROOT();
    root_ = dir_.path();
    ASSERT_EQ(chmod(root_.c_str(), 0755), 0);
    // Root's: a 0700 directory, and a world-readable directory below another 0700 one.
    makeDir("secret", 0700, 0, 0);
    writeFile("secret/file", "topsecret");
    makeDir("private", 0700, 0, 0);
    makeDir("private/pub", 0755, 0, 0);
    writeFile("private/pub/file", "topsecret");
    // A group's: readable by members of kFriends only.
    makeDir("club", 0750, 0, kFriends);
    // nobody's own, with the links it planted.
    makeDir("mine", 0755, kNobody, kNogroup);
    writeFile("mine/file", "mine");
    plantLink("/proc/self/root" + root_ + "/mine", "mine/to-proc-self-root");
    plantLink(root_ + "/secret", "mine/to-secret");
    plantLink(root_ + "/private/pub", "mine/to-pub");
    plantLink(root_ + "/mine/file", "mine/to-own-file");
  }

  void makeDir(const std::string& rel, mode_t mode, uid_t uid, gid_t gid) {
    std::string p = root_ + "/" + rel;
    ASSERT_EQ(mkdir(p.c_str(), mode), 0) << p;
    ASSERT_EQ(chown(p.c_str(), uid, gid), 0) << p;
    ASSERT_EQ(chmod(p.c_str(), mode), 0) << p;
  }
  void writeFile(const std::string& rel, const std::string& text) {
    std::ofstream(root_ + "/" + rel) << text;
    ASSERT_EQ(chmod((root_ + "/" + rel).c_str(), 0644), 0);
  }
  void plantLink(const std::string& to, const std::string& rel) {
    std::string p = root_ + "/" + rel;
    ASSERT_EQ(symlink(to.c_str(), p.c_str()), 0) << p;
    ASSERT_EQ(lchown(p.c_str(), kNobody, kNogroup), 0) << p;
  }
  // The opened descriptor is the inode `rel` names (seen as root).
  void expectSameInode(const UniqueFd& fd, const std::string& rel) {
    struct stat got {
    }, want{};
    ASSERT_EQ(fstat(fd.get(), &got), 0);
    ASSERT_EQ(stat((root_ + "/" + rel).c_str(), &want), 0);
    EXPECT_EQ(got.st_dev, want.st_dev);
    EXPECT_EQ(got.st_ino, want.st_ino);
  }
  static void expectRefused(const Result<UniqueFd>& r, const std::string& needle) {
    ASSERT_FALSE(r.ok()) << "the lookup succeeded";
    EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument) << r.error().toString();
    EXPECT_NE(r.error().message().find(needle), std::string::npos) << r.error().message();
  }

  testing::TempDir dir_;
  std::string root_;
};

TEST_F(MountSourceTest, UserOpensWhatItMayRead) {
  auto dir = openMountSourceAs(root_ + "/mine", nobody());
  ASSERT_OK(dir);
  expectSameInode(*dir, "mine");
  EXPECT_EQ(fcntl(dir->get(), F_GETFL) & O_PATH, O_PATH);
  EXPECT_NE(fcntl(dir->get(), F_GETFD) & FD_CLOEXEC, 0);
  auto file = openMountSourceAs(root_ + "/mine/file", nobody());
  ASSERT_OK(file);
  expectSameInode(*file, "mine/file");
  auto through_link = openMountSourceAs(root_ + "/mine/to-own-file", nobody());
  ASSERT_OK(through_link);
  expectSameInode(*through_link, "mine/file");
}

TEST_F(MountSourceTest, AnotherUsersPrivateDirectoryIsRefused) {
  expectRefused(openMountSourceAs(root_ + "/secret", nobody()), "permission denied for uid 65534");
  expectRefused(openMountSourceAs(root_ + "/secret/file", nobody()), "permission denied for uid 65534");
}

TEST_F(MountSourceTest, ReadableDirectoryBelowAPrivateOneIsRefused) {
  expectRefused(openMountSourceAs(root_ + "/private/pub", nobody()), "cannot reach it");
  expectRefused(openMountSourceAs(root_ + "/private/pub/file", nobody()), "permission denied for uid 65534");
}

TEST_F(MountSourceTest, PlantedSymlinksReachNoFurtherThanTheUser) {
  expectRefused(openMountSourceAs(root_ + "/mine/to-secret", nobody()), "permission denied for uid 65534");
  expectRefused(openMountSourceAs(root_ + "/mine/to-pub", nobody()), "permission denied for uid 65534");
}

TEST_F(MountSourceTest, SupplementaryGroupsCount) {
  expectRefused(openMountSourceAs(root_ + "/club", nobody()), "permission denied for uid 65534");
  auto member = openMountSourceAs(root_ + "/club", nobody({kFriends}));
  ASSERT_OK(member);
  expectSameInode(*member, "club");
  // The primary group counts too.
  ASSERT_OK(openMountSourceAs(root_ + "/club", JobCredentials{kNobody, kFriends, {}}));
}

TEST_F(MountSourceTest, ProcMagicLinksAreRefusedForEveryone) {
  JobCredentials root{0, 0, {0}};
  for (const auto& creds : {nobody(), root}) {
    SCOPED_TRACE("uid " + std::to_string(creds.uid));
    expectRefused(openMountSourceAs("/proc/self/root" + root_ + "/mine", creds), "magic link");
    expectRefused(openMountSourceAs(root_ + "/mine/to-proc-self-root", creds), "magic link");
    expectRefused(openMountSourceAs("/proc/self/cwd", creds), "magic link");
    expectRefused(openMountSourceAs("/proc/self/fd/0", creds), "magic link");
  }
  // Another process's root (this test's, a root process).
  const std::string other_root = "/proc/" + std::to_string(getpid()) + "/root/etc";
  expectRefused(openMountSourceAs(other_root, root), "magic link");
  // nobody may not even look at a root process's root: refused before the link is reached.
  expectRefused(openMountSourceAs(other_root, nobody()), "permission denied for uid 65534");
}

TEST_F(MountSourceTest, ProcItselfIsRefused) {
  expectRefused(openMountSourceAs("/proc/1", nobody()), "is in /proc");
  expectRefused(openMountSourceAs("/proc", JobCredentials{0, 0, {0}}), "is in /proc");
}

TEST_F(MountSourceTest, MissingSourceIsNotFound) {
  auto r = openMountSourceAs(root_ + "/mine/nope", nobody());
  ASSERT_ERROR(r, ErrorCode::kNotFound);
  EXPECT_NE(r.error().message().find(root_ + "/mine/nope"), std::string::npos);
}

}  // namespace
}  // namespace dsec::spank
