// --dsec-mount binds into a step sandbox (spank/src/BindMounts.h), against a stand-in sandbox: a child process
// in its own mount namespace whose "root" is a tmpfs. Checked: every bind is nosuid and nodev (read-only with
// :ro) and private; a user's source is opened as the user; and root, which creates missing targets, creates
// nothing inside another bind (where it would write into a host directory the user named but may not write),
// not even when a symlink on the sandbox's root leads there. The same walk (SandboxPath.h) makes the job's
// working directory in a sandbox, and is checked on its own at the end.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "BindMounts.h"
#include "SandboxPath.h"
#include "dsec/common/Strings.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::spank {
namespace {

constexpr uid_t kNobody = 65534;
constexpr gid_t kNogroup = 65534;
const JobCredentials kUser{kNobody, kNogroup, {}};

// A process parked in a new mount namespace with a tmpfs mounted on <dir>/root: what bindIntoSandbox needs of
// a sandbox (a pidfd to setns through and the root to chroot to).
class StandInSandbox {
 public:
  explicit StandInSandbox(const std::string& dir) : root_(dir + "/root") {
    mkdir(root_.c_str(), 0755);
    int ready[2];
    if (pipe(ready) < 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      close(ready[0]);
      if (unshare(CLONE_NEWNS) < 0 || mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) < 0 ||
          mount("tmpfs", root_.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755") < 0) {
        _exit(1);
      }
      if (write(ready[1], "x", 1) != 1) _exit(1);
      for (;;) pause();
    }
    close(ready[1]);
    char c;
    bool ok = pid_ > 0 && read(ready[0], &c, 1) == 1;
    close(ready[0]);
    if (!ok) return;
    pidfd_.reset(static_cast<int>(syscall(SYS_pidfd_open, pid_, 0)));
    root_fd_.reset(open(inside(root_).c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  }
  ~StandInSandbox() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  bool ok() const { return pidfd_.valid() && root_fd_.valid(); }
  // A path of the stand-in's mount namespace, reachable from ours.
  std::string inside(const std::string& path) const { return "/proc/" + std::to_string(pid_) + "/root" + path; }
  // Mount options by mount point relative to the sandbox root ("/data", ...).
  std::map<std::string, std::string> mountOptions() const {
    std::map<std::string, std::string> out;
    std::ifstream in("/proc/" + std::to_string(pid_) + "/mountinfo");
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string id, parent, dev, root, point, options;
      fields >> id >> parent >> dev >> root >> point >> options;
      if (startsWith(point, root_ + "/")) out[point.substr(root_.size())] = options + " " + line;
    }
    return out;
  }
  Status bind(const std::vector<BindRequest>& mounts) const {
    return bindIntoSandbox(pidfd_.get(), root_fd_.get(), mounts, kUser);
  }

 private:
  std::string root_;
  pid_t pid_ = -1;
  UniqueFd pidfd_;
  UniqueFd root_fd_;
};

bool hasOption(const std::string& options, const std::string& option) {
  std::string opts = options.substr(0, options.find(' '));
  return ("," + opts + ",").find("," + option + ",") != std::string::npos;
}

class BindMountsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DSEC_SKIP_UNLESS_ROOT();
    host_ = dir_.path();
    ASSERT_EQ(chmod(host_.c_str(), 0755), 0);
    makeDir("mine", kNobody);
    makeDir("mine/sub", kNobody);
    std::ofstream(host_ + "/mine/file") << "mine";
    ASSERT_EQ(chown((host_ + "/mine/file").c_str(), kNobody, kNogroup), 0);
    makeDir("rootdir", 0);  // root's, readable by all, writable by root only
    makeDir("rootonly", 0);
    ASSERT_EQ(chmod((host_ + "/rootonly").c_str(), 0700), 0);
    sandbox_ = std::make_unique<StandInSandbox>(host_);
    ASSERT_TRUE(sandbox_->ok()) << "cannot start the stand-in sandbox";
  }
  void makeDir(const std::string& rel, uid_t owner) {
    std::string p = host_ + "/" + rel;
    ASSERT_EQ(mkdir(p.c_str(), 0755), 0) << p;
    ASSERT_EQ(chown(p.c_str(), owner, owner == 0 ? 0 : kNogroup), 0) << p;
  }
  BindRequest user(const std::string& rel, const std::string& target, bool read_only = false) {
    return {{host_ + "/" + rel, target, read_only}, true};
  }
  bool onHost(const std::string& rel) {
    struct stat st {};
    return lstat((host_ + "/" + rel).c_str(), &st) == 0;
  }

  testing::TempDir dir_;
  std::string host_;
  std::unique_ptr<StandInSandbox> sandbox_;
};

TEST_F(BindMountsTest, EveryBindIsNosuidNodevAndPrivate) {
  ASSERT_OK(sandbox_->bind({user("mine", "/data/rw"), user("mine/sub", "/data/ro", true), user("mine/file", "/f")}));
  auto mounts = sandbox_->mountOptions();
  for (const char* target : {"/data/rw", "/data/ro", "/f"}) {
    SCOPED_TRACE(target);
    ASSERT_TRUE(mounts.count(target)) << "no mount at " << target;
    const std::string& m = mounts[target];
    EXPECT_TRUE(hasOption(m, "nosuid")) << m;
    EXPECT_TRUE(hasOption(m, "nodev")) << m;
    EXPECT_EQ(m.find(" shared:"), std::string::npos) << "a bind propagates mounts: " << m;
  }
  EXPECT_TRUE(hasOption(mounts["/data/ro"], "ro")) << mounts["/data/ro"];
  EXPECT_TRUE(hasOption(mounts["/data/rw"], "rw")) << mounts["/data/rw"];
  std::ifstream f(sandbox_->inside(host_ + "/root/f"));
  std::string text;
  std::getline(f, text);
  EXPECT_EQ(text, "mine");
}

