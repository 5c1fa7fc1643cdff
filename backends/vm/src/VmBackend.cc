#include "dsec/backends/vm/VmBackend.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>
#include <mutex>

#include "QemuCommand.h"
#include "VmLaunch.h"
#include "VmSandbox.h"
#include "VmSnapshotFiles.h"
#include "dsec/backends/vm/ImageKernel.h"
#include "dsec/backends/vm/Initramfs.h"
#include "dsec/common/Directory.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"

namespace dsec::backends::vm {
namespace {

constexpr const char* kLog = "vm";
constexpr int64_t kMinMemoryBytes = 128ll << 20;
constexpr int kMaxCpus = 64;
// QEMU's own threads (vCPUs, I/O, RCU) are all it may run: spawn is denied by its seccomp filter anyway.
constexpr int64_t kQemuPids = 256;
constexpr double kMonitorTimeout = 30;

std::string getenvOr(const char* name, const std::string& fallback) {
  const char* v = ::getenv(name);  // NOLINT(concurrency-mt-unsafe): read-only use
  return v != nullptr ? std::string(v) : fallback;
}

double wallClockSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::string randomBytes(size_t n) {
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::getrandom(out.data() + got, n - got, 0);
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  return out;
}

bool isPlainHostname(const std::string& name) {
  return !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) != 0 || ch == '-' || ch == '.';
  });
}

Status validateSpec(const SandboxSpec& spec, const std::string& kind) {
  if (spec.id.empty()) return Error::invalid("sandbox without an id");
  if (spec.lower_files.empty()) return Error::invalid(kind + " sandbox needs at least one layer file");
  if (spec.network != NetworkMode::kNone) {
    return Error(ErrorCode::kUnsupported,
                 kind + " sandboxes have no network yet: use the container backend for egress");
  }
  if (!spec.protected_paths.empty()) {
    return Error(ErrorCode::kUnsupported, "protected paths are not available in " + kind + " sandboxes");
  }
  if (!spec.upper_dir.empty()) return Error(ErrorCode::kUnsupported, kind + " sandboxes keep their upper in the guest");
  if (spec.read_only_root) return Error(ErrorCode::kUnsupported, kind + " sandboxes have no read-only root mode");
  if (spec.cpus > kMaxCpus) return Error::invalid(kind + " sandboxes have at most 64 CPUs");
  for (const auto& f : spec.lower_files) {
    if (f.find(',') != std::string::npos) return Error::invalid("layer file path with a comma: " + f);
  }
  return okStatus();
}

// One initramfs per agent binary and guest kernel, shared by every backend on the host: a node that is killed
// leaves nothing of its own behind, and the file (a few MiB of tmpfs) is written again only when the agent or the
// kernel changes. Named by a hash of what it is made of.
Result<std::string> sharedInitramfs(const std::string& shared_dir, const std::string& agent,
                                    const std::string& kernel_dir) {
  struct stat agent_st {};
  struct stat order_st {};
  if (::stat(agent.c_str(), &agent_st) != 0) return Error::sys(errno, "stat " + agent);
  const std::string order = kernel_dir + "/modules.order";
  if (::stat(order.c_str(), &order_st) != 0) return Error::sys(errno, "stat " + order);
  auto version = readFile(kernel_dir + "/VERSION");
  std::string key = agent + "\n" + std::to_string(agent_st.st_size) + "\n" + std::to_string(agent_st.st_mtim.tv_sec) +
                    "." + std::to_string(agent_st.st_mtim.tv_nsec) + "\n" + kernel_dir + "\n" +
                    std::to_string(order_st.st_mtim.tv_sec) + "." + std::to_string(order_st.st_mtim.tv_nsec) + "\n" +
                    (version.ok() ? *version : std::string());
  uint64_t hash = 14695981039346656037ull;  // FNV-1a
  for (unsigned char c : key) hash = (hash ^ c) * 1099511628211ull;
  char name[64];
  std::snprintf(name, sizeof name, "/initramfs-%016llx.cpio", static_cast<unsigned long long>(hash));
  const std::string path = shared_dir + name;
  if (::access(path.c_str(), R_OK) == 0) return path;
  DSEC_TRY(writeInitramfs(path, agent, kernel_dir));  // written aside and renamed into place
  return path;
}

