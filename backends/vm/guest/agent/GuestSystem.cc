// setup (the sandbox root over the layer disks), restored (a new machine's identity), usage and reclaim.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/random.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <time.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "GuestAgent.h"

namespace dsec::guest {
namespace {

std::string readFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

bool writeText(const std::string& path, const std::string& text) {
  int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  int saved = errno;
  close(fd);
  errno = saved;
  return ok;
}

// Layer i is the disk whose serial is "dsec-layer-<i>" (the host names them: probe order is not attach order on
// every machine type); without serials, the i-th virtio disk.
std::string layerDisk(uint32_t index) {
  std::string want = "dsec-layer-" + std::to_string(index);
  std::vector<std::string> disks;
  if (DIR* d = opendir("/sys/block")) {
    while (dirent* e = readdir(d)) {
      if (strncmp(e->d_name, "vd", 2) == 0) disks.emplace_back(e->d_name);
    }
    closedir(d);
  }
  for (const auto& disk : disks) {
    if (readFirstLine("/sys/block/" + disk + "/serial") == want) return "/dev/" + disk;
  }
  return std::string("/dev/vd") + static_cast<char>('a' + index);
}

int mountAt(const std::string& source, const std::string& target, const char* type, unsigned long flags,
            const std::string& data) {
  mkdir(target.c_str(), 0755);
  if (mount(source.c_str(), target.c_str(), type, flags, data.empty() ? nullptr : data.c_str()) != 0) return errno;
  return 0;
}

int64_t memTotalBytes() {
  struct sysinfo si {};
  if (sysinfo(&si) != 0) return 0;
  return static_cast<int64_t>(si.totalram) * si.mem_unit;
}

int setupSandbox(const proto::SetupMsg& m, std::string* why) {
  // The disks probe as the modules load: wait a little for each.
  std::vector<std::string> layers;
  for (uint32_t i = 0; i < m.layer_disks; ++i) {
    std::string dev;
    for (int tries = 0; tries < 100; ++tries) {
      dev = layerDisk(i);
      if (access(dev.c_str(), F_OK) == 0) break;
      usleep(50 * 1000);
    }
    std::string dir = "/layers/" + std::to_string(i);
    mkdir("/layers", 0755);
    if (int err = mountAt(dev, dir, "erofs", MS_RDONLY | MS_NODEV | MS_NOSUID, ""); err != 0) {
      *why = "mounting layer " + std::to_string(i) + " (" + dev + ")";
      return err;
    }
    layers.push_back(dir);
  }
  if (layers.empty()) {
    mkdir("/layers", 0755);
    mkdir("/layers/empty", 0755);
    layers.push_back("/layers/empty");
  }
  int64_t upper = m.upper_bytes > 0 ? m.upper_bytes : memTotalBytes() / 2;
  if (int err = mountAt("upper", "/upper", "tmpfs", MS_NODEV | MS_NOSUID, "mode=0755,size=" + std::to_string(upper));
      err != 0) {
    *why = "mounting the upper tmpfs";
    return err;
  }
  mkdir("/upper/root", 0755);
  mkdir("/upper/work", 0755);
  std::string lower;
  for (auto it = layers.rbegin(); it != layers.rend(); ++it) lower += (lower.empty() ? "" : ":") + *it;
  if (int err = mountAt("overlay", kSandboxRoot, "overlay", 0,
                        "lowerdir=" + lower + ",upperdir=/upper/root,workdir=/upper/work");
      err != 0) {
    *why = "mounting the overlay root";
    return err;
  }
  std::string root = kSandboxRoot;
  struct Sub {
    const char* dir;
    const char* source;
    const char* type;
    unsigned long flags;
    const char* data;
  };
  const Sub subs[] = {{"/proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, ""},
                      {"/sys", "sysfs", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, ""},
                      {"/dev", "/dev", nullptr, MS_BIND | MS_REC, ""},
                      {"/tmp", "tmpfs", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777"}};
  for (const auto& s : subs) {
    if (int err = mountAt(s.source, root + s.dir, s.type, s.flags, s.data); err != 0) {
      *why = std::string("mounting the sandbox's ") + s.dir;
      return err;
    }
  }
  // Every command joins this cgroup before it execs; its pids.max is the sandbox's limit.
  writeText("/sys/fs/cgroup/cgroup.subtree_control", "+pids");
  if (mkdir(kSandboxCgroup, 0755) != 0 && errno != EEXIST) {
    *why = "making the sandbox cgroup";
    return errno;
  }
  if (!writeText(std::string(kSandboxCgroup) + "/pids.max", m.pids > 0 ? std::to_string(m.pids) : "max")) {
    *why = "setting pids.max";
    return errno;
  }
  if (!m.hostname.empty() && sethostname(m.hostname.data(), m.hostname.size()) != 0) {
    *why = "sethostname";
    return errno;
  }
  int root_fd = open(kSandboxRoot, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (root_fd < 0) {
    *why = "opening the sandbox root";
    return errno;
  }
  std::lock_guard lock(sandbox().mu);
  sandbox().root_fd = root_fd;
  sandbox().hostname = m.hostname;
  sandbox().env = m.env;
  sandbox().ready = true;
  return 0;
}

}  // namespace

void handleSetup(Port& port, const proto::Frame& frame) {
  proto::SetupMsg m;
  if (!m.decode(frame.payload)) {
    port.sendError(frame.request, EINVAL, "malformed setup request");
    return;
  }
  static std::mutex setup_mu;  // one setup at a time; a second one finds the first's result
  std::lock_guard once(setup_mu);
  {
    std::lock_guard lock(sandbox().mu);
    if (sandbox().ready) {
      port.sendError(frame.request, EEXIST, "the sandbox is already set up");
      return;
    }
  }
  std::string why;
  int err = setupSandbox(m, &why);
  if (err != 0) {
    port.sendError(frame.request, err, why + ": " + strerror(err));
    return;
  }
  if (!m.init.empty()) {
    // Returns only if the init could not be started; the agent beside it answers otherwise.
    port.sendError(frame.request, ENOEXEC, handOffInit(port, frame.request, m));
    return;
  }
  port.send(proto::FrameType::kOk, frame.request, {});
}

void handleRestored(Port& port, const proto::Frame& frame) {
  proto::RestoredMsg m;
  if (!m.decode(frame.payload)) {
    port.sendError(frame.request, EINVAL, "malformed restored request");
    return;
  }
  if (!m.hostname.empty() && sethostname(m.hostname.data(), m.hostname.size()) != 0) {
    port.sendError(frame.request, errno, std::string("sethostname: ") + strerror(errno));
    return;
  }
  if (m.wall_clock_ns > 0) {
    timespec ts{static_cast<time_t>(m.wall_clock_ns / 1000000000), static_cast<long>(m.wall_clock_ns % 1000000000)};
    if (clock_settime(CLOCK_REALTIME, &ts) != 0) {
      port.sendError(frame.request, errno, std::string("clock_settime: ") + strerror(errno));
      return;
    }
  }
  if (!m.entropy.empty()) {
    std::string buf(sizeof(rand_pool_info) + m.entropy.size(), '\0');
    auto* info = reinterpret_cast<rand_pool_info*>(buf.data());
    info->entropy_count = static_cast<int>(m.entropy.size() * 8);
    info->buf_size = static_cast<int>(m.entropy.size());
    memcpy(buf.data() + sizeof(rand_pool_info), m.entropy.data(), m.entropy.size());
    int fd = open("/dev/random", O_WRONLY | O_CLOEXEC);
    int rc = fd < 0 ? -1 : ioctl(fd, RNDADDENTROPY, info);
    int err = errno;
    if (fd >= 0) close(fd);
    if (rc != 0) {
      port.sendError(frame.request, err, std::string("RNDADDENTROPY: ") + strerror(err));
      return;
    }
  }
  if (!m.hostname.empty()) {
    std::lock_guard lock(sandbox().mu);
    sandbox().hostname = m.hostname;
  }
  port.send(proto::FrameType::kOk, frame.request, {});
}

void handleUsage(Port& port, const proto::Frame& frame) {
  proto::UsageMsg m;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t value = 0, total = 0, available = 0;
  std::string unit;
  while (meminfo >> key >> value) {
    std::getline(meminfo, unit);
    if (key == "MemTotal:") total = value * 1024;
    if (key == "MemAvailable:") available = value * 1024;
  }
  m.memory_used = total > available ? total - available : 0;
  std::string pids = readFirstLine(std::string(kSandboxCgroup) + "/pids.current");
  m.pids = pids.empty() ? 0 : std::strtoll(pids.c_str(), nullptr, 10);
  port.send(proto::FrameType::kUsageReply, frame.request, m.encode());
}

void handleReclaim(Port& port, const proto::Frame& frame) {
  sync();
  bool ok = writeText("/proc/sys/vm/drop_caches", "3");
  int err = errno;
  // Compaction gathers free pages into blocks that free page reporting hands back; not every kernel has it.
  writeText("/proc/sys/vm/compact_memory", "1");
  if (!ok) {
    port.sendError(frame.request, err, std::string("drop_caches: ") + strerror(err));
    return;
  }
  port.send(proto::FrameType::kOk, frame.request, {});
}

}  // namespace dsec::guest
