#include "ContainerTestSupport.h"

#include <dirent.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>

#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {
namespace {

constexpr const char* kApplets[] = {
    "sh",     "ls",      "cat",    "echo", "sleep",  "yes",      "dd",       "ps",      "hostname", "mount",
    "umount", "id",      "env",    "true", "false",  "head",     "tail",     "wc",      "df",       "touch",
    "mkdir",  "rm",      "grep",   "sed",  "awk",    "kill",     "nc",       "unshare", "ip",       "seq",
    "cut",    "tr",      "sort",   "test", "[",      "uname",    "readlink", "ln",      "chmod",    "stat",
    "find",   "xargs",   "printf", "pwd",  "md5sum", "date",     "pidof",    "nsenter", "mknod",    "mkfifo",
    "usleep", "timeout", "setsid", "wget", "whoami", "nslookup", "ping"};

struct LayerHolder {
  TestLayer layer;
  std::string base;
  ~LayerHolder() {
    if (!layer.mount_dir.empty()) umount2(layer.mount_dir.c_str(), MNT_DETACH);
    if (!base.empty()) (void)removeTree(base);
  }
};

void buildLayer(LayerHolder& h) {
  if (!missingRoot().empty()) {
    h.layer.skip_reason = missingRoot();
    return;
  }
  if (access("/bin/busybox", X_OK) != 0) {
    h.layer.skip_reason = "needs /bin/busybox (apt-get install busybox-static)";
    return;
  }
  if (findProgram("mkfs.erofs").empty()) {
    h.layer.skip_reason = "needs mkfs.erofs (apt-get install erofs-utils)";
    return;
  }
  char tmpl[] = "/tmp/dsec-ct-layer-XXXXXX";
  h.base = mkdtemp(tmpl);
  auto made = makeBusyboxErofs(h.base, std::vector<std::string>(std::begin(kApplets), std::end(kApplets)));
  if (!made.ok()) {
    h.layer.error = made.error().message();
    return;
  }
  const std::string& image = *made;
  std::string mnt = h.base + "/mnt";
  mkdir(mnt.c_str(), 0755);
  if (mount(image.c_str(), mnt.c_str(), "erofs", MS_RDONLY, nullptr) < 0) {
    if (errno == ENODEV || errno == ENOTBLK) {
      h.layer.skip_reason = std::string("kernel lacks file-backed EROFS mounts: ") + strerror(errno);
    } else {
      h.layer.error = std::string("file-backed EROFS mount failed: ") + strerror(errno);
    }
    return;
  }
  h.layer.mount_dir = mnt;
}

}  // namespace

const TestLayer& busyboxLayer() {
  static LayerHolder holder;
  static std::once_flag once;
  std::call_once(once, [] { buildLayer(holder); });
  return holder.layer;
}

void ContainerTest::SetUp() {
  const TestLayer& layer = busyboxLayer();
  if (!layer.skip_reason.empty()) GTEST_SKIP() << layer.skip_reason;
  ASSERT_TRUE(layer.error.empty()) << layer.error;
  backend_ = newBackend();
  ASSERT_TRUE(backend_);
  auto missing = backend_->missingFeatures();
  if (!missing.empty()) GTEST_SKIP() << "host lacks: " << missing[0];
}

std::unique_ptr<backends::Backend> ContainerTest::newBackend() {
  backends::ContainerBackendOptions options;
  options.cgroup_parent = kTestCgroupParent;
  options.init_pool_size = init_pool_size_;
  options.egress_never = egress_never_;
  options.dns_upstream = dns_upstream_;
  options.snapshot_max_bytes = snapshot_max_bytes_;
  options.snapshot_max_entries = snapshot_max_entries_;
  auto b = backends::makeContainerBackend(options);
  EXPECT_TRUE(b.ok()) << b.error().toString();
  if (!b.ok()) return nullptr;
  return std::move(b).value();
}

void ContainerTest::TearDown() {
  for (auto& sb : sandboxes_) {
    if (sb) EXPECT_OK(sb->destroy());
  }
  sandboxes_.clear();
}

backends::SandboxSpec ContainerTest::makeSpec() {
  backends::SandboxSpec spec;
  spec.id = "ct-" + randomHex(12);
  spec.image = "busybox:test";
  spec.lower_dirs = {busyboxLayer().mount_dir};
  spec.memory_bytes = 256 << 20;
  spec.pids = 256;
  spec.cpus = 1;
  spec.disk_bytes = 64 << 20;
  return spec;
}

backends::Sandbox& ContainerTest::create(const backends::SandboxSpec& spec) {
  auto sb = backend_->create(spec);
  if (!sb.ok()) {
    ADD_FAILURE() << "create failed: " << sb.error().toString();
    throw std::runtime_error("create failed");
  }
  sandboxes_.push_back(std::move(sb).value());
  return *sandboxes_.back();
}

backends::ExecResult ContainerTest::sh(backends::Sandbox& sb, const std::string& cmd, double timeout) {
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

std::vector<std::string> cgroupDirsOf(const std::string& id) {
  std::vector<std::string> found;
  DIR* d = opendir("/sys/fs/cgroup");
  if (d == nullptr) return found;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    std::string path = std::string("/sys/fs/cgroup/") + name + "/" + kTestCgroupParent + "/" + id;
    if (access(path.c_str(), F_OK) == 0) found.push_back(path);
  }
  closedir(d);
  std::string v2 = std::string("/sys/fs/cgroup/") + kTestCgroupParent + "/" + id;
  if (access(v2.c_str(), F_OK) == 0) found.push_back(v2);
  return found;
}

size_t sandboxMountsInHost(const std::string& id) {
  std::ifstream in("/proc/self/mountinfo");
  size_t n = 0;
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("/run/dsec/container-root") != std::string::npos) ++n;
    if (!id.empty() && line.find(id) != std::string::npos) ++n;
  }
  return n;
}

bool processAlive(pid_t pid) { return kill(pid, 0) == 0 || errno != ESRCH; }

}  // namespace dsec::testing