class VmBackend : public Backend {
 public:
  explicit VmBackend(std::shared_ptr<VmShared> shared) : shared_(std::move(shared)) {}
  ~VmBackend() override {
    // The run root and its parent go when no sandbox's run dir is left in them (rmdir fails on a directory that is
    // not empty). The initramfs is shared by every backend of the host (sharedInitramfs) and stays.
    const std::string& root = shared_->options.run_root;
    if (::rmdir(root.c_str()) == 0) {
      std::string parent = root.substr(0, root.rfind('/'));
      (void)::rmdir(parent.c_str());
    }
  }

  std::string name() const override { return backendKindName(shared_->options.kind); }
  std::vector<std::string> missingFeatures() const override { return {}; }

  Result<std::unique_ptr<Sandbox>> create(const SandboxSpec& spec) override {
    DSEC_TRY(validateSpec(spec, name()));
    Boot boot;
    boot.memory_bytes = spec.memory_bytes > 0 ? spec.memory_bytes : shared_->options.default_memory_bytes;
    if (boot.memory_bytes < kMinMemoryBytes)
      return Error::invalid(name() + " sandboxes need at least 128 MiB of memory");
    boot.cpus = std::max(1, static_cast<int>(std::ceil(spec.cpus)));
    auto files = bootFiles(spec);
    if (!files.ok()) return files.error().wrap("create sandbox " + spec.id);
    boot.files = std::move(files).value();
    auto made = start(spec, boot);
    if (!made.ok()) return made.error().wrap("create sandbox " + spec.id);
    return made;
  }

  Result<std::unique_ptr<Sandbox>> restore(const SandboxSpec& spec, const std::string& dir) override {
    DSEC_TRY(validateSpec(spec, name()));
    DSEC_ASSIGN_OR_RETURN(VmSnapshotInfo info, readSnapshotInfo(dir));
    if (info.kind != name()) {
      return Error::invalid("snapshot of a " + info.kind + " sandbox cannot be restored as " + name());
    }
    if (info.layers != static_cast<int>(spec.lower_files.size())) {
      return Error::invalid("snapshot has " + std::to_string(info.layers) + " layers, the image " +
                            std::to_string(spec.lower_files.size()));
    }
    DSEC_ASSIGN_OR_RETURN(BootFiles files, bootFiles(spec));
    if (files.kernel_release != info.kernel_release) {
      auto named = [](const std::string& r) { return r.empty() ? std::string("dsec's guest kernel") : "kernel " + r; };
      return Error::invalid("snapshot was taken under " + named(info.kernel_release) + ", the image boots " +
                            named(files.kernel_release));
    }
    Boot boot;
    boot.files = std::move(files);
    boot.memory_bytes = info.memory_bytes;
    boot.cpus = info.cpus;
    boot.snapshot_dir = dir;
    boot.snapshot_ram = info.ram_file;
    auto made = start(spec, boot);
    if (!made.ok()) return made.error().wrap("restore sandbox " + spec.id + " from " + dir);
    return made;
  }

