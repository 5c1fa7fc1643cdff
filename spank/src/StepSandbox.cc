#include "StepSandbox.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>

#include "BindMounts.h"
#include "dsec/backends/BackendKind.h"
#include "dsec/backends/container/ContainerBackend.h"
#include "dsec/common/Cgroup.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/LayerMounter.h"
#include "dsec/fs3/LayerRef.h"
#include "dsec/fs3/LayerStore.h"

namespace dsec::spank {
namespace {

constexpr size_t kMaxIdLength = 64;
// Node-local (never on a shared layer store): serialises layer mounting between concurrent steps.
constexpr const char* kMountLockDir = "/run/dsec";
constexpr const char* kMountLock = "/run/dsec/spank-layers.lock";

std::string stepName(uint32_t step_id) {
  switch (step_id) {
    case kBatchStep:
      return "batch";
    case kExternStep:
      return "extern";
    case kInteractiveStep:
      return "interactive";
    default:
      return std::to_string(step_id);
  }
}

// dsec-sandbox-init installed next to the plugin wins over the backend's own search (next to the running
// executable, i.e. slurmstepd's directory, then the build tree).
std::string initNextToPlugin() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&sandboxIdFor), &info) == 0 || info.dli_fname == nullptr) return "";
  std::string so = info.dli_fname;
  auto slash = so.rfind('/');
  if (slash == std::string::npos) return "";
  std::string candidate = so.substr(0, slash) + "/dsec-sandbox-init";
  return access(candidate.c_str(), X_OK) == 0 ? candidate : "";
}

Result<std::unique_ptr<backends::Backend>> makeBackend(const PluginArgs& args) {
  backends::ContainerBackendOptions options;
  options.init_path = args.init_path.empty() ? initNextToPlugin() : args.init_path;
  options.cgroup_parent = args.cgroup_parent;
  options.default_disk_bytes = args.disk_bytes;
  // The step's tasks are the job user's own processes, joined from slurmstepd: they need no user namespace (they
  // are unprivileged already), may keep the host's network like any job step, and nothing else is started inside.
  options.user_namespace = backends::UserNamespaceMode::kOff;
  options.allow_host_network = true;
  options.commands = false;
  return backends::makeContainerBackend(options);
}

// Mounts (or reuses) the image's layers and returns their mount points, bottom first. The store, mounter and
// image references are deliberately never released: see the header (layer mounts outlive the step).
Result<std::vector<std::string>> mountImage(const PluginArgs& args, const std::vector<fs3::LayerRef>& layers) {
  auto* store = new fs3::LayerStore(args.root);
  if (auto s = store->checkImage(layers); !s.ok()) {
    delete store;
    if (s.error().code() == ErrorCode::kNotFound) {
      return Error(ErrorCode::kNotFound, s.error().message() + " (layer store " + args.root + ")");
    }
    return s.error();
  }
  DSEC_TRY(makeDirs(kMountLockDir, 0755));
  UniqueFd lock(open(kMountLock, O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!lock) return Error::sys(errno, std::string("open ") + kMountLock);
  while (flock(lock.get(), LOCK_EX) < 0) {
    if (errno != EINTR) return Error::sys(errno, std::string("lock ") + kMountLock);
  }
  auto* mounter = new fs3::LayerMounter(store);
  auto image = mounter->acquire(layers);
  if (!image.ok()) return image.error();
  std::vector<std::string> dirs = (*image)->dirs();
  (void)image->release();  // leaked on purpose
  return dirs;
}

}  // namespace

std::string sandboxPrefixFor(const std::string& node, uint32_t job_id) {
  std::string clean;
  for (char c : node) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
    clean += ok ? c : '_';
  }
  if (clean.empty() || clean[0] == '-' || clean[0] == '_') clean = "n" + clean;
  std::string tail = "-" + std::to_string(job_id) + ".";
  size_t room = kMaxIdLength - tail.size() - 11;  // 11: the longest step name ("interactive")
  if (clean.size() > room) clean.resize(room);
  return clean + tail;
}

std::string sandboxIdFor(const StepIdentity& step) {
  return sandboxPrefixFor(step.node, step.job_id) + stepName(step.step_id);
}

