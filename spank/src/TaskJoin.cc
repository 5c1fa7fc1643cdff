#include "TaskJoin.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "SandboxPath.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Process.h"

namespace dsec::spank {

Status joinSandbox(const JoinTarget& target) {
  auto pidfd = pidfdOpen(target.init_pid);
  if (!pidfd.ok()) return Error(ErrorCode::kNotFound, "the step's sandbox is gone (its init exited)");
  // With the pidfd held the pid cannot be recycled any more: check it is still the sandbox's init.
  auto started = processStartTime(target.init_pid);
  if (!started.ok() || *started != target.init_start_time) {
    return Error(ErrorCode::kNotFound, "the step's sandbox is gone (its init exited)");
  }
  // slurmstepd's working directory is the job's (it chdir()s there before forking the tasks).
  char cwd_buf[4096];
  std::string job_cwd = getcwd(cwd_buf, sizeof cwd_buf) != nullptr ? cwd_buf : "/";
  std::string root_path = "/proc/" + std::to_string(target.init_pid) + "/root";
  UniqueFd root(open(root_path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root) return Error::sys(errno, "open sandbox root " + root_path);
  // The cgroup first: its files are reachable only through the host's /sys.
  for (const auto& f : target.procs_files) {
    UniqueFd fd(open(f.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd || write(fd.get(), "0", 1) != 1) return Error::sys(errno, "join sandbox cgroup " + f);
  }
  int flags = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWCGROUP | CLONE_NEWPID;
  if (target.join_network) flags |= CLONE_NEWNET;
  if (setns(pidfd->get(), flags) < 0) return Error::sys(errno, "setns into the sandbox's namespaces");
  // setns(CLONE_NEWNS) leaves us at the namespace's root mount; the sandbox's root is what init pivoted to.
  if (fchdir(root.get()) < 0 || chroot(".") < 0) return Error::sys(errno, "chroot into the sandbox root");
  // Give slurmstepd's chdir(job cwd) a place to land inside the sandbox (tasks of a step race here: an
  // existing directory is fine). Failing that, it falls back to /tmp with a warning, which is all that is
  // lost. The path is the user's, and other tasks of the step may already run in the sandbox: directories
  // are made on the sandbox's own root only, never in a bind (SandboxPath.h).
  if (chdir("/") < 0) return Error::sys(errno, "chdir / in the sandbox");
  UniqueFd sandbox_root(open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
  uint64_t root_mount = 0;
  if (job_cwd[0] == '/' && sandbox_root && mountIdOf(sandbox_root.get(), &root_mount)) {
    SandboxPathResult made = openOrCreateInSandbox(sandbox_root.get(), root_mount, job_cwd.c_str(), true);
    if (made.fd >= 0) close(made.fd);
  }
  return okStatus();
}

Status enterWorkdir(const std::string& workdir) {
  if (chdir(workdir.c_str()) < 0) {
    return Error(ErrorCode::kInvalidArgument,
                 "--dsec-workdir " + workdir + ": " + std::string(strerror(errno)) + " inside the sandbox", errno);
  }
  return okStatus();
}

Status forkIntoPidNamespace() {
  pid_t child = fork();
  if (child < 0) return Error::sys(errno, "fork into the sandbox's pid namespace");
  if (child == 0) return okStatus();

  // The shim. It holds no fd the program needs (stdio stays open in the child) and must not keep pipes
  // to srun open after the program is gone.
  syscall(SYS_close_range, 0, ~0U, 0);
  prctl(PR_SET_NAME, "dsec-task-shim", 0, 0, 0);  // not another "slurmstepd" in ps
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP || sig == SIGCHLD) continue;
    sigaction(sig, &ignore, nullptr);  // fails harmlessly for the signals libc reserves
  }
  int status = 0;
  pid_t got;
  do {
    got = waitpid(child, &status, 0);
  } while (got < 0 && errno == EINTR);
  if (got < 0) _exit(127);
  if (WIFEXITED(status)) _exit(WEXITSTATUS(status));
  int sig = WTERMSIG(status);
  // Die of the same signal, so Slurm reports it as such (without writing a core of the shim).
  struct rlimit no_core {
    0, 0
  };
  setrlimit(RLIMIT_CORE, &no_core);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, sig);
  sigprocmask(SIG_UNBLOCK, &set, nullptr);
  kill(getpid(), sig);
  _exit(128 + sig);
}

}  // namespace dsec::spank