  Result<std::unique_ptr<Sandbox>> adopt(const nlohmann::json& state) override {
    if (!state.is_object() || state.value("backend", "") != name() || !state.contains("id")) {
      return Error::notFound("not a " + name() + " sandbox's state");
    }
    try {
      SandboxSpec spec;
      spec.id = state.at("id").get<std::string>();
      spec.image = state.value("image", "");
      spec.memory_bytes = state.at("memory_bytes").get<int64_t>();
      spec.disk_bytes = state.value("disk_bytes", int64_t{0});
      spec.pids = state.value("pids", int64_t{0});
      spec.lower_files = state.value("lower_files", std::vector<std::string>{});
      VmMachine m;
      m.run_dir = state.at("run_dir").get<std::string>();
      m.pid = state.at("pid").get<pid_t>();
      m.start_time = state.at("start_time").get<uint64_t>();
      m.host_base = state.at("host_base").get<uint32_t>();
      m.memory_bytes = spec.memory_bytes;
      m.cpus = state.value("cpus", 1);
      m.ram_shared = state.value("ram_shared", true);
      m.kernel_release = state.value("kernel_release", "");
      m.our_child = false;
      DSEC_TRY(checkRunDir(m.run_dir, spec.id));
      auto started = processStartTime(m.pid);
      if (!started.ok() || *started != m.start_time) return Error::notFound("QEMU of " + spec.id + " is gone");
      DSEC_ASSIGN_OR_RETURN(m.pidfd, pidfdOpen(m.pid));
      DSEC_ASSIGN_OR_RETURN(m.cgroup, shared_->cgroups->open(spec.id));
      DSEC_ASSIGN_OR_RETURN(auto lease, shared_->id_ranges->adopt(m.host_base, m.pidfd.get()));
      m.lease = std::move(lease.hold);
      DSEC_ASSIGN_OR_RETURN(auto qmp, QmpClient::connect(monitorSocketPath(m.run_dir), 10));
      DSEC_ASSIGN_OR_RETURN(auto status, qmp.execute("query-status", nullptr, kMonitorTimeout));
      bool running = status.is_object() && status.value("running", false);
      std::unique_ptr<AgentChannel> channel;
      if (running) {
        DSEC_ASSIGN_OR_RETURN(auto ports, connectPorts(m.run_dir, 10));
        DSEC_ASSIGN_OR_RETURN(channel, AgentChannel::connect(std::move(ports), 30));
      }
      return std::unique_ptr<Sandbox>(
          std::make_unique<VmSandbox>(shared_, std::move(spec), std::move(m), std::move(qmp), std::move(channel),
                                      running ? SandboxState::kRunning : SandboxState::kPaused));
    } catch (const nlohmann::json::exception& e) {
      return Error::notFound(std::string("unreadable ") + name() + " state: " + e.what());
    }
  }

  Status reap(const nlohmann::json& state) override {
    if (!state.is_object() || !state.contains("id") || !state["id"].is_string()) return okStatus();
    return reapLeftover(state["id"].get<std::string>());
  }

  Result<std::vector<std::string>> listLeftovers() override {
    std::vector<std::string> ids;
    auto entries = listDirectory(runRoot());
    if (!entries.ok()) return ids;  // nothing was ever run here
    for (const auto& e : *entries) {
      struct stat st {};
      std::string path = runRoot() + "/" + e.name;
      if (::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) ids.push_back(e.name);
    }
    return ids;
  }

  Status reapLeftover(const std::string& id) override {
    if (id.empty() || id.find('/') != std::string::npos || id == "." || id == "..") return Error::invalid("bad id");
    VmMachine m;
    m.our_child = false;
    if (auto cg = shared_->cgroups->open(id); cg.ok()) m.cgroup = std::move(cg).value();
    std::string dir = runRoot() + "/" + id;
    if (::access(dir.c_str(), F_OK) == 0) m.run_dir = dir;
    teardownMachine(m);
    return okStatus();
  }

 private:
  // What the machine boots: dsec's guest kernel, or (vm sandboxes) the image's own kernel and init.
  struct BootFiles {
    std::string kernel;
    std::string initrd;
    std::string init;            // the image's init to hand PID 1 to; "" : the agent stays PID 1
    std::string kernel_release;  // "" : dsec's guest kernel
  };
  struct Boot {
    BootFiles files;
    int64_t memory_bytes = 0;
    int cpus = 1;
    std::string snapshot_dir;  // a restore: the state and (snapshot_ram) the RAM come from here
    bool snapshot_ram = false;
  };

