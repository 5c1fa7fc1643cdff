// Another user on the node plants or swaps the files a fleet trusts: the gateway's config (where it listens, which
// token file it reads), the fleet token (whoever knows it drives every sandbox), a node's state directory (its
// token and the sandboxes' records). Each attack must be refused; a file that is really the user's own is read,
// so a refusal of everything would fail too.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "dsec/common/Strings.h"
#include "dsec/launcher/fleet/GatewayProcess.h"
#include "dsec/launcher/node/StateStore.h"
#include "dsec/testing/TestSupport.h"

namespace dsec {
namespace {

constexpr uid_t kOtherUid = 65534;

void skipUnlessRoot() {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: the attacks chown files to another uid";
}

std::string writeConfig(const std::string& dir, const std::string& token_file) {
  launcher::fleet::GatewayProcessConfig config;
  config.fleet_name = "f";
  config.token_file = token_file;
  config.address = "127.0.0.1";
  std::string path = dir + "/gateway-config.json";
  EXPECT_TRUE(launcher::fleet::writeGatewayConfig(path, config).ok());
  return path;
}

TEST(PrivateFiles, TheUsersOwnConfigIsRead) {
  dsec::testing::TempDir dir;
  auto config = launcher::fleet::readGatewayConfig(writeConfig(dir.path(), "/t"));
  ASSERT_OK(config);
  EXPECT_EQ(config->token_file, "/t");
}

TEST(PrivateFiles, ASymbolicLinkInPlaceOfTheConfigIsRefused) {
  dsec::testing::TempDir dir;
  std::string real = writeConfig(dir.path(), "/t");
  std::string link = dir.path() + "/planted.json";
  ASSERT_EQ(::symlink(real.c_str(), link.c_str()), 0);
  auto read = launcher::fleet::readGatewayConfig(link);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.error().code(), ErrorCode::kConflict) << read.error().message();
}

TEST(PrivateFiles, AConfigOfAnotherUserIsRefused) {
  skipUnlessRoot();
  dsec::testing::TempDir dir;
  std::string path = writeConfig(dir.path(), "/t");
  ASSERT_EQ(::chown(path.c_str(), kOtherUid, kOtherUid), 0);
  auto read = launcher::fleet::readGatewayConfig(path);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.error().code(), ErrorCode::kConflict) << read.error().message();
}

TEST(PrivateFiles, AFileInADirectoryOthersCanWriteIsRefused) {
  dsec::testing::TempDir dir;
  std::string shared = dir.path() + "/shared";
  ASSERT_OK(makeDirs(shared, 0700));
  ASSERT_EQ(::chmod(shared.c_str(), 0777), 0);  // anyone could swap the file between write and read
  auto read = launcher::fleet::readGatewayConfig(writeConfig(shared, "/t"));
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.error().code(), ErrorCode::kConflict) << read.error().message();
  // Sticky, as /tmp is: others cannot rename or remove the user's file, so it is read.
  ASSERT_EQ(::chmod(shared.c_str(), 01777), 0);
  EXPECT_OK(launcher::fleet::readGatewayConfig(shared + "/gateway-config.json"));
}

// The gateway must not serve with a token others could read (or have written): it exits instead. If it served,
// it would still run when the wait ends.
TEST(PrivateFiles, TheGatewayRefusesAReadableToken) {
  dsec::testing::TempDir dir;
  std::string token = dir.path() + "/token";
  ASSERT_OK(writeFileAtomic(token, "planted-token", 0644));
  auto config = launcher::fleet::readGatewayConfig(writeConfig(dir.path(), token));
  ASSERT_OK(config);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) ::_exit(launcher::fleet::runGatewayProcess(*config));
  int status = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      FAIL() << "the gateway served with a token file of mode 0644";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
}

TEST(PrivateFiles, AStateDirectoryOfAnotherUserIsRefused) {
  skipUnlessRoot();
  dsec::testing::TempDir dir;
  std::string state = dir.path() + "/state";
  ASSERT_OK(makeDirs(state, 0755));
  ASSERT_EQ(::chown(state.c_str(), kOtherUid, kOtherUid), 0);
  launcher::FileStateStore store(state);
  auto prepared = store.prepare();
  ASSERT_FALSE(prepared.ok());
  EXPECT_NE(prepared.error().message().find("belongs to uid"), std::string::npos) << prepared.error().message();
}

TEST(PrivateFiles, AStateDirectoryThatIsASymbolicLinkIsRefused) {
  dsec::testing::TempDir dir;
  std::string elsewhere = dir.path() + "/elsewhere";
  ASSERT_OK(makeDirs(elsewhere, 0700));
  std::string state = dir.path() + "/state";
  ASSERT_EQ(::symlink(elsewhere.c_str(), state.c_str()), 0);
  auto made = makePrivateDir(state);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.error().code(), ErrorCode::kConflict) << made.error().message();
}

TEST(PrivateFiles, TheUsersOwnLooseDirectoryIsClosed) {
  dsec::testing::TempDir dir;
  std::string state = dir.path() + "/state";
  ASSERT_OK(makeDirs(state, 0700));
  ASSERT_EQ(::chmod(state.c_str(), 0755), 0);
  ASSERT_OK(makePrivateDir(state));
  struct stat st {};
  ASSERT_EQ(::stat(state.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

// The attacker owns a loose directory holding a 0600 file of the user's (say, one the user copied there) and keeps
// swapping it with the user's private directory under the path the user reads. A reader that opened the file and
// then checked the parent by path could read the loose copy and pass the check on the private one. Whatever the
// timing, what is read must be the private copy or a refusal.
TEST(PrivateFiles, SwappingTheDirectoryDuringTheReadNeverPassesTheLooseCopy) {
  dsec::testing::TempDir dir;
  std::string current = dir.path() + "/current";
  std::string other = dir.path() + "/other";
  ASSERT_OK(makeDirs(current, 0700));
  ASSERT_OK(makeDirs(other, 0700));
  ASSERT_EQ(::chmod(other.c_str(), 0777), 0);
  ASSERT_OK(writeFileAtomic(current + "/token", "private", 0600));
  ASSERT_OK(writeFileAtomic(other + "/token", "planted", 0600));

  std::atomic<bool> stop{false};
  std::atomic<long> swaps{0};
  std::thread swapper([&] {
    while (!stop.load()) {
      if (::renameat2(AT_FDCWD, current.c_str(), AT_FDCWD, other.c_str(), RENAME_EXCHANGE) == 0) ++swaps;
    }
  });
  int read_private = 0;
  int refused = 0;
  int planted = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (std::chrono::steady_clock::now() < deadline) {
    auto read = readPrivateFile(current + "/token");
    if (!read.ok()) {
      ++refused;
    } else if (*read == "private") {
      ++read_private;
    } else {
      ++planted;
    }
  }
  stop = true;
  swapper.join();
  EXPECT_EQ(planted, 0) << "the loose copy was read " << planted << " times";
  EXPECT_GT(swaps.load(), 0);
  EXPECT_GT(read_private, 0) << "refused " << refused << " reads and read none";
}

}  // namespace
}  // namespace dsec
