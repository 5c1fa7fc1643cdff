#include "TestVm.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "dsec/backends/vm/Initramfs.h"
#include "dsec/backends/vm/VmBackend.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::testing {
namespace {

constexpr const char* kTcgModule = "/usr/lib/x86_64-linux-gnu/qemu/accel-tcg-x86_64.so";

constexpr const char* kApplets[] = {"sh",   "ls",   "cat",  "echo",    "sleep", "yes",   "dd",     "ps",
                                    "id",   "env",  "true", "false",   "head",  "tail",  "wc",     "seq",
                                    "kill", "stty", "test", "[",       "mkdir", "rm",    "grep",   "hostname",
                                    "tr",   "stat", "pwd",  "killall", "pkill", "mount", "printf", "md5sum"};

// The busybox layer and the initramfs, made once per test process.
struct SharedImages {
  std::string dir, layer, initramfs, kernel, error;
  ~SharedImages() {
    if (!dir.empty()) (void)removeTree(dir);
  }
};

const SharedImages& sharedImages() {
  static SharedImages images;
  static std::once_flag once;
  std::call_once(once, [] {
    char tmpl[] = "/tmp/dsec-vm-test-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      images.error = std::string("mkdtemp: ") + strerror(errno);
      return;
    }
    images.dir = tmpl;
    auto made =
        makeBusyboxErofs(images.dir, std::vector<std::string>(std::begin(kApplets), std::end(kApplets)), {"/sys"});
    if (!made.ok()) {
      images.error = made.error().message();
      return;
    }
    images.layer = *made;
    auto kernel = backends::vm::findGuestKernelDir();
    auto agent = backends::vm::findGuestAgent();
    if (!kernel.ok() || !agent.ok()) {
      images.error = !kernel.ok() ? kernel.error().toString() : agent.error().toString();
      return;
    }
    images.kernel = *kernel;
    images.initramfs = images.dir + "/initramfs.cpio";
    Status written = backends::vm::writeInitramfs(images.initramfs, *agent, *kernel);
    if (!written.ok()) images.error = written.error().toString();
  });
  return images;
}

}  // namespace

std::string vmTestSkipReason() {
  if (findProgram("qemu-system-x86_64").empty()) return "needs qemu-system-x86_64 (apt-get install qemu-system-x86)";
  if (access(kTcgModule, R_OK) != 0) return std::string("needs QEMU's TCG accelerator module ") + kTcgModule;
  if (access("/bin/busybox", X_OK) != 0) return "needs /bin/busybox (apt-get install busybox-static)";
  if (findProgram("mkfs.erofs").empty()) return "needs mkfs.erofs (apt-get install erofs-utils)";
  auto kernel = backends::vm::findGuestKernelDir();
  if (!kernel.ok()) return "needs the guest kernel: " + kernel.error().message();
  return "";
}

Result<std::unique_ptr<TestVm>> TestVm::start(const TestVmOptions& options) {
  const SharedImages& images = sharedImages();
  if (!images.error.empty()) return Error::internal(images.error);
  std::unique_ptr<TestVm> vm(new TestVm());
  char tmpl[] = "/tmp/dsec-vm-run-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return Error::sys(errno, "mkdtemp");
  vm->run_dir_ = tmpl;
  vm->ports_ = options.ports;
  // The guest calibrates its TSC against this instead of a timer TCG emulates slowly (it can hang there).
  const int64_t tsc = backends::vm::hostTscKhz();
  std::string cmdline = "console=ttyS0 quiet panic=-1 " + (tsc > 0 ? "tsc_early_khz=" + std::to_string(tsc) : "");
  std::vector<std::string> argv = {"qemu-system-x86_64",
                                   "-nodefaults",
                                   "-no-user-config",
                                   "-nographic",
                                   "-no-reboot",
                                   "-accel",
                                   "tcg",
                                   "-cpu",
                                   "max",
                                   "-smp",
                                   "1",
                                   "-m",
                                   std::to_string(options.memory_mb),
                                   "-kernel",
                                   images.kernel + "/vmlinux",
                                   "-initrd",
                                   images.initramfs,
                                   "-serial",
                                   "file:" + vm->run_dir_ + "/console.log"};
  std::string bus_suffix;
  if (options.q35) {
    argv.insert(argv.end(), {"-M", "q35"});
    bus_suffix = "-pci";
  } else {
    argv.insert(argv.end(), {"-M", "microvm,pit=off,pic=off,rtc=off"});
    cmdline += " pci=off";
    bus_suffix = "-device";
  }
  argv.insert(argv.end(), {"-append", cmdline, "-device", "virtio-serial" + bus_suffix});
  for (int i = 0; i < options.ports; ++i) {
    std::string id = "p" + std::to_string(i);
    argv.insert(argv.end(),
                {"-chardev", "socket,id=" + id + ",path=" + vm->run_dir_ + "/" + id + ".sock" + ",server=on,wait=off",
                 "-device", "virtserialport,chardev=" + id + ",name=dsec." + std::to_string(i)});
  }
  argv.insert(argv.end(), {"-drive", "file=" + images.layer + ",if=none,id=d0,format=raw,readonly=on", "-device",
                           "virtio-blk" + bus_suffix + ",drive=d0,serial=dsec-layer-0"});
  pid_t pid = fork();
  if (pid < 0) return Error::sys(errno, "fork");
  if (pid == 0) {
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    std::string log = vm->run_dir_ + "/qemu.log";
    FILE* f = freopen(log.c_str(), "w", stderr);
    (void)f;
    if (freopen("/dev/null", "r", stdin) == nullptr) _exit(127);
    execvp(args[0], args.data());
    _exit(127);
  }
  vm->qemu_ = pid;
  return vm;
}

Result<std::vector<UniqueFd>> TestVm::connectPorts(double timeout_seconds) {
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int>(timeout_seconds * 1000));
  std::vector<UniqueFd> fds;
  for (int i = 0; i < ports_; ++i) {
    std::string path = run_dir_ + "/p" + std::to_string(i) + ".sock";
    for (;;) {
      UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
      if (connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
        fds.push_back(std::move(fd));
        break;
      }
      int status = 0;
      if (qemu_ > 0 && waitpid(qemu_, &status, WNOHANG) == qemu_) {
        qemu_ = -1;
        std::ifstream log(run_dir_ + "/qemu.log");
        std::stringstream ss;
        ss << log.rdbuf();
        return Error::internal("qemu exited: " + ss.str());
      }
      if (std::chrono::steady_clock::now() > deadline) return Error(ErrorCode::kTimeout, "no socket " + path);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  return fds;
}

Result<std::unique_ptr<backends::vm::AgentChannel>> TestVm::connectChannel(double timeout_seconds) {
  DSEC_ASSIGN_OR_RETURN(auto fds, connectPorts(timeout_seconds));
  return backends::vm::AgentChannel::connect(std::move(fds), timeout_seconds);
}

void TestVm::kill() {
  if (qemu_ <= 0) return;
  ::kill(qemu_, SIGKILL);
  int status = 0;
  waitpid(qemu_, &status, 0);
  qemu_ = -1;
}

std::string TestVm::consoleLog() const {
  std::ifstream in(run_dir_ + "/console.log");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TestVm::~TestVm() {
  kill();
  if (!run_dir_.empty()) (void)removeTree(run_dir_);
}

}  // namespace dsec::testing
