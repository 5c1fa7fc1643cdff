#include "VmLaunch.h"

#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstring>

#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"

namespace dsec::backends::vm {
namespace {

constexpr int kLeaseFd = 5;

// In the child, between fork and exec: async-signal-safe calls only, on data prepared before the fork.
// fallocate (any mode) returns 0 without running; everything else is left to QEMU's own filter.
const sock_filter kNoFallocate[] = {
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
    BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, __X32_SYSCALL_BIT, 0, 1),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_fallocate, 0, 1),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | 0),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
};

[[noreturn]] void childExec(char* const* argv, const std::vector<std::string>& procs, int lease_fd, int log_fd,
                            int null_fd, int err_pipe, bool private_file_ram) {
  auto fail = [&](int step) {
    int e = errno;
    int msg[2] = {step, e};
    (void)!::write(err_pipe, msg, sizeof(msg));
    _exit(127);
  };
  if (::setsid() < 0) fail(1);
  for (const auto& file : procs) {
    int fd = ::open(file.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) fail(2);
    if (::write(fd, "0", 1) != 1) fail(3);
    ::close(fd);
  }
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) fail(4);
  if (private_file_ram) {
    sock_fprog prog{static_cast<unsigned short>(sizeof(kNoFallocate) / sizeof(kNoFallocate[0])),
                    const_cast<sock_filter*>(kNoFallocate)};
    if (::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) != 0) fail(10);
  }
  if (::prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0) != 0) fail(5);
  if (::dup2(null_fd, 0) < 0 || ::dup2(log_fd, 1) < 0 || ::dup2(log_fd, 2) < 0) fail(6);
  if (lease_fd >= 0 && lease_fd != kLeaseFd && ::dup2(lease_fd, kLeaseFd) < 0) fail(7);
  if (lease_fd >= 0) {
    int flags = ::fcntl(kLeaseFd, F_GETFD);
    if (flags < 0 || ::fcntl(kLeaseFd, F_SETFD, flags & ~FD_CLOEXEC) < 0) fail(8);
  }
  // Nothing else of the agent's reaches QEMU (the error pipe is close-on-exec).
  for (int fd = 3; fd < 1024; ++fd) {
    if (fd != kLeaseFd && fd != err_pipe) ::close(fd);
  }
  ::execvp(argv[0], argv);
  fail(9);
  _exit(127);
}

}  // namespace

Result<LaunchedQemu> launchQemu(const std::vector<std::string>& argv, const std::vector<std::string>& procs_files,
                                int lease_fd, const std::string& log_path, bool private_file_ram) {
  if (argv.empty()) return Error::invalid("no QEMU command");
  UniqueFd log(::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!log) return Error::sys(errno, "open " + log_path);
  UniqueFd null_fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!null_fd) return Error::sys(errno, "open /dev/null");
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return Error::sys(errno, "pipe");
  UniqueFd err_r(pipe_fds[0]), err_w(pipe_fds[1]);
  std::vector<char*> cargv;
  cargv.reserve(argv.size() + 1);
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) return Error::sys(errno, "fork");
  if (pid == 0) {
    childExec(cargv.data(), procs_files, lease_fd, log.get(), null_fd.get(), err_w.get(), private_file_ram);
  }
  err_w.reset();
  int msg[2] = {0, 0};
  ssize_t n = ::read(err_r.get(), msg, sizeof(msg));
  if (n == sizeof(msg)) {
    ::waitpid(pid, nullptr, 0);
    static const char* const kSteps[] = {"child",  "setsid", "open cgroup", "join cgroup", "no_new_privs",
                                         "pdeath", "stdio",  "lease fd",    "lease fd"};
    std::string step = msg[0] == 9    ? "exec " + argv[0]
                       : msg[0] == 10 ? std::string("seccomp")
                                      : kSteps[msg[0] > 0 && msg[0] < 9 ? msg[0] : 0];
    return Error::sys(msg[1], "starting QEMU: " + step);
  }
  LaunchedQemu out;
  out.pid = pid;
  auto fd = pidfdOpen(pid);
  if (!fd.ok()) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return fd.error();
  }
  out.pidfd = std::move(fd).value();
  return out;
}

bool waitExited(int pidfd, double timeout_seconds) {
  const double deadline = monotonicSeconds() + timeout_seconds;
  while (true) {
    pollfd p{pidfd, POLLIN, 0};
    double left = deadline - monotonicSeconds();
    int n = ::poll(&p, 1, left <= 0 ? 0 : static_cast<int>(std::ceil(left * 1000)));
    if (n > 0) return true;
    if (n == 0) return false;
    if (errno != EINTR) return false;
  }
}

void reapChild(pid_t pid) {
  if (pid > 0) (void)::waitpid(pid, nullptr, WNOHANG);
}

}  // namespace dsec::backends::vm