TEST_F(BindMountsTest, UserSourcesAreOpenedAsTheUser) {
  auto s = sandbox_->bind({user("rootonly", "/x")});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message().find("permission denied for uid 65534"), std::string::npos) << s.error().message();
  EXPECT_NE(s.error().message().find(host_ + "/rootonly:/x"), std::string::npos) << s.error().message();
  EXPECT_FALSE(sandbox_->mountOptions().count("/x"));
  // The plugin's own paths (the batch script's directory) are opened as root.
  ASSERT_OK(sandbox_->bind({{{host_ + "/rootonly", "/spool", true}, false}}));
  EXPECT_TRUE(hasOption(sandbox_->mountOptions()["/spool"], "nosuid"));
}

TEST_F(BindMountsTest, NothingIsCreatedInsideAnotherBind) {
  auto s = sandbox_->bind({user("rootdir", "/a"), user("mine", "/a/newdir")});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message().find("inside another mount"), std::string::npos) << s.error().message();
  EXPECT_NE(s.error().message().find("(at /a/newdir)"), std::string::npos) << s.error().message();
  EXPECT_FALSE(onHost("rootdir/newdir")) << "root created a directory in a host directory through a bind";

  s = sandbox_->bind({user("rootdir", "/b"), user("mine/file", "/b/newfile")});
  ASSERT_FALSE(s.ok());
  EXPECT_FALSE(onHost("rootdir/newfile")) << "root created a file in a host directory through a bind";

  s = sandbox_->bind({user("rootdir", "/c"), user("mine", "/c/deeper/newdir")});
  ASSERT_FALSE(s.ok());
  EXPECT_FALSE(onHost("rootdir/deeper"));
}

TEST_F(BindMountsTest, SymlinkOnTheRootLeadsNowhereNew) {
  // /link on the sandbox root points into a bind of a root-owned host directory.
  ASSERT_EQ(symlink("/a", sandbox_->inside(host_ + "/root/link").c_str()), 0);
  auto s = sandbox_->bind({user("rootdir", "/a"), user("mine", "/link/newdir")});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message().find("inside another mount"), std::string::npos) << s.error().message();
  EXPECT_FALSE(onHost("rootdir/newdir")) << "root created a directory in a host directory through a symlink";
}

TEST_F(BindMountsTest, NestedBindOntoAnExistingDirectory) {
  ASSERT_OK(sandbox_->bind({user("mine", "/a"), user("rootdir", "/a/sub", true)}));
  auto mounts = sandbox_->mountOptions();
  ASSERT_TRUE(mounts.count("/a/sub"));
  EXPECT_TRUE(hasOption(mounts["/a/sub"], "nosuid"));
}

// The walk itself, from the stand-in's root (no chroot here: paths without symlinks).
TEST_F(BindMountsTest, WalkCreatesOnTheRootMountOnly) {
  ASSERT_OK(sandbox_->bind({user("rootdir", "/a")}));
  UniqueFd root(open(sandbox_->inside(host_ + "/root").c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(root.valid());
  uint64_t root_mount = 0;
  ASSERT_TRUE(mountIdOf(root.get(), &root_mount));

  SandboxPathResult made = openOrCreateInSandbox(root.get(), root_mount, "//new/./dir/", true);
  ASSERT_GE(made.fd, 0) << sandboxPathStepName(made.step) << ": " << strerror(made.err);
  close(made.fd);
  struct stat st {};
  EXPECT_EQ(stat(sandbox_->inside(host_ + "/root/new/dir").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  made = openOrCreateInSandbox(root.get(), root_mount, "/new/file", false);
  ASSERT_GE(made.fd, 0) << sandboxPathStepName(made.step);
  close(made.fd);
  EXPECT_EQ(stat(sandbox_->inside(host_ + "/root/new/file").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  // Existing paths inside a bind open; missing ones are not made there.
  made = openOrCreateInSandbox(root.get(), root_mount, "/a", true);
  ASSERT_GE(made.fd, 0);
  close(made.fd);
  made = openOrCreateInSandbox(root.get(), root_mount, "/a/x/y", true);
  EXPECT_LT(made.fd, 0);
  EXPECT_EQ(made.step, SandboxPathStep::kOutsideRoot);
  EXPECT_EQ(made.component, 1);
  EXPECT_FALSE(onHost("rootdir/x"));
  made = openOrCreateInSandbox(root.get(), root_mount, "/new/../a/z", true);
  EXPECT_LT(made.fd, 0);
  EXPECT_EQ(made.step, SandboxPathStep::kBadPath);
  made = openOrCreateInSandbox(root.get(), root_mount, ("/" + std::string(300, 'n')).c_str(), true);
  EXPECT_EQ(made.step, SandboxPathStep::kBadPath);
  EXPECT_EQ(made.err, ENAMETOOLONG);
}

}  // namespace
}  // namespace dsec::spank
