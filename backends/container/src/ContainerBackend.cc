#include "dsec/backends/container/ContainerBackend.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "ContainerSandbox.h"
#include "InitPool.h"
#include "InitProtocol.h"
#include "SeccompFilter.h"
#include "Spawn.h"
#include "dsec/backends/BackendKind.h"
#include "dsec/common/Fault.h"
#include "dsec/common/FdIo.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"

namespace dsec::backends {
namespace {

namespace proto = init_protocol;

constexpr double kReadyTimeoutSeconds = 10;
// How long a create that found no id range free waits for the init the pool's refill is starting with one.
constexpr double kInFlightInitWaitSeconds = 5;
constexpr const char* kScratchDir = "/run/dsec/container-root";

// Agent-side create steps, in order.
constexpr const char* kAgentFaults[] = {"container.cgroup_create", "container.clone", "container.send_config",
                                        "container.wait_ready", "container.open_root"};

bool validId(const std::string& id) {
  if (id.empty() || id.size() > 64) return false;  // also the hostname (HOST_NAME_MAX)
  for (char c : id) {
    if (!(isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) return false;
  }
  return id[0] != '.' && id[0] != '-';
}

// Paths end up in overlay mount options and the line-based init config.
Status validateMountPath(const std::string& what, const std::string& path) {
  if (path.empty() || path[0] != '/') return Error::invalid(what + " must be an absolute path: " + path);
  if (path.find_first_of(",:\n\\") != std::string::npos || path.find('\0') != std::string::npos) {
    return Error::invalid(what + " contains a character overlayfs cannot take (, : \\ newline): " + path);
  }
  struct stat st;
  if (::stat(path.c_str(), &st) < 0 || !S_ISDIR(st.st_mode)) {
    return Error(ErrorCode::kInvalidArgument, what + " is not a directory: " + path, errno);
  }
  return okStatus();
}

Status validateSpec(const SandboxSpec& spec) {
  if (!validId(spec.id)) return Error::invalid("bad sandbox id (1-64 of [A-Za-z0-9._-]): " + spec.id);
  if (spec.lower_dirs.empty()) return Error::invalid("sandbox needs at least one layer");
  if (spec.lower_dirs.size() > static_cast<size_t>(proto::kMaxLowers)) return Error::invalid("too many layers");
  for (const auto& d : spec.lower_dirs) DSEC_TRY(validateMountPath("layer dir", d));
  if (!spec.upper_dir.empty()) DSEC_TRY(validateMountPath("upper dir", spec.upper_dir));
  if (spec.memory_bytes < 0 || spec.pids < 0 || spec.disk_bytes < 0 || spec.cpus < 0) {
    return Error::invalid("limits must not be negative");
  }
  if (spec.memory_bytes > 0 && spec.memory_bytes < (4 << 20)) return Error::invalid("memory limit below 4 MiB");
  if (!spec.egress.rules.empty() && spec.network != NetworkMode::kEgress) {
    return Error::invalid("an egress policy needs network \"egress\" (a network link)");
  }
  DSEC_TRY(parseProtectedPaths(spec.protected_paths));
  for (const auto& [k, v] : spec.env) {
    if (k.empty() || k.find_first_of("=\0", 0, 2) != std::string::npos || v.find('\0') != std::string::npos) {
      return Error::invalid("bad environment variable: " + k);
    }
  }
  return okStatus();
}

std::string buildInitConfig(const SandboxSpec& spec, int64_t disk_bytes, const std::vector<sock_filter>& bpf,
                            const std::optional<EgressLink>& egress) {
  std::string c;
  std::string fault = armedFault();
  if (startsWith(fault, proto::kFaultPrefix)) c += "fail_at " + fault.substr(strlen(proto::kFaultPrefix)) + "\n";
  c += "hostname " + spec.id + "\n";
  c += std::string("scratch ") + kScratchDir + "\n";
  c += "lowers " + std::to_string(spec.lower_dirs.size()) + "\n";
  if (!spec.upper_dir.empty()) c += "upper_fd 1\n";
  c += "disk_bytes " + std::to_string(disk_bytes) + "\n";
  c += std::string("network ") + networkModeName(spec.network) + "\n";
  if (egress) c += "egress " + egress->address + " " + egress->gateway + " " + egress->netmask + "\n";
  if (egress && !egress->resolver.empty()) c += "nameserver " + egress->resolver + "\n";
  if (spec.read_only_root) c += "read_only_root 1\n";
  c += "bpf " + std::to_string(bpf.size()) + "\n";
  c.append(reinterpret_cast<const char*>(bpf.data()), bpf.size() * sizeof(sock_filter));
  return c;
}

// The mounts init builds the root from: the layers (read-only) and, for layer builds, the host directory that
// holds the upper; idmapped to the sandbox's user namespace when it has one.
Result<std::vector<UniqueFd>> sandboxMounts(const SandboxSpec& spec, int userns_fd) {
  std::vector<UniqueFd> mounts;
  for (const auto& dir : spec.lower_dirs) {
    DSEC_ASSIGN_OR_RETURN(UniqueFd m, detachedMount(dir, userns_fd, true));
    mounts.push_back(std::move(m));
  }
  if (!spec.upper_dir.empty()) {
    DSEC_ASSIGN_OR_RETURN(UniqueFd m, detachedMount(spec.upper_dir, userns_fd, false));
    mounts.push_back(std::move(m));
  }
  return mounts;
}

// Sends the config to init: the mounts ride on its first byte, then the rest, then EOF. An init that died
// meanwhile (killed from outside while it waited in the pool) gives an error here, never a SIGPIPE.
Status sendConfig(int fd, const std::string& data, const std::vector<UniqueFd>& mounts) {
  std::vector<int> fds;
  for (const auto& m : mounts) fds.push_back(m.get());
  DSEC_ASSIGN_OR_RETURN(size_t n, sendWithFds(fd, std::string_view(data).substr(0, 1), fds, "config to init"));
  if (n != 1) return Error::sys(EIO, "short send of the config to init");
  DSEC_TRY(sendAll(fd, std::string_view(data).substr(1), "config to init"));
  if (::shutdown(fd, SHUT_WR) < 0) return Error::sys(errno, "finish config to init");
  return okStatus();
}

CgroupLimits sandboxLimits(const SandboxSpec& spec, bool cpu_qos) {
  CgroupLimits limits;
  limits.memory_bytes = spec.memory_bytes;
  limits.cpus = spec.cpus;
  limits.pids = spec.pids;
  limits.cpuset_cpus = spec.cpuset_cpus;
  limits.cpuset_mems = spec.cpuset_mems;
  if (cpu_qos && spec.qos == CpuQos::kBatch) {
    limits.cpu_weight = kBatchCpuWeight;
    limits.cpu_idle = true;
  }
  return limits;
}

// Puts init into the sandbox cgroup (from the host: inside its user namespace it may not write the host's cgroup
// files). On v1 these are `tasks` files: moving a single-threaded process by pid skips the global threadgroup lock.
Status moveIntoCgroup(const Cgroup& cgroup, pid_t pid) {
  const std::string value = std::to_string(pid);
  for (const auto& f : cgroupJoinFiles(cgroup)) {
    UniqueFd fd(open(f.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd) return Error::sys(errno, "open " + f);
    if (write(fd.get(), value.data(), value.size()) != static_cast<ssize_t>(value.size())) {
      return Error::sys(errno, "move init into " + f);
    }
  }
  return okStatus();
}

// Moves init into its cgroup and gives it the sandbox's CPU scheduling policy: pooled inits start before their
// QoS is known, so it is set now, before init runs its setup.
Status placeInit(const SandboxSpec& spec, bool cpu_qos, const Cgroup& cgroup, pid_t pid) {
  DSEC_TRY(moveIntoCgroup(cgroup, pid));
  if (int policy = sandboxSchedPolicy(spec, cpu_qos); policy >= 0) {
    sched_param param{};
    if (sched_setscheduler(pid, policy, &param) < 0) return Error::sys(errno, "set init's scheduling policy");
  }
  return okStatus();
}

// Reads init's one status line (line: what of it was read already); an error names the failed step.
Status waitReady(int status_fd, std::string line, double timeout_seconds) {
  const double deadline = monotonicSeconds() + timeout_seconds;
  char buf[512];
  while (line.find('\n') == std::string::npos) {
    double left = deadline - monotonicSeconds();
    if (left <= 0)
      return Error(ErrorCode::kTimeout, "sandbox init not ready after " + std::to_string(timeout_seconds) + " s");
    pollfd p{status_fd, POLLIN, 0};
    int rc = poll(&p, 1, static_cast<int>(left * 1000) + 1);
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return Error::sys(errno, "poll init status");
    if (rc == 0) continue;
    ssize_t n = read(status_fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error::sys(errno, "read init status");
    if (n == 0)
      return Error(ErrorCode::kSystem, "sandbox init exited during setup" + (line.empty() ? "" : ": " + line));
    line.append(buf, static_cast<size_t>(n));
  }
  line.resize(line.find('\n'));
  if (line == "ok") return okStatus();
  // "err STEP ERRNO MESSAGE"
  auto parts = split(line, ' ');
  if (parts.size() >= 3 && parts[0] == "err") {
    int err = atoi(parts[2].c_str());
    std::string msg = line.substr(std::min(line.size(), parts[0].size() + parts[1].size() + parts[2].size() + 3));
    std::string text = "sandbox init step " + parts[1] + ": " + msg;
    if (err != 0) text += ": " + std::string(strerror(err));
    return Error(ErrorCode::kSystem, text, err);
  }
  return Error(ErrorCode::kSystem, "sandbox init sent a bad status: " + line);
}

UniqueFd openProcRoot(pid_t pid) {
  return UniqueFd(open(("/proc/" + std::to_string(pid) + "/root").c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
}

Result<ino_t> pidNamespaceOf(const std::string& pid) {
  struct stat st;
  if (::stat(("/proc/" + pid + "/ns/pid").c_str(), &st) < 0) return Error::sys(errno, "stat pid namespace");
  return st.st_ino;
}

pid_t parentOf(pid_t pid) {
  auto stat = readFile("/proc/" + std::to_string(pid) + "/stat");
  if (!stat.ok()) return -1;
  size_t paren = stat->rfind(')');  // comm may contain spaces and parentheses
  if (paren == std::string::npos) return -1;
  auto fields = split(stat->substr(paren + 2), ' ');  // state ppid ...
  return fields.size() > 1 ? static_cast<pid_t>(atoi(fields[1].c_str())) : -1;
}

// The QoS of an adopted sandbox: from its state when recorded there, else from the kernel (init of a batch
// sandbox runs SCHED_IDLE, and the cgroup keeps the cpuset), so its later execs get the same policy.
Status restoreQos(const nlohmann::json& spec_json, pid_t init_pid, SandboxSpec& spec) {
  try {
    if (spec_json.contains("qos")) {
      spec.qos = spec_json.at("qos").get<std::string>() == "latency" ? CpuQos::kLatency : CpuQos::kBatch;
      spec.cpuset_cpus = spec_json.value("cpuset_cpus", "");
      spec.cpuset_mems = spec_json.value("cpuset_mems", "");
      return okStatus();
    }
  } catch (const nlohmann::json::exception& e) {
    return Error::invalid(std::string("bad qos in container sandbox state: ") + e.what());
  }
  int policy = sched_getscheduler(init_pid);
  spec.qos = policy == SCHED_IDLE ? CpuQos::kBatch : CpuQos::kLatency;
  return okStatus();
}

std::string findInit(const ContainerBackendOptions& options) {
  if (!options.init_path.empty()) return options.init_path;
  std::vector<std::string> candidates = {selfExeDir() + "/dsec-sandbox-init",
                                         selfExeDir() + "/../libexec/dsec/dsec-sandbox-init"};
#ifdef DSEC_SANDBOX_INIT_BUILD_PATH
  candidates.push_back(DSEC_SANDBOX_INIT_BUILD_PATH);
#endif
  for (const auto& c : candidates) {
    if (access(c.c_str(), X_OK) == 0) return c;
  }
  return candidates[0];
}

class ContainerBackend : public Backend {
 public:
  explicit ContainerBackend(std::shared_ptr<ContainerShared> shared)
      : shared_(std::move(shared)),
        init_pool_(static_cast<size_t>(std::max(0, shared_->options.init_pool_size)), initKind(NetworkMode::kNone)) {}

  std::string name() const override { return backendKindName(BackendKind::kContainer); }

  std::vector<std::string> missingFeatures() const override {
    std::vector<std::string> missing;
    if (access(shared_->options.init_path.c_str(), X_OK) != 0) {
      missing.push_back("dsec-sandbox-init not found at " + shared_->options.init_path);
    }
    if (shared_->options.commands && access(shared_->spawner_path.c_str(), X_OK) != 0) {
      missing.push_back("dsec-sandbox-spawner not found at " + shared_->spawner_path);
    }
    auto fs = readFile("/proc/filesystems");
    if (!fs.ok() || fs->find("\toverlay\n") == std::string::npos) missing.push_back("overlayfs");
    if (!fs.ok() || fs->find("\ttmpfs\n") == std::string::npos) missing.push_back("tmpfs");
    open_how how{};
    how.flags = O_PATH | O_CLOEXEC;
    int fd = static_cast<int>(syscall(SYS_openat2, AT_FDCWD, "/", &how, sizeof how));
    if (fd < 0) {
      missing.push_back("openat2 (Linux >= 5.6)");
    } else {
      close(fd);
    }
    fd = static_cast<int>(syscall(SYS_pidfd_open, getpid(), 0));
    if (fd < 0) {
      missing.push_back("pidfd_open (Linux >= 5.3)");
    } else {
      close(fd);
    }
    for (const char* ns : {"mnt", "pid", "net", "uts", "ipc", "cgroup"}) {
      if (access((std::string("/proc/self/ns/") + ns).c_str(), F_OK) != 0)
        missing.push_back(std::string(ns) + " namespace");
    }
    if (geteuid() != 0) missing.push_back("root privileges");
    if (!shared_->userns_problem.empty()) {
      missing.push_back(shared_->userns_problem +
                        " (sandbox root would be host root: the node runs no sandboxes unless its operator opts out "
                        "with --user-namespaces off)");
    }
    return missing;
  }

  Result<std::unique_ptr<Sandbox>> create(const SandboxSpec& spec) override {
    DSEC_TRY(validateSpec(spec));
    if (spec.network == NetworkMode::kHost && !shared_->options.allow_host_network) {
      return Error::invalid("sandboxes never share the host's network; use network \"egress\" for a route out");
    }
    const double start = monotonicSeconds();
    std::unique_ptr<Cgroup> cgroup;
    InitProcess init;
    // Undo everything done so far; whatever step failed, nothing is left behind.
    auto fail = [&](const Error& e) -> Error {
      (void)killAndWaitInit(init, kReadyTimeoutSeconds);
      if (cgroup) {
        (void)cgroup->killAll();
        Status removed = cgroup->remove();
        if (!removed.ok())
          DSEC_LOG(kWarn, "container") << "cleanup of " << spec.id << ": " << removed.error().toString();
      }
      return e.wrap("create sandbox " + spec.id);
    };

    if (auto s = checkFault("container.cgroup_create"); !s.ok()) return fail(s.error());
    auto made = shared_->cgroups->create(spec.id, sandboxLimits(spec, shared_->options.cpu_qos));
    if (!made.ok()) return made.error().wrap("create sandbox " + spec.id);
    cgroup = std::move(made).value();

    if (auto s = checkFault("container.clone"); !s.ok()) return fail(s.error());
    auto idle = idleInitFor(spec);
    if (!idle.ok()) return fail(idle.error());
    init.pid = idle->process.pid;
    init.pidfd = std::move(idle->process.pidfd);
    init.is_child = true;
    if (idle->userns) init.host_root = idle->host_base;
    init.lease = std::move(idle->lease);
    if (auto s = placeInit(spec, shared_->options.cpu_qos, *cgroup, init.pid); !s.ok()) return fail(s.error());

    if (auto s = checkFault("container.send_config"); !s.ok()) return fail(s.error());
    int64_t disk = spec.disk_bytes > 0 ? spec.disk_bytes : shared_->options.default_disk_bytes;
    std::optional<EgressLink> link;
    if (auto s = configureInit(spec, disk, *idle, init.pid, &link); !s.ok()) return fail(s.error());
    UniqueFd status_r = std::move(idle->status_r);
    std::string status_read = std::move(idle->status_read);

    if (auto s = checkFault("container.wait_ready"); !s.ok()) return fail(s.error());
    if (auto s = waitReady(status_r.get(), std::move(status_read), kReadyTimeoutSeconds); !s.ok())
      return fail(s.error());

    if (auto s = checkFault("container.open_root"); !s.ok()) return fail(s.error());
    // The file API opens it per operation; that it opens is part of a working sandbox.
    if (!openProcRoot(init.pid)) return fail(Error::sys(errno, "open sandbox root"));
    auto started = processStartTime(init.pid);
    if (!started.ok()) return fail(started.error());
    init.start_time = *started;

    {
      std::lock_guard lock(shared_->mu);
      shared_->live.insert(spec.id);
    }
    SandboxSpec stored = spec;
    if (stored.disk_bytes == 0) stored.disk_bytes = disk;
    if (auto parsed = parseProtectedPaths(spec.protected_paths); parsed.ok()) stored.protected_paths = *parsed;
    auto sandbox =
        std::make_unique<ContainerSandbox>(shared_, std::move(stored), std::move(init), std::move(cgroup), false, 0);
    // Before anything runs in it (nothing inside holds a reference from before, and nothing of the caller's could
    // use the link): its protection and its egress policy.
    Status guarded = okStatus();
    if (!spec.protected_paths.empty()) guarded = sandbox->setProtectedPaths(sandbox->spec().protected_paths);
    if (guarded.ok() && link) {
      in_addr address{}, resolver{};
      inet_pton(AF_INET, link->address.c_str(), &address);
      inet_pton(AF_INET, link->resolver.c_str(), &resolver);
      guarded = sandbox->enforceEgress(spec.egress, ntohl(address.s_addr), ntohl(resolver.s_addr));
    }
    if (!guarded.ok()) {
      (void)sandbox->destroy();
      return guarded.error().wrap("create sandbox " + spec.id);
    }
    DSEC_LOG(kDebug, "container") << "created " << spec.id << " in " << (monotonicSeconds() - start) * 1000 << " ms";
    return std::unique_ptr<Sandbox>(std::move(sandbox));
  }

  // A container's snapshot is a layer: the node stacks it on the image and calls create().
  Result<std::unique_ptr<Sandbox>> restore(const SandboxSpec& spec, const std::string& /*dir*/) override {
    return Error(ErrorCode::kUnsupported, "sandbox " + spec.id + ": container snapshots are restored as a layer");
  }

  Result<std::unique_ptr<Sandbox>> adopt(const nlohmann::json& state) override {
    pid_t pid;
    uint64_t start_time;
    std::string cgroup_name;
    bool paused;
    // A record another backend wrote (the "backend" key is older than this check, so every record has it).
    if (state.value("backend", "") != backendKindName(BackendKind::kContainer)) {
      return Error::invalid("not a container sandbox state: backend " + state.value("backend", std::string("(none)")));
    }
    try {
      pid = state.at("init_pid").get<pid_t>();
      start_time = state.at("init_start_time").get<uint64_t>();
      cgroup_name = state.at("cgroup").get<std::string>();
      paused = state.value("paused", false);
    } catch (const nlohmann::json::exception& e) {
      return Error::invalid(std::string("bad container sandbox state: ") + e.what());
    }
    DSEC_ASSIGN_OR_RETURN(SandboxSpec spec, specFromJson(state.at("spec")));
    DSEC_TRY(restoreQos(state.at("spec"), pid, spec));
    auto gone = [&](const std::string& why) {
      return Error::notFound("sandbox " + spec.id + " cannot be adopted: " + why);
    };
    if (pid <= 1) return gone("bad init pid");
    InitProcess init;
    init.pid = pid;
    init.start_time = start_time;
    init.pidfd.reset(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
    if (!init.pidfd) return gone("init is not running");
    // With the pidfd held, the pid cannot be recycled any more: check it is still the same process.
    auto now = processStartTime(pid);
    if (!now.ok() || *now != start_time) return gone("init pid was reused");
    auto theirs = pidNamespaceOf(std::to_string(pid));
    auto ours = pidNamespaceOf("self");
    if (!theirs.ok() || !ours.ok() || *theirs == *ours) return gone("process is not a sandbox init");
    auto cgroup = shared_->cgroups->open(cgroup_name);
    if (!cgroup.ok()) return gone("cgroup missing: " + cgroup.error().message());
    if (!openProcRoot(pid)) return gone("cannot open its root");
    init.is_child = parentOf(pid) == getpid();  // adopted back by the same process (tests): reap it ourselves
    if (state.value("user_namespace", false)) {
      auto host_root = hostRootOf(pid);
      if (!host_root.ok()) return gone("its user namespace has no root: " + host_root.error().message());
      init.host_root = *host_root;
      // Hold its range again as the agent that made it did; a range not handed out here needs no lease of ours.
      if (shared_->id_ranges) {
        auto lease = shared_->id_ranges->adopt(*host_root, init.pidfd.get());
        if (lease.ok()) {
          init.lease = std::move(lease->hold);
        } else if (lease.error().code() != ErrorCode::kNotFound) {
          return gone(lease.error().message());
        }
      }
    }
    int64_t oom_kills = 0;
    if (auto st = (*cgroup)->stats(); st.ok()) oom_kills = st->oom_kills;
    {
      std::lock_guard lock(shared_->mu);
      shared_->live.insert(spec.id);
    }
    // The protection's mounts live in the sandbox; the list of them comes back from the record.
    std::vector<std::string> protected_paths;
    try {
      protected_paths = state.value("protected_paths", std::vector<std::string>{});
    } catch (const nlohmann::json::exception& e) {
      return Error::invalid(std::string("bad protected paths in container sandbox state: ") + e.what());
    }
    DSEC_ASSIGN_OR_RETURN(protected_paths, parseProtectedPaths(protected_paths));
    const NetworkMode network = spec.network;
    EgressPolicy spec_egress = spec.egress;
    auto sandbox = std::make_unique<ContainerSandbox>(shared_, std::move(spec), std::move(init), std::move(*cgroup),
                                                      paused, oom_kills, std::move(protected_paths));
    sandbox->rewatchProtectedPaths();
    if (network == NetworkMode::kEgress) {
      // Its policy as it was last set (the programs of the agent before kept enforcing it meanwhile).
      auto current = parseEgressPolicy(state.value("egress", spec_egress.texts()));
      if (!current.ok()) return current.error().wrap("adopt " + sandbox->spec().id);
      if (auto s = sandbox->enforceEgress(*current, state.value("egress_address", uint32_t{0}),
                                          state.value("egress_resolver", uint32_t{0}), true);
          !s.ok()) {
        return s.error().wrap("adopt " + sandbox->spec().id);
      }
    }
    return std::unique_ptr<Sandbox>(std::move(sandbox));
  }

  Status reap(const nlohmann::json& state) override {
    std::string cgroup_name;
    pid_t pid = 0;
    uint64_t start_time = 0;
    try {
      cgroup_name = state.at("cgroup").get<std::string>();
      pid = state.value("init_pid", 0);
      start_time = state.value("init_start_time", uint64_t{0});
    } catch (const nlohmann::json::exception& e) {
      return Error::invalid(std::string("bad container sandbox state: ") + e.what());
    }
    if (pid > 1 && validId(cgroup_name)) {
      InitProcess init;
      init.pid = pid;
      init.pidfd.reset(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
      auto now = processStartTime(pid);
      // Anyone can read a pid's start time: the pid is only signalled while it is in the sandbox's own cgroup, so
      // a forged record (a job's epilog reaps as root) cannot make the reaper kill a process outside the sandbox.
      if (init.pidfd && now.ok() && *now == start_time && inCgroup(cgroup_name, pid)) {
        DSEC_TRY(killAndWaitInit(init, kReadyTimeoutSeconds));
      }
    }
    return reapCgroup(cgroup_name);
  }

  Result<std::vector<std::string>> listLeftovers() override {
    // The agent asks once it has adopted what it could: earlier agents' egress directories it emptied go.
    removeStaleEgressDirs(*shared_);
    DSEC_ASSIGN_OR_RETURN(std::vector<std::string> names, shared_->cgroups->list());
    std::lock_guard lock(shared_->mu);
    std::vector<std::string> out;
    for (auto& n : names) {
      if (!shared_->live.count(n)) out.push_back(std::move(n));
    }
    return out;
  }

  Status reapLeftover(const std::string& id) override {
    if (!validId(id)) return Error::invalid("bad sandbox id: " + id);
    {
      std::lock_guard lock(shared_->mu);
      if (shared_->live.count(id)) return Error(ErrorCode::kConflict, "sandbox " + id + " is live, not a leftover");
    }
    return reapCgroup(id);
  }

 private:
  // A pooled init when there is one (every pooled init has a network namespace of its own), else one started now.
  Result<IdleInit> idleInitFor(const SandboxSpec& spec) {
    std::optional<IdleInit> idle;
    if (spec.network != NetworkMode::kHost) idle = init_pool_.take();
    if (idle) return std::move(*idle);
    auto own = spawnIdleInit(initKind(spec.network));
    if (!own.ok() && own.error().code() == ErrorCode::kResourceExhausted && spec.network != NetworkMode::kHost) {
      // The pool's refill may hold what this create needs (the node's last free id range): its init is as good.
      if (auto in_flight = init_pool_.takeInFlight(kInFlightInitWaitSeconds)) return std::move(*in_flight);
    }
    return own;
  }

  // Hands init what it builds the sandbox from: the config (with the egress link, made now that init's network
  // namespace exists) and the mounts of the layers. Closes init's config socket.
  Status configureInit(const SandboxSpec& spec, int64_t disk_bytes, IdleInit& idle, pid_t init_pid,
                       std::optional<EgressLink>* link) {
    DSEC_ASSIGN_OR_RETURN(std::vector<UniqueFd> mounts, sandboxMounts(spec, idle.userns.get()));
    std::optional<EgressLink>& egress = *link;
    if (spec.network == NetworkMode::kEgress) {
      // The filter first: a link is only made where its policy can be enforced.
      DSEC_TRY(startedEgressFilter(*shared_));
      DSEC_ASSIGN_OR_RETURN(egress, shared_->egress->attach(init_pid));
      in_addr resolver{htonl(resolverAddress(*shared_))};
      char text[INET_ADDRSTRLEN] = {};
      egress->resolver = inet_ntop(AF_INET, &resolver, text, sizeof text);
    }
    const std::string config = buildInitConfig(spec, disk_bytes, shared_->seccomp, egress);
    DSEC_TRY(sendConfig(idle.config.get(), config, mounts));
    idle.config.reset();
    return okStatus();
  }

  bool inCgroup(const std::string& name, pid_t pid) {
    auto cgroup = shared_->cgroups->open(name);
    if (!cgroup.ok()) return false;
    auto pids = (*cgroup)->pids();
    return pids.ok() && std::find(pids->begin(), pids->end(), pid) != pids->end();
  }

  Status reapCgroup(const std::string& name) {
    auto cgroup = shared_->cgroups->open(name);
    if (!cgroup.ok()) {
      if (cgroup.error().code() == ErrorCode::kNotFound) return okStatus();
      return cgroup.error();
    }
    (void)(*cgroup)->thaw();
    DSEC_TRY((*cgroup)->killAll());
    return (*cgroup)->remove();
  }

  InitKind initKind(NetworkMode network) const {
    InitKind kind;
    kind.init_path = shared_->options.init_path;
    kind.id_ranges = shared_->id_ranges.get();
    kind.userns_owned_by_root = shared_->userns_owned_by_root;
    kind.network_namespace = network != NetworkMode::kHost;
    // Without commands (SPANK steps) no spawner runs; such a process holds few fds anyway.
    if (shared_->options.commands) kind.spawner = shared_->spawner.get();
    return kind;
  }

  std::shared_ptr<ContainerShared> shared_;
  InitPool init_pool_;
};

}  // namespace

std::string egressSupportProblem() { return EgressNetwork::supportProblem(); }

std::vector<std::string> containerCreateFaultPoints() {
  std::vector<std::string> out(std::begin(kAgentFaults), std::end(kAgentFaults));
  for (const char* step : proto::kSteps) out.push_back(std::string(proto::kFaultPrefix) + step);
  return out;
}

Result<std::unique_ptr<Backend>> makeContainerBackend(const ContainerBackendOptions& options) {
  // A process that runs sandboxes is never readable through /proc or ptrace by anything but host root, whatever
  // else it holds (tokens, other sandboxes' requests), and never dumps core.
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) return Error::sys(errno, "make the process undumpable");
  auto shared = std::make_shared<ContainerShared>();
  shared->options = options;
  shared->options.init_path = findInit(options);
  DSEC_ASSIGN_OR_RETURN(shared->cgroups, detectCgroupDriver(options.cgroup_parent));
  DSEC_ASSIGN_OR_RETURN(shared->seccomp, buildSandboxSeccompFilter());
  if (shared->seccomp.size() > static_cast<size_t>(proto::kMaxBpfInstructions)) {
    return Error::internal("seccomp filter too large for init");
  }
  shared->scratch_dir = kScratchDir;
  DSEC_TRY(makeDirs(kScratchDir, 0755));
  shared->keep_caps = defaultSandboxCaps();
  if (options.user_namespace == UserNamespaceMode::kPrivate) {
    IdRangeOptions ranges;
    ranges.lease_dir = options.id_lease_dir;
    ranges.first_host_id = options.id_range_first;
    ranges.count = options.id_range_count;
    shared->id_ranges = std::make_unique<IdRangeAllocator>(ranges);
    DSEC_TRY(shared->id_ranges->prepare());
    UserNamespaceSupport support = probeUserNamespaces(kScratchDir);
    shared->userns_problem = support.problem;
    shared->userns_owned_by_root = !support.unprivileged_owner;
    if (support.problem.empty() && !support.unprivileged_owner) {
      DSEC_LOG(kWarn, "container") << "this kernel refuses user namespaces made by unprivileged ids: sandboxes' "
                                      "namespaces are made by root, so their per-user kernel counts (inotify "
                                      "instances, namespaces, message queues) are charged to root";
    }
  }
  if (!options.dns_upstream.empty()) DSEC_TRY(parseIp4Endpoint(options.dns_upstream));
  shared->egress = std::make_unique<EgressNetwork>(options.egress_subnet);
  shared->join_fds = std::make_unique<JoinFdCache>(static_cast<size_t>(std::max(0, options.join_fd_cache_sandboxes)));
  shared->spawner_path = findSpawner();
  shared->spawner = std::make_unique<Spawner>(shared->spawner_path, shared->seccomp);
  return std::unique_ptr<Backend>(std::make_unique<ContainerBackend>(std::move(shared)));
}

}  // namespace dsec::backends
