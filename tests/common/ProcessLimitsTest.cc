// The agent's own limits (common/ProcessLimits.h): raised where it may, a create refused naming the limit where it
// may not.
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <functional>

#include "dsec/common/ProcessLimits.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::testing {
namespace {

bool hasCapSysResource() {
  __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (syscall(SYS_capget, &hdr, data) != 0) return false;
  return (data[CAP_SYS_RESOURCE / 32].effective & (1U << (CAP_SYS_RESOURCE % 32))) != 0;
}

// Runs body in a child (limits lowered there stay there); its exit code, 0 when every check held.
int inChild(const std::function<int()>& body) {
  pid_t pid = fork();
  if (pid == 0) _exit(body());
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100;
}

TEST(ProcessLimits, TheSoftFileLimitComesUpAndTheOriginalIsKeptForSandboxes) {
  // A hard limit below fs.nr_open, as a service manager or login shell sets one: soft 64, hard 512.
  int code = inChild([] {
    rlimit low{64, 512};
    if (setrlimit(RLIMIT_NOFILE, &low) != 0) return 1;
    RaisedLimits raised = raiseProcessLimits();
    rlimit now{};
    getrlimit(RLIMIT_NOFILE, &now);
    if (raised.nofile_before.rlim_cur != 64 || now.rlim_cur != now.rlim_max) return 2;
    // With CAP_SYS_RESOURCE the hard limit goes up to fs.nr_open; without, it stays and a note says why.
    if (hasCapSysResource()) {
      if (static_cast<int64_t>(now.rlim_max) != raised.nr_open) return 3;
    } else {
      if (now.rlim_max != 512) return 4;
      bool noted = false;
      for (const auto& n : raised.notes) noted = noted || n.find("hard limit stays at 512") != std::string::npos;
      if (!noted) return 5;
    }
    auto original = originalFileLimit();
    if (!original || original->rlim_cur != 64 || original->rlim_max != 512) return 6;
    // Raising again changes nothing and keeps the original.
    raiseProcessLimits();
    original = originalFileLimit();
    return original && original->rlim_cur == 64 ? 0 : 7;
  });
  EXPECT_EQ(code, 0) << "check " << code << " failed";
}

TEST(ProcessLimits, ACreateWithoutRoomForItsFdIsRefusedNamingTheLimit) {
  SandboxRoom room(1, 4096, 512);
  EXPECT_OK(room.checkFiles(99, 4196));  // 100 sandboxes at one fd each + 4096 kept = 4196
  auto refused = room.checkFiles(100, 4196);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(refused.error().message().find("RLIMIT_NOFILE 4196"), std::string::npos) << refused.error().message();
  EXPECT_NE(refused.error().message().find("100 sandboxes"), std::string::npos) << refused.error().message();
  EXPECT_OK(room.checkFiles(1000000, RLIM_INFINITY));
}

TEST(ProcessLimits, ACreateWithoutRoomForItsProcessesIsRefusedNamingTheSysctl) {
  SandboxRoom room(1, 4096, 512);
  EXPECT_OK(room.checkPids({32768, 192725, 32000}));
  auto pids = room.checkPids({32768, 192725, 32300});
  ASSERT_FALSE(pids.ok());
  EXPECT_NE(pids.error().message().find("kernel.pid_max is 32768"), std::string::npos) << pids.error().message();
  auto threads = room.checkPids({4194304, 20000, 19600});
  ASSERT_FALSE(threads.ok());
  EXPECT_NE(threads.error().message().find("kernel.threads-max is 20000"), std::string::npos)
      << threads.error().message();
}

TEST(ProcessLimits, TheHostsPidRoomIsRead) {
  auto room = readPidRoom();
  ASSERT_OK(room);
  EXPECT_GT(room->pid_max, 0);
  EXPECT_GT(room->threads_max, 0);
  EXPECT_GT(room->threads, 0);  // this test's own threads at least
  EXPECT_LT(room->threads, room->pid_max);
}

TEST(ProcessLimits, OpenFileErrorsAreToldAsTheLimit) {
  Error e = explainLimitError(Error::sys(EMFILE, "pipe"), 42);
  EXPECT_EQ(e.code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(e.message().find("RLIMIT_NOFILE"), std::string::npos) << e.message();
  EXPECT_NE(e.message().find("42 sandboxes"), std::string::npos) << e.message();
  const Error unrelated = Error::sys(ENOENT, "open x");
  Error other = explainLimitError(unrelated, 42);
  EXPECT_EQ(other.code(), unrelated.code());
  EXPECT_EQ(other.message(), unrelated.message());
}

}  // namespace
}  // namespace dsec::testing