  std::string runRoot() const { return shared_->options.run_root; }

  // A vm sandbox whose image has a kernel boots it (ImageKernel.h); microVMs, and images without one, boot dsec's.
  // Found once per image (its layers never change) and remembered.
  Result<BootFiles> bootFiles(const SandboxSpec& spec) {
    BootFiles dsec_kernel{shared_->kernel, shared_->initrd, "", ""};
    if (shared_->options.kind != BackendKind::kVm || spec.lower_dirs.empty()) return dsec_kernel;
    std::string key;
    for (const auto& d : spec.lower_dirs) key += d + "\n";
    {
      std::lock_guard lock(boot_mu_);
      auto it = boot_cache_.find(key);
      if (it != boot_cache_.end() && ::access(it->second.kernel.c_str(), R_OK) == 0 &&
          ::access(it->second.initrd.c_str(), R_OK) == 0) {
        return it->second;
      }
    }
    DSEC_ASSIGN_OR_RETURN(UniqueFd view, openImageView(spec.lower_dirs));
    DSEC_ASSIGN_OR_RETURN(auto found, findImageKernel(view.get()));
    BootFiles files = dsec_kernel;
    if (found) {
      DSEC_ASSIGN_OR_RETURN(std::string dir, prepareImageKernelDir(view.get(), *found, shared_->options.shared_dir));
      DSEC_ASSIGN_OR_RETURN(files.initrd, sharedInitramfs(shared_->options.shared_dir, shared_->agent, dir));
      files.kernel = dir + "/vmlinuz";
      files.init = found->init;
      files.kernel_release = found->release;
      DSEC_LOG(kInfo, kLog) << "image " << spec.image << " boots its own kernel " << found->release
                            << (found->init.empty() ? "" : " and init " + found->init);
    }
    std::lock_guard lock(boot_mu_);
    boot_cache_[key] = files;
    return files;
  }

  Status checkRunDir(const std::string& dir, const std::string& id) const {
    if (dir != runRoot() + "/" + id) return Error::notFound("run dir " + dir + " is not this backend's");
    return okStatus();
  }

