// Attack: a sandbox record in a node directory names a process outside any sandbox. Its pid and start time are
// public (/proc/PID/stat), so whoever can write a record (a user who can write the node directory, a record
// planted between an agent's death and its job's epilog) could otherwise make the reaper, which runs as root in
// the job's epilog, SIGKILL any process on the node: slurmd, another user's job.
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "../backends/container/ContainerTestSupport.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {
namespace {

// A process of the host that no sandbox contains: this test's own child, so the test can tell whether it died.
class Bystander {
 public:
  Bystander() {
    pid_ = ::fork();
    if (pid_ == 0) {
      for (;;) ::pause();
    }
  }
  ~Bystander() {
    if (pid_ > 0 && running()) ::kill(pid_, SIGKILL);
    if (pid_ > 0) ::waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }
  bool running() {
    if (reaped_) return false;
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) reaped_ = true;
    return !reaped_;
  }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
};

bool deadOrZombie(pid_t pid) {
  auto stat = readFile("/proc/" + std::to_string(pid) + "/stat");
  if (!stat.ok()) return true;
  auto paren = stat->rfind(')');
  return paren != std::string::npos && paren + 2 < stat->size() && (*stat)[paren + 2] == 'Z';
}

TEST_F(ContainerTest, AForgedRecordCannotMakeTheReaperKillAProcessOutsideTheSandbox) {
  Bystander victim;
  ASSERT_GT(victim.pid(), 0);
  auto start = processStartTime(victim.pid());
  ASSERT_OK(start);

  // The forged record names the bystander as its init, under a cgroup name that exists nowhere...
  nlohmann::json forged = {
      {"cgroup", "forged-" + randomHex(8)}, {"init_pid", victim.pid()}, {"init_start_time", *start}};
  EXPECT_OK(backend_->reap(forged));
  EXPECT_TRUE(victim.running()) << "reaping a forged record killed a process outside any sandbox";

  // ... and under the cgroup of a live sandbox (the record of a real sandbox with its init swapped).
  auto real = backend_->create(makeSpec());
  ASSERT_OK(real);
  nlohmann::json state = (*real)->persistentState();
  pid_t real_init = state.value("init_pid", 0);
  ASSERT_GT(real_init, 1);
  nlohmann::json swapped = state;
  swapped["init_pid"] = victim.pid();
  swapped["init_start_time"] = *start;
  EXPECT_OK(backend_->reap(swapped));
  EXPECT_TRUE(victim.running()) << "a record naming a real sandbox's cgroup killed a process outside it";

  // The control: reaping the sandbox (its cgroup, which holds its real init) still ends it: the init is gone or a
  // zombie waiting for its parent, and the sandbox's cgroup is removed.
  bool ended = false;
  for (int i = 0; i < 600 && !ended; ++i) {
    ended = deadOrZombie(real_init);
    if (!ended) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(ended) << "the real sandbox's init survived the reap of its cgroup";
  EXPECT_TRUE(cgroupDirsOf(state.value("cgroup", "")).empty()) << "the real sandbox's cgroup is still there";
  (void)(*real)->destroy();  // already reaped: whatever it says, nothing is left to free
}

}  // namespace
}  // namespace dsec::testing
