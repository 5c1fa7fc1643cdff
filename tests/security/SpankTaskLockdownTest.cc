// What a Slurm task is held to once it joined its step sandbox (spank/src/TaskLockdown.h), tried the way a task
// would: a root process locks itself down as slurm_spank_task_init_privileged does, still does what slurmstepd
// does afterwards (setgroups, setresgid, setresuid to the job's user), then execs. A setuid-root program must not
// raise it back to root, and a root task must get the sandbox's capabilities only, no mounts, no namespaces.
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>

#include "TaskLockdown.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::spank {
namespace {

constexpr uid_t kNobody = 65534;
// Capabilities a task must never hold: DAC_READ_SEARCH, NET_ADMIN, SYS_MODULE, SYS_RAWIO, SYS_PTRACE,
// SYS_ADMIN, SYS_BOOT, MKNOD, PERFMON, BPF.
constexpr int kDangerousCaps[] = {2, 12, 16, 17, 19, 21, 22, 27, 38, 39};

struct TaskRun {
  int status = -1;
  std::string out;
};

// Forks a task: lock down (unless policy is null), optionally become `uid` the way slurmstepd does, exec
// /bin/sh -c script.
TaskRun runTask(const TaskPolicy* policy, uid_t uid, const std::string& script) {
  int pipefd[2];
  if (pipe(pipefd) < 0) return {};
  pid_t pid = fork();
  if (pid == 0) {
    dup2(pipefd[1], 1);
    dup2(pipefd[1], 2);
    if (policy != nullptr && !lockDownTask(*policy).ok()) _exit(101);
    if (uid != 0) {
      gid_t groups[] = {static_cast<gid_t>(uid)};
      if (setgroups(1, groups) < 0 || setresgid(uid, uid, uid) < 0 || setresuid(uid, uid, uid) < 0) _exit(102);
    }
    if (chdir("/") < 0) _exit(103);
    execl("/bin/sh", "sh", "-c", script.c_str(), nullptr);
    _exit(104);
  }
  close(pipefd[1]);
  TaskRun r;
  char buf[4096];
  ssize_t n;
  while ((n = read(pipefd[0], buf, sizeof buf)) > 0) r.out.append(buf, static_cast<size_t>(n));
  close(pipefd[0]);
  waitpid(pid, &r.status, 0);
  return r;
}

uint64_t capLine(const std::string& out, const std::string& name) {
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + ":", 0) == 0) return std::stoull(line.substr(name.size() + 1), nullptr, 16);
  }
  ADD_FAILURE() << "no " << name << " line in:\n" << out;
  return ~0ULL;
}

bool hasLine(const std::string& out, const std::string& want) {
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    if (line == want) return true;
  }
  return false;
}

class TaskLockdownTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DSEC_SKIP_UNLESS_ROOT();
    auto policy = sandboxTaskPolicy();
    ASSERT_OK(policy);
    policy_ = std::move(policy).value();
    ASSERT_EQ(chmod(dir_.path().c_str(), 0755), 0);
    // A setuid-root program the user can run (what the attack in the issue uses).
    suid_id_ = dir_.path() + "/suid-id";
    std::filesystem::copy_file("/usr/bin/id", suid_id_);
    ASSERT_EQ(chown(suid_id_.c_str(), 0, 0), 0);
    ASSERT_EQ(chmod(suid_id_.c_str(), 04755), 0);
  }

  testing::TempDir dir_;
  TaskPolicy policy_;
  std::string suid_id_;
};

TEST_F(TaskLockdownTest, PolicyIsTheSandboxes) {
  EXPECT_FALSE(policy_.seccomp.empty());
  for (int cap : kDangerousCaps) EXPECT_FALSE((policy_.keep_caps >> cap) & 1) << "capability " << cap;
}

TEST_F(TaskLockdownTest, EmptyPolicyIsRefused) {
  TaskRun r = runTask(nullptr, 0, "true");
  ASSERT_EQ(r.status, 0);
  TaskPolicy empty;
  r = runTask(&empty, 0, "echo ran");
  EXPECT_TRUE(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 101) << "a task ran without a filter: " << r.out;
}

TEST_F(TaskLockdownTest, SetuidProgramDoesNotRaiseAnUnprivilegedTask) {
  // Without the lockdown the setuid bit works here: the test can tell.
  TaskRun control = runTask(nullptr, kNobody, suid_id_ + " -u");
  ASSERT_TRUE(hasLine(control.out, "0")) << "the setuid-root copy of id does not work here:\n" << control.out;

  TaskRun r =
      runTask(&policy_, kNobody, suid_id_ + " -u; grep -E '^(NoNewPrivs|Seccomp|Cap[A-Za-z]+):' /proc/self/status");
  ASSERT_TRUE(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0) << r.status << "\n" << r.out;
  EXPECT_TRUE(hasLine(r.out, std::to_string(kNobody))) << "the setuid-root program ran as:\n" << r.out;
  EXPECT_NE(r.out.find("NoNewPrivs:\t1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Seccomp:\t2"), std::string::npos) << r.out;
  EXPECT_EQ(capLine(r.out, "CapEff"), 0U) << r.out;
  EXPECT_EQ(capLine(r.out, "CapBnd"), policy_.keep_caps) << r.out;
}

TEST_F(TaskLockdownTest, RootTaskGetsTheSandboxCapsOnly) {
  std::string target = dir_.path() + "/mnt";
  ASSERT_EQ(mkdir(target.c_str(), 0755), 0);
  TaskRun r = runTask(&policy_, 0,
                      "grep -E '^(NoNewPrivs|Seccomp|Cap[A-Za-z]+):' /proc/self/status; "
                      "mount -t tmpfs none " +
                          target +
                          " 2>/dev/null && echo MOUNTED; "
                          "unshare -m true 2>/dev/null && echo UNSHARED; "
                          "mknod " +
                          dir_.path() + "/disk b 8 0 2>/dev/null && echo MKNOD; echo done");
  ASSERT_TRUE(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0) << r.status << "\n" << r.out;
  EXPECT_TRUE(hasLine(r.out, "done")) << r.out;
  EXPECT_EQ(capLine(r.out, "CapBnd"), policy_.keep_caps) << r.out;
  EXPECT_EQ(capLine(r.out, "CapEff"), policy_.keep_caps) << r.out;
  EXPECT_EQ(capLine(r.out, "CapPrm"), policy_.keep_caps) << r.out;
  EXPECT_EQ(capLine(r.out, "CapInh") & ~policy_.keep_caps, 0U) << r.out;
  EXPECT_EQ(capLine(r.out, "CapAmb"), 0U) << r.out;
  EXPECT_NE(r.out.find("NoNewPrivs:\t1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Seccomp:\t2"), std::string::npos) << r.out;
  EXPECT_FALSE(hasLine(r.out, "MOUNTED")) << r.out;
  EXPECT_FALSE(hasLine(r.out, "UNSHARED")) << r.out;
  EXPECT_FALSE(hasLine(r.out, "MKNOD")) << r.out;
}

}  // namespace
}  // namespace dsec::spank