  Result<std::unique_ptr<Sandbox>> start(const SandboxSpec& spec, const Boot& boot) {
    VmMachine m;
    m.memory_bytes = boot.memory_bytes;
    m.cpus = boot.cpus;
    m.ram_shared = boot.snapshot_dir.empty();
    m.kernel_release = boot.files.kernel_release;
    // Whatever step fails, nothing is left: the machine's teardown kills QEMU and removes the cgroup and run dir.
    struct Undo {
      VmMachine* m;
      bool armed = true;
      ~Undo() {
        if (armed) teardownMachine(*m);
      }
    } undo{&m};

    m.run_dir = runRoot() + "/" + spec.id;
    if (::mkdir(m.run_dir.c_str(), 0700) != 0) {
      int err = errno;
      m.run_dir.clear();  // not ours to remove
      return Error::sys(err, "mkdir run dir");
    }
    DSEC_ASSIGN_OR_RETURN(auto lease, shared_->id_ranges->acquire());
    m.host_base = lease.host_base;
    m.lease = std::move(lease.hold);
    UniqueFd lease_fd = std::move(lease.init_fd);  // QEMU keeps it (fd 5) for as long as any of it runs
    CgroupLimits limits;
    limits.memory_bytes = boot.memory_bytes + shared_->options.overhead_bytes;
    limits.cpus = spec.cpus;
    limits.pids = kQemuPids;
    limits.cpuset_cpus = spec.cpuset_cpus;
    limits.cpuset_mems = spec.cpuset_mems;
    limits.cpu_idle = spec.qos == CpuQos::kBatch;
    DSEC_ASSIGN_OR_RETURN(m.cgroup, shared_->cgroups->create(spec.id, limits));

    QemuConfig c;
    c.kind = shared_->options.kind;
    c.qemu = shared_->options.qemu;
    c.accel = shared_->accel.accel;
    c.cpus = boot.cpus;
    c.memory_bytes = boot.memory_bytes;
    c.kernel = boot.files.kernel;
    c.initrd = boot.files.initrd;
    c.tsc_khz = shared_->tsc_khz;
    c.layer_files = spec.lower_files;
    c.run_dir = m.run_dir;
    c.run_as = m.host_base;
    c.incoming = !boot.snapshot_dir.empty();
    if (!boot.files.init.empty() && isPlainHostname(spec.id)) c.init_hostname = spec.id;
    if (!getenvOr("DSEC_VM_CONSOLE", "").empty()) c.console_log = m.run_dir + "/console.log";
    if (boot.snapshot_ram) {
      c.ram_path = boot.snapshot_dir + "/" + kSnapshotRamFile;  // mapped privately: forks share its pages
      c.ram_shared = false;
    } else {
      // A cold boot's RAM is a file of its own, shared with QEMU (its snapshots copy it). A restore whose RAM comes
      // in the state stream maps its file privately instead: the stream was written with x-ignore-shared, so a
      // shared block would be skipped and refuse the pages it carries.
      c.ram_shared = boot.snapshot_dir.empty();
      c.ram_path = m.run_dir + "/ram";
      UniqueFd ram(::open(c.ram_path.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600));
      if (!ram) return Error::sys(errno, "create the RAM file");
      if (::ftruncate(ram.get(), boot.memory_bytes) != 0) return Error::sys(errno, "size the RAM file");
    }
    DSEC_ASSIGN_OR_RETURN(auto launched, launchQemu(qemuArgv(c), m.cgroup->procsFiles(), lease_fd.get(),
                                                    m.run_dir + "/qemu.log", !c.ram_shared));
    lease_fd.reset();
    m.pid = launched.pid;
    m.pidfd = std::move(launched.pidfd);
    DSEC_ASSIGN_OR_RETURN(m.start_time, processStartTime(m.pid));

    auto qemuFailed = [&](const Error& e) -> Error {
      if (waitExited(m.pidfd.get(), 0.2)) {
        auto log = readFile(m.run_dir + "/qemu.log");
        std::string text = log.ok() ? trim(log->substr(0, 2000)) : "";
        return Error(ErrorCode::kSystem, "QEMU exited: " + (text.empty() ? e.message() : text));
      }
      return e;
    };
    // QEMU makes its monitor socket early; one that exits first (a bad drive, a bad option) fails the create now.
    Result<QmpClient> qmp = Error(ErrorCode::kTimeout, "QEMU's monitor did not come up in 30 s");
    for (const double deadline = monotonicSeconds() + 30; monotonicSeconds() < deadline;) {
      qmp = QmpClient::connect(monitorSocketPath(m.run_dir), 0.25);
      if (qmp.ok() || waitExited(m.pidfd.get(), 0)) break;
    }
    if (!qmp.ok()) return qemuFailed(qmp.error());
    const bool restoring = !boot.snapshot_dir.empty();
    if (restoring) {
      if (auto st = loadState(*qmp, boot.snapshot_dir); !st.ok()) return qemuFailed(st.error());
    }
    auto ports = connectPorts(m.run_dir, 30);
    if (!ports.ok()) return qemuFailed(ports.error());
    auto channel =
        AgentChannel::connect(std::move(ports).value(), restoring ? 30 : shared_->options.boot_timeout_seconds);
    if (!channel.ok()) return qemuFailed(channel.error().wrap("waiting for the guest agent"));
    if (restoring) {
      GuestRestored r;
      r.hostname = spec.id;
      r.wall_clock_unix = wallClockSeconds();
      r.entropy = randomBytes(64);
      if (auto st = (*channel)->restored(r, 30); !st.ok()) return qemuFailed(st.error());
    } else {
      GuestSetup s;
      s.hostname = spec.id;
      s.layer_disks = static_cast<int>(spec.lower_files.size());
      s.upper_bytes = spec.disk_bytes;
      s.pids = spec.pids;
      s.env = spec.env;
      s.init = boot.files.init;
      if (auto st = (*channel)->setup(s, 60); !st.ok()) return qemuFailed(st.error().wrap("guest setup"));
    }
    SandboxSpec stored = spec;
    stored.memory_bytes = boot.memory_bytes;
    undo.armed = false;
    return std::unique_ptr<Sandbox>(std::make_unique<VmSandbox>(shared_, std::move(stored), std::move(m),
                                                                std::move(qmp).value(), std::move(channel).value(),
                                                                SandboxState::kRunning));
  }