Result<std::unique_ptr<StepSandbox>> StepSandbox::create(const PluginArgs& args, const StepOptions& options,
                                                         const StepIdentity& step, const JobCredentials& job,
                                                         int64_t alloc_memory_bytes,
                                                         const std::vector<MountSpec>& extra_mounts) {
  auto kind = backends::parseBackendKind(options.backend);
  if (!kind.ok() || *kind != backends::BackendKind::kContainer) {
    return Error::invalid("unknown backend " + options.backend);
  }
  auto layers = fs3::parseImageRef(options.image);
  if (!layers.ok()) return layers.error();
  std::unique_ptr<StepSandbox> out(new StepSandbox());
  out->id_ = sandboxIdFor(step);

  DSEC_ASSIGN_OR_RETURN(out->backend_, makeBackend(args));
  DSEC_ASSIGN_OR_RETURN(out->policy_, sandboxTaskPolicy());
  auto missing = out->backend_->missingFeatures();
  if (!missing.empty()) {
    std::string text;
    for (const auto& m : missing) text += (text.empty() ? "" : ", ") + m;
    return Error(ErrorCode::kUnsupported, "this node cannot run container sandboxes: " + text);
  }
  DSEC_ASSIGN_OR_RETURN(std::vector<std::string> lower_dirs, mountImage(args, *layers));

  backends::SandboxSpec spec;
  spec.id = out->id_;
  spec.image = options.image;
  spec.lower_dirs = std::move(lower_dirs);
  spec.memory_bytes = options.memory_bytes > 0 ? options.memory_bytes : alloc_memory_bytes;
  spec.network = options.network;
  auto created = out->backend_->create(spec);
  if (!created.ok() && created.error().code() == ErrorCode::kAlreadyExists) {
    // A sandbox of the same step left behind (slurmstepd killed, then the step id reused after a requeue).
    (void)out->backend_->reapLeftover(spec.id);
    created = out->backend_->create(spec);
  }
  if (!created.ok()) return created.error();
  out->sandbox_ = std::move(created).value();

  // From here on a failure destroys the sandbox again.
  auto fail = [&](const Error& e) -> Error {
    (void)out->sandbox_->destroy();
    return e;
  };
  nlohmann::json state = out->sandbox_->persistentState();
  std::string cgroup_name;
  try {
    out->join_.init_pid = state.at("init_pid").get<pid_t>();
    out->join_.init_start_time = state.at("init_start_time").get<uint64_t>();
    cgroup_name = state.at("cgroup").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    return fail(Error::internal(std::string("container sandbox state: ") + e.what()));
  }
  out->join_.join_network = options.network == backends::NetworkMode::kNone;
  out->join_.workdir = options.workdir;

  // Tasks join the sandbox's cgroup on v1 for every controller but the freezer, which Slurm's
  // proctrack/cgroup uses to find (and signal, and wait for) the step's processes. On v2 there is one
  // hierarchy and Slurm's step cgroup already holds and limits the tasks: they stay there.
  auto driver = detectCgroupDriver(args.cgroup_parent);
  if (!driver.ok()) return fail(driver.error());
  if ((*driver)->version() == 1) {
    auto cgroup = (*driver)->open(cgroup_name);
    if (!cgroup.ok()) return fail(cgroup.error());
    for (const auto& f : (*cgroup)->procsFiles()) {
      if (f.find("/freezer/") == std::string::npos) out->join_.procs_files.push_back(f);
    }
  }

  std::vector<BindRequest> mounts;
  for (const auto& m : extra_mounts) mounts.push_back({m, false});
  for (const auto& m : options.mounts) mounts.push_back({m, true});
  if (!mounts.empty()) {
    auto pidfd = pidfdOpen(out->join_.init_pid);
    if (!pidfd.ok()) return fail(pidfd.error());
    std::string root_path = "/proc/" + std::to_string(out->join_.init_pid) + "/root";
    UniqueFd root(open(root_path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!root) return fail(Error::sys(errno, "open " + root_path));
    if (auto s = bindIntoSandbox(pidfd->get(), root.get(), mounts, job); !s.ok()) return fail(s.error());
  }
  return out;
}

StepSandbox::~StepSandbox() = default;

Status StepSandbox::destroy() {
  if (!sandbox_) return okStatus();
  return sandbox_->destroy();
}

Result<int> reapJobLeftovers(const PluginArgs& args, const std::string& node, uint32_t job_id) {
  // Cheap check first (this runs at the end of every job on the node): any cgroup of this job at all?
  std::string prefix = sandboxPrefixFor(node, job_id);
  DSEC_ASSIGN_OR_RETURN(auto driver, detectCgroupDriver(args.cgroup_parent));
  auto names = driver->list();
  if (!names.ok()) return names.error().code() == ErrorCode::kNotFound ? Result<int>(0) : Result<int>(names.error());
  bool any = false;
  for (const auto& n : *names) any = any || startsWith(n, prefix);
  if (!any) return 0;
  DSEC_ASSIGN_OR_RETURN(auto backend, makeBackend(args));
  DSEC_ASSIGN_OR_RETURN(std::vector<std::string> ids, backend->listLeftovers());
  int reaped = 0;
  Status first;
  for (const auto& id : ids) {
    if (!startsWith(id, prefix)) continue;
    Status s = backend->reapLeftover(id);
    if (s.ok()) {
      ++reaped;
    } else if (first.ok()) {
      first = s;
    }
  }
  if (!first.ok()) return first.error();
  return reaped;
}

}  // namespace dsec::spank
