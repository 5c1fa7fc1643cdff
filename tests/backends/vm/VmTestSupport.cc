#include "VmTestSupport.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "dsec/backends/vm/Initramfs.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {
namespace {

constexpr const char* kApplets[] = {"sh",     "ls",    "cat",  "echo",  "sleep", "dd",     "ps",    "hostname",
                                    "id",     "env",   "true", "false", "head",  "tail",   "wc",    "touch",
                                    "mkdir",  "rm",    "grep", "sed",   "kill",  "seq",    "cut",   "tr",
                                    "test",   "uname", "stat", "find",  "pidof", "date",   "ip",    "md5sum",
                                    "setsid", "free",  "df",   "mount", "yes",   "printf", "nproc", "sync"};

struct LayerHolder {
  VmTestLayer layer;
  std::string base;
  ~LayerHolder() {
    if (!base.empty()) (void)removeTree(base);
  }
};

void buildLayer(LayerHolder& h) {
  if (!missingRoot().empty()) {
    h.layer.skip_reason = missingRoot();
    return;
  }
  if (::access("/bin/busybox", X_OK) != 0) {
    h.layer.skip_reason = "needs /bin/busybox (apt-get install busybox-static)";
    return;
  }
  if (findProgram("mkfs.erofs").empty()) {
    h.layer.skip_reason = "needs mkfs.erofs (apt-get install erofs-utils)";
    return;
  }
  char tmpl[] = "/tmp/dsec-vm-layer-XXXXXX";
  h.base = ::mkdtemp(tmpl);
  // The guest mounts its sysfs on /sys (a container has none).
  auto made = makeBusyboxErofs(h.base, std::vector<std::string>(std::begin(kApplets), std::end(kApplets)), {"/sys"});
  if (!made.ok()) {
    h.layer.error = made.error().message();
    return;
  }
  const std::string& image = *made;
  h.layer.file = image;
}

}  // namespace

const VmTestLayer& vmBusyboxLayer() {
  static LayerHolder holder;
  static std::once_flag once;
  std::call_once(once, [] { buildLayer(holder); });
  return holder.layer;
}

void VmTest::SetUp() {
  const VmTestLayer& layer = vmBusyboxLayer();
  if (!layer.skip_reason.empty()) GTEST_SKIP() << layer.skip_reason;
  ASSERT_TRUE(layer.error.empty()) << layer.error;
  if (findProgram("qemu-system-x86_64").empty()) GTEST_SKIP() << "needs qemu-system-x86_64 (qemu-system-x86)";
  if (!backends::vm::findGuestKernelDir().ok()) {
    GTEST_SKIP() << "needs the guest kernel (tests/install-deps.sh fetches it)";
  }
  backends::vm::VmBackendOptions options;
  options.kind = kind();
  options.cgroup_parent = kVmTestCgroupParent;
  auto accel = backends::vm::chooseAccel("auto", options.qemu);
  if (!accel.ok()) GTEST_SKIP() << accel.error().message();
  backend_ = newBackend();
  ASSERT_TRUE(backend_);
}

std::unique_ptr<backends::Backend> VmTest::newBackend() {
  backends::vm::VmBackendOptions options;
  options.kind = kind();
  options.cgroup_parent = kVmTestCgroupParent;
  options.default_memory_bytes = 256ll << 20;
  auto b = backends::vm::makeVmBackend(options);
  EXPECT_TRUE(b.ok()) << b.error().toString();
  if (!b.ok()) return nullptr;
  return std::move(b).value();
}

void VmTest::TearDown() {
  for (auto& sb : sandboxes_) {
    if (sb) EXPECT_OK(sb->destroy());
  }
  sandboxes_.clear();
}

backends::SandboxSpec VmTest::makeSpec() {
  backends::SandboxSpec spec;
  spec.id = "vm-" + randomHex(12);
  spec.image = "busybox:test";
  spec.lower_files = {vmBusyboxLayer().file};
  spec.memory_bytes = 256ll << 20;
  spec.pids = 64;
  spec.cpus = 1;
  spec.disk_bytes = 32ll << 20;
  return spec;
}

backends::Sandbox& VmTest::create(const backends::SandboxSpec& spec) {
  auto sb = backend_->create(spec);
  if (!sb.ok()) {
    ADD_FAILURE() << "create failed: " << sb.error().toString();
    throw std::runtime_error("create failed");
  }
  sandboxes_.push_back(std::move(sb).value());
  return *sandboxes_.back();
}

backends::Sandbox& VmTest::adopt(std::unique_ptr<backends::Sandbox> sandbox) {
  sandboxes_.push_back(std::move(sandbox));
  return *sandboxes_.back();
}

backends::ExecResult VmTest::sh(backends::Sandbox& sb, const std::string& cmd, double timeout) {
  backends::ExecRequest req;
  req.argv = {"/bin/sh", "-c", cmd};
  req.timeout_seconds = timeout;
  auto r = sb.exec(req);
  if (!r.ok()) {
    ADD_FAILURE() << "exec failed: " << cmd << ": " << r.error().toString();
    return {};
  }
  return std::move(r).value();
}

std::string VmTest::shUntilChanged(backends::Sandbox& sb, const std::string& cmd, const std::string& than,
                                   double timeout) {
  const double deadline = monotonicSeconds() + timeout;
  std::string out = sh(sb, cmd).stdout_data;
  while (out == than && monotonicSeconds() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    out = sh(sb, cmd).stdout_data;
  }
  return out;
}

std::vector<std::string> VmTest::leftoversOf(const std::string& id) const {
  std::vector<std::string> found;
  std::string run =
      std::string("/dev/shm/dsec-vm/") + kVmTestCgroupParent + "/" + backends::backendKindName(kind()) + "/" + id;
  if (::access(run.c_str(), F_OK) == 0) found.push_back(run);
  DIR* d = ::opendir("/sys/fs/cgroup");
  if (d == nullptr) return found;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    for (const std::string& sub : {std::string("/"), std::string("/shard@0/")}) {
      std::string path = "/sys/fs/cgroup/" + name + "/" + kVmTestCgroupParent + sub + id;
      if (::access(path.c_str(), F_OK) == 0) found.push_back(path);
    }
  }
  ::closedir(d);
  return found;
}

}  // namespace dsec::testing