  std::shared_ptr<VmShared> shared_;
  std::mutex boot_mu_;
  std::map<std::string, BootFiles> boot_cache_;  // by the image's layer dirs
};

}  // namespace

Result<std::unique_ptr<Backend>> makeVmBackend(const VmBackendOptions& options) {
  if (options.kind != BackendKind::kMicrovm && options.kind != BackendKind::kVm) {
    return Error::invalid("a VM backend is microvm or vm");
  }
  auto shared = std::make_shared<VmShared>();
  shared->options = options;
  const std::string kind = backendKindName(options.kind);
  if (shared->options.run_root.empty()) {
    shared->options.run_root = options.shared_dir + "/" + options.cgroup_parent + "/" + kind;
  }
  if (findProgram(options.qemu).empty() && options.qemu.find('/') == std::string::npos) {
    return Error(ErrorCode::kUnsupported, options.qemu + " is not installed (apt-get install qemu-system-x86)");
  }
  DSEC_ASSIGN_OR_RETURN(shared->accel, chooseAccel(options.accel, options.qemu));
  std::string kernel_dir = options.kernel_dir;
  if (kernel_dir.empty()) {
    DSEC_ASSIGN_OR_RETURN(kernel_dir, findGuestKernelDir());
  }
  shared->kernel = kernel_dir + "/vmlinux";
  if (::access(shared->kernel.c_str(), R_OK) != 0) {
    return Error(ErrorCode::kUnsupported,
                 "no guest kernel at " + shared->kernel + " (tests/install-deps.sh fetches it; or --vm-kernel-dir)");
  }
  std::string agent = options.agent_path;
  if (agent.empty()) {
    DSEC_ASSIGN_OR_RETURN(agent, findGuestAgent());
  }
  // Root's own, or refused: another user's directory here would choose what every VM boots.
  if (auto st = makePrivateDir(shared->options.shared_dir); !st.ok()) {
    return st.error().wrap("the VM backends' shared directory (files every VM boots)");
  }
  DSEC_TRY(makeDirs(shared->options.run_root, 0700));
  if (::chmod(shared->options.run_root.c_str(), 0700) != 0) return Error::sys(errno, "chmod run root");
  DSEC_ASSIGN_OR_RETURN(shared->initrd, sharedInitramfs(shared->options.shared_dir, agent, kernel_dir));
  shared->agent = agent;
  shared->tsc_khz = hostTscKhz();
  DSEC_ASSIGN_OR_RETURN(shared->cgroups, detectCgroupDriver(options.cgroup_parent));
  IdRangeOptions ranges;
  if (!options.id_lease_dir.empty()) ranges.lease_dir = options.id_lease_dir;
  shared->id_ranges = std::make_unique<IdRangeAllocator>(ranges);
  DSEC_TRY(shared->id_ranges->prepare());
  DSEC_LOG(kInfo, kLog) << kind << " backend: " << shared->accel.accel
                        << (shared->accel.note.empty() ? "" : " (" + shared->accel.note + ")");
  return std::unique_ptr<Backend>(std::make_unique<VmBackend>(std::move(shared)));
}

}  // namespace dsec::backends::vm
