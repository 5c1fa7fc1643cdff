// PID 1 of the guest: mounts the kernel's filesystems, loads the modules the initramfs carries, serves every
// "dsec.N" port in a thread of its own and reaps processes for ever (PID 1 never exits).
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <fstream>
#include <set>
#include <string>
#include <thread>

#include "GuestAgent.h"

namespace dsec::guest {

void logLine(const std::string& line) {
  std::string l = "dsec-guest-agent: " + line + "\n";
  (void)!::write(2, l.data(), l.size());
}

Reaper& Reaper::instance() {
  static Reaper r;
  return r;
}

pid_t Reaper::forkTracked(int* exit_event_fd) {
  int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (efd < 0) return -1;
  std::lock_guard lock(mu_);
  pid_t pid = fork();
  if (pid == 0) return 0;
  if (pid < 0) {
    close(efd);
    return -1;
  }
  tracked_[pid] = Tracked{efd, false, 0};
  *exit_event_fd = efd;
  return pid;
}

int Reaper::takeStatus(pid_t pid) {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return tracked_.count(pid) == 0 || tracked_[pid].exited; });
  auto it = tracked_.find(pid);
  if (it == tracked_.end()) return 0;
  int status = it->second.status;
  close(it->second.event_fd);
  tracked_.erase(it);
  return status;
}

void Reaper::reapAll() {
  for (;;) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    std::lock_guard lock(mu_);
    auto it = tracked_.find(pid);
    if (it == tracked_.end()) continue;  // an orphan of the sandbox
    it->second.exited = true;
    it->second.status = status;
    uint64_t one = 1;
    (void)!::write(it->second.event_fd, &one, sizeof one);
    cv_.notify_all();
  }
}

SandboxState& sandbox() {
  static SandboxState s;
  return s;
}

