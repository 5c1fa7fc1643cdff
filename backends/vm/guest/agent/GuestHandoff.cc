// The image's own init as PID 1 (a vm sandbox that boots the image's kernel and, say, systemd). PID 1 must be the
// image's init, so the agent hands it over: it forks a child that waits until PID 1 has exec'd the init, then
// re-execs the agent binary beside it ("--after-init"). PID 1 moves the sandbox root onto / (as switch_root does)
// and execs the init. The new agent finds the sandbox through an inherited fd and the setup it was given in a
// file of the initramfs, and answers the host's setup request once it has its port again.
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

#include "GuestAgent.h"

namespace dsec::guest {
namespace {

constexpr const char* kHandoffFile = "/handoff";  // in the initramfs (the agent's own root)
constexpr int kInheritedRootFd = 3;

std::mutex reply_mu;
std::string reply_port;  // the port whose setup request the re-exec'd agent still has to answer
uint32_t reply_request = 0;

// The init, resolved inside the sandbox root: an executable regular file, or why not.
std::string checkInit(int root_fd, const std::string& init) {
  open_how how{};
  how.flags = O_PATH | O_CLOEXEC;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
  int fd = static_cast<int>(syscall(SYS_openat2, root_fd, init.c_str() + 1, &how, sizeof how));
  if (fd < 0) return init + ": " + strerror(errno);
  struct stat st {};
  int rc = fstat(fd, &st);
  close(fd);
  if (rc != 0) return init + ": " + strerror(errno);
  if (!S_ISREG(st.st_mode) || (st.st_mode & 0111) == 0) return init + " is not an executable file";
  return "";
}

bool writeWhole(const char* path, const std::string& bytes) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  bool ok = ::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size());
  close(fd);
  return ok;
}

// systemd answers systemctl once its manager listens on /run/systemd/private: the host's create returns only then,
// so a caller's first command may be systemctl (`systemctl is-system-running --wait` waits for the rest of the boot).
void waitForSystemdManager(int root_fd) {
  char exe[256];
  ssize_t n = readlink("/proc/1/exe", exe, sizeof exe - 1);
  if (n <= 0 || !std::string_view(exe, static_cast<size_t>(n)).ends_with("/systemd")) return;
  for (int i = 0; i < 600; ++i) {  // 30 s
    if (faccessat(root_fd, "run/systemd/private", F_OK, AT_SYMLINK_NOFOLLOW) == 0) return;
    usleep(50 * 1000);
  }
  logLine("systemd's manager socket did not appear in 30 s");
}

}  // namespace

std::string handOffInit(Port& port, uint32_t request, const proto::SetupMsg& setup) {
  int root_fd = -1;
  {
    std::lock_guard lock(sandbox().mu);
    root_fd = sandbox().root_fd;
  }
  if (std::string why = checkInit(root_fd, setup.init); !why.empty()) return "the image's init " + why;
  proto::SetupMsg kept = setup;
  kept.init.clear();
  if (!writeWhole(kHandoffFile, proto::Writer().str(port.name()).u32(request).str(kept.encode()).take())) {
    return std::string("writing ") + kHandoffFile + ": " + strerror(errno);
  }
  // Everything the child needs after fork() is made before it: a forked copy of a threaded process may only make
  // async-signal-safe calls.
  std::string fd_arg = std::to_string(kInheritedRootFd);
  char self[] = "/init";
  char flag[] = "--after-init";
  char* child_argv[] = {self, flag, fd_arg.data(), nullptr};
  char* child_envp[] = {nullptr};
  int gate[2];
  if (pipe2(gate, O_CLOEXEC) != 0) return std::string("pipe: ") + strerror(errno);
  pid_t child = fork();
  if (child < 0) {
    int err = errno;
    close(gate[0]);
    close(gate[1]);
    return std::string("fork: ") + strerror(err);
  }
  if (child == 0) {
    close(gate[1]);
    // PID 1's exec closes its end: then its ports are free to open again.
    char c;
    while (::read(gate[0], &c, 1) != 0 && errno == EINTR) {
    }
    if (root_fd == kInheritedRootFd) {
      fcntl(root_fd, F_SETFD, 0);
    } else if (dup2(root_fd, kInheritedRootFd) < 0) {
      _exit(127);
    }
    execve(self, child_argv, child_envp);
    _exit(127);
  }
  close(gate[0]);
  if (chdir(kSandboxRoot) != 0 || mount(".", "/", nullptr, MS_MOVE, nullptr) != 0) {
    int err = errno;
    kill(child, SIGKILL);
    close(gate[1]);
    (void)!chdir("/");
    return std::string("moving the sandbox root onto /: ") + strerror(err);
  }
  // Past this point the agent's own root is gone from PID 1's view: only the exec is left.
  if (chroot(".") != 0 || chdir("/") != 0) logLine(std::string("chroot into the sandbox: ") + strerror(errno));
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  signal(SIGPIPE, SIG_DFL);
  std::string init = setup.init;
  char* init_argv[] = {init.data(), nullptr};
  char home[] = "HOME=/";
  char term[] = "TERM=linux";
  char* init_envp[] = {home, term, nullptr};
  execve(init.c_str(), init_argv, init_envp);
  int err = errno;
  // No way back (the root moved): the host fails the create on this error and destroys the machine.
  kill(child, SIGKILL);
  close(gate[1]);
  return "exec " + init + ": " + strerror(err);
}

bool resumeAfterInit(int root_fd) {
  std::ifstream in(kHandoffFile, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  std::string data = bytes.str();
  proto::Reader r(data);
  std::string port_name = r.str();
  uint32_t request = r.u32();
  std::string payload = r.str();
  proto::SetupMsg setup;
  struct stat st {};
  if (!r.done() || !setup.decode(payload) || fstat(root_fd, &st) != 0 || !S_ISDIR(st.st_mode)) {
    logLine("after init: no usable hand-off state");
    return false;
  }
  fcntl(root_fd, F_SETFD, FD_CLOEXEC);
  waitForSystemdManager(root_fd);
  {
    std::lock_guard lock(sandbox().mu);
    sandbox().root_fd = root_fd;
    sandbox().hostname = setup.hostname;
    sandbox().env = setup.env;
    sandbox().ready = true;
  }
  std::lock_guard lock(reply_mu);
  reply_port = port_name;
  reply_request = request;
  return true;
}

void answerHandoff(Port& port) {
  std::lock_guard lock(reply_mu);
  if (reply_port.empty() || reply_port != port.name()) return;
  port.send(proto::FrameType::kOk, reply_request, {});
  reply_port.clear();
}

}  // namespace dsec::guest