namespace {

void mountOrLog(const char* source, const char* target, const char* type, unsigned long flags, const char* data) {
  mkdir(target, 0755);
  if (mount(source, target, type, flags, data) != 0 && errno != EBUSY) {
    logLine(std::string("mount ") + target + ": " + strerror(errno));
  }
}

void mountKernelFilesystems() {
  mountOrLog("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr);
  mountOrLog("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr);
  mountOrLog("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755");
  mountOrLog("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620");
  mountOrLog("cgroup2", "/sys/fs/cgroup", "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr);
  // The kernel hands init /dev/console when the initramfs has it; otherwise log to the devtmpfs one.
  if (fcntl(2, F_GETFD) < 0) {
    int fd = open("/dev/console", O_RDWR | O_NOCTTY);
    if (fd >= 0) {
      for (int i = 0; i < 3; ++i) dup2(fd, i);
      if (fd > 2) close(fd);
    }
  }
}

constexpr int kModuleInitCompressedFile = 4;  // MODULE_INIT_COMPRESSED_FILE (linux/module.h, 5.17)

// modules.order lists the initramfs's modules in load order (dependencies first); built-in ones are not there.
void loadModules() {
  std::ifstream order("/lib/modules/modules.order");
  std::string name;
  while (std::getline(order, name)) {
    if (name.empty()) continue;
    std::string path = "/lib/modules/" + name;
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      logLine("module " + path + ": " + strerror(errno));
      continue;
    }
    // An image's kernel may ship compressed modules: the kernel decompresses them itself (CONFIG_MODULE_DECOMPRESS).
    const bool compressed = (name.ends_with(".xz") || name.ends_with(".zst") || name.ends_with(".gz"));
    if (syscall(SYS_finit_module, fd, "", compressed ? kModuleInitCompressedFile : 0) != 0 && errno != EEXIST) {
      logLine("loading " + name + ": " + strerror(errno));
    }
    close(fd);
  }
}

void servePort(int fd, const std::string& name) {
  Port port(fd, name);
  std::optional<proto::Frame> pending;
  for (;;) {
    proto::Frame frame;
    if (pending) {
      frame = std::move(*pending);
      pending.reset();
    } else {
      Port::Read r = port.read(&frame, -1);
      if (r == Port::Read::kHangup) {
        // No peer: the host side is not connected. Poll again soon (a new peer starts with hello).
        port.resetStream();
        usleep(100 * 1000);
        continue;
      }
      if (r == Port::Read::kBad) {
        logLine(name + ": bad frame from the host; dropping the stream");
        port.resetStream();
        char buf[4096];
        while (::read(fd, buf, sizeof buf) > 0) {
        }
        continue;
      }
      if (r != Port::Read::kFrame) continue;
    }
    try {
      switch (frame.type) {
        case proto::FrameType::kHello: {
          proto::HelloMsg hello;
          if (hello.decode(frame.payload)) port.send(proto::FrameType::kHelloOk, frame.request, hello.encode());
          break;
        }
        case proto::FrameType::kSetup:
          handleSetup(port, frame);
          break;
        case proto::FrameType::kRestored:
          handleRestored(port, frame);
          break;
        case proto::FrameType::kExec:
          handleExec(port, frame, &pending);
          break;
        case proto::FrameType::kReadFile:
          handleReadFile(port, frame);
          break;
        case proto::FrameType::kWriteFile:
          handleWriteFile(port, frame, &pending);
          break;
        case proto::FrameType::kStat:
          handleStat(port, frame);
          break;
        case proto::FrameType::kListDir:
          handleListDir(port, frame);
          break;
        case proto::FrameType::kRemove:
          handleRemove(port, frame);
          break;
        case proto::FrameType::kUsage:
          handleUsage(port, frame);
          break;
        case proto::FrameType::kReclaim:
          handleReclaim(port, frame);
          break;
        default:
          // Stray frames of a request that already ended (stdin after the exit, a late signal): ignored.
          break;
      }
    } catch (const std::exception& e) {
      port.sendError(frame.request, EIO, std::string("agent: ") + e.what());
    } catch (...) {
      port.sendError(frame.request, EIO, "agent: unknown failure");
    }
  }
}

// Ports appear once virtio_console has probed; more may come (hotplug), so the scan goes on, slower over time.
void scanPorts(std::set<std::string>& served) {
  DIR* dir = opendir("/sys/class/virtio-ports");
  if (dir == nullptr) return;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.' || served.count(e->d_name)) continue;
    std::ifstream in(std::string("/sys/class/virtio-ports/") + e->d_name + "/name");
    std::string name;
    std::getline(in, name);
    if (name.rfind("dsec.", 0) != 0) continue;
    std::string dev = std::string("/dev/") + e->d_name;
    int fd = open(dev.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;  // its node may not be there yet (or, just after a hand-off to init, still closing)
    served.insert(e->d_name);
    Port port(fd, name);
    answerHandoff(port);
    std::thread(servePort, fd, name).detach();
  }
  closedir(dir);
}

}  // namespace
}  // namespace dsec::guest

int main(int argc, char** argv) {
  using namespace dsec::guest;
  signal(SIGPIPE, SIG_IGN);
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  // Blocked in every thread (they inherit it): only the main thread takes SIGCHLD, through sigtimedwait.
  sigprocmask(SIG_BLOCK, &chld, nullptr);
  if (argc == 3 && strcmp(argv[1], "--after-init") == 0) {
    // Beside the image's init: the kernel's filesystems, the modules and the sandbox are there already.
    if (!resumeAfterInit(static_cast<int>(std::strtol(argv[2], nullptr, 10)))) return 1;
  } else {
    mountKernelFilesystems();
    loadModules();
  }
  std::set<std::string> served;
  timespec start{};
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) {
    timespec now{};
    clock_gettime(CLOCK_MONOTONIC, &now);
    long since = now.tv_sec - start.tv_sec;
    scanPorts(served);
    timespec wait{0, (since < 10 ? 20L : 500L) * 1000L * 1000L};
    sigtimedwait(&chld, nullptr, &wait);
    Reaper::instance().reapAll();
  }
}
