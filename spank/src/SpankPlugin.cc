// spank_dsec.so: runs Slurm job steps inside dsec sandboxes (srun/sbatch/salloc --dsec-image=IMAGE ...).
//
// Where each piece happens (Slurm 22.05 calls the plugin in srun/sbatch/salloc, slurmd and slurmstepd):
//  - srun/sbatch/salloc (local/allocator, the user): options are parsed and validated, so a bad image name,
//    size or mount fails at submission with a message.
//  - slurmstepd (remote, root), slurm_spank_init_post_opt: one sandbox per step per node, before any task.
//    A failure (unknown layer, missing mount source ...) is only recorded: failing here would drain the node
//    for a user's mistake.
//  - each task, slurm_spank_task_init_privileged (root): a recorded failure fails the task with the message
//    (srun prints it and exits non-zero; a batch job fails); otherwise the task joins the sandbox and is held
//    to the sandbox's bounding set, no_new_privs and seccomp filter (TaskLockdown.h) before Slurm drops to
//    the job's user.
//  - each task, slurm_spank_task_init (the user): fork into the sandbox's PID namespace (see TaskJoin.h).
//  - slurmstepd, slurm_spank_exit: the sandbox is destroyed, however the step ended.
//  - job epilog (root, per node): sandboxes of the job that a killed slurmstepd left behind are reaped.
//
// C boundary rules: every callback catches everything; no global constructors (state is created on first
// use); no threads anywhere; only slurm_spank_* and plugin_* symbols are exported (version script).
extern "C" {
#include <slurm/spank.h>
}

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "MountSource.h"
#include "SpankConfig.h"
#include "StepSandbox.h"
#include "TaskJoin.h"
#include "TaskLockdown.h"
#include "dsec/common/Logging.h"
#include "dsec/launcher/node/JobOwnership.h"

extern "C" {
extern const char plugin_name[] = "dsec";
extern const char plugin_type[] = "spank";
extern const unsigned int plugin_version = SLURM_VERSION_NUMBER;
extern const unsigned int spank_plugin_version = 1;
}

namespace dsec::spank {
namespace {

// Set in the local context when --dsec-mount was given more than once: Slurm forwards only the last value
// of an option to slurmstepd, so the whole list travels in the job environment.
constexpr const char* kMountsEnv = "_DSEC_SPANK_MOUNTS";

struct PluginState {
  PluginArgs args;
  RawOptions raw;
  bool active = false;                   // remote: this step runs in a sandbox
  std::string failure;                   // remote: why the sandbox could not be made (fails every task)
  std::unique_ptr<StepSandbox> sandbox;  // remote
};

PluginState* g_state = nullptr;  // created in slurm_spank_init; one per process (one step per slurmstepd)

PluginState& state() {
  if (g_state == nullptr) g_state = new PluginState();
  return *g_state;
}

template <typename F>
int guarded(const char* callback, F&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    slurm_error("dsec: %s: unexpected error: %s", callback, e.what());
  } catch (...) {
    slurm_error("dsec: %s: unexpected error", callback);
  }
  return -1;
}

int optionCallback(OptionId id, const char* optarg, int remote) {
  return guarded("option", [&] {
    std::string value = optarg != nullptr ? optarg : "";
    if (!remote) {
      // Local (srun/sbatch/salloc): reject a bad value right away. Slurm adds "Invalid --dsec-x argument".
      if (auto s = validateOption(id, value); !s.ok()) {
        slurm_error("dsec: --%s=%s: %s", optionTable()[static_cast<int>(id)].name, value.c_str(),
                    s.error().message().c_str());
        return -1;
      }
    }
    state().raw.set(id, std::move(value));
    return 0;
  });
}

int onImage(int, const char* arg, int remote) { return optionCallback(OptionId::kImage, arg, remote); }
int onBackend(int, const char* arg, int remote) { return optionCallback(OptionId::kBackend, arg, remote); }
int onMem(int, const char* arg, int remote) { return optionCallback(OptionId::kMem, arg, remote); }
int onWorkdir(int, const char* arg, int remote) { return optionCallback(OptionId::kWorkdir, arg, remote); }
int onMount(int, const char* arg, int remote) { return optionCallback(OptionId::kMount, arg, remote); }
int onNet(int, const char* arg, int remote) { return optionCallback(OptionId::kNet, arg, remote); }

spank_opt_cb_f callbackFor(OptionId id) {
  switch (id) {
    case OptionId::kImage:
      return onImage;
    case OptionId::kBackend:
      return onBackend;
    case OptionId::kMem:
      return onMem;
    case OptionId::kWorkdir:
      return onWorkdir;
    case OptionId::kMount:
      return onMount;
    case OptionId::kNet:
      return onNet;
    case OptionId::kCount:
      break;
  }
  return nullptr;
}

int registerOptions(spank_t sp) {
  for (const auto& info : optionTable()) {
    // Slurm keeps the pointer: the struct must live as long as the plugin (leaked on purpose, six of them).
    auto* opt = new spank_option{const_cast<char*>(info.name),  const_cast<char*>(info.arginfo),
                                 const_cast<char*>(info.usage), 1,
                                 static_cast<int>(info.id),     callbackFor(info.id)};
    spank_err_t rc = spank_option_register(sp, opt);
    if (rc != ESPANK_SUCCESS) {
      slurm_error("dsec: cannot register --%s: %s", info.name, spank_strerror(rc));
      return -1;
    }
  }
  return 0;
}

std::optional<std::string> jobEnv(spank_t sp, const char* name) {
  std::vector<char> buf(8192);
  for (int attempt = 0; attempt < 2; ++attempt) {
    spank_err_t rc = spank_getenv(sp, name, buf.data(), static_cast<int>(buf.size()));
    if (rc == ESPANK_SUCCESS) return std::string(buf.data());
    if (rc != ESPANK_NOSPACE) return std::nullopt;
    buf.resize(size_t{256} * 1024);
  }
  return std::nullopt;
}

std::optional<std::string> processEnv(const char* name) {
  const char* v = getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

std::string shortHostname() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) < 0) return "node";
  std::string s = name;
  auto dot = s.find('.');
  if (dot != std::string::npos) s.resize(dot);
  return s;
}

// The job's user and groups, as slurmstepd gives them to the tasks: --dsec-mount sources are opened with
// them. Slurm 22.05 sends the supplementary groups with the launch; if it did not, they come from the
// user database the way slurmstepd's initgroups() would find them.
Result<JobCredentials> jobCredentials(spank_t sp) {
  JobCredentials creds;
  if (spank_get_item(sp, S_JOB_UID, &creds.uid) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_GID, &creds.gid) != ESPANK_SUCCESS) {
    return Error::internal("cannot read the job's uid and gid from Slurm");
  }
  gid_t* gids = nullptr;
  int ngids = 0;
  if (spank_get_item(sp, S_JOB_SUPPLEMENTARY_GIDS, &gids, &ngids) == ESPANK_SUCCESS && gids != nullptr && ngids > 0) {
    creds.groups.assign(gids, gids + ngids);
    return creds;
  }
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* found = nullptr;
  if (getpwuid_r(creds.uid, &pw, buf.data(), buf.size(), &found) != 0 || found == nullptr) {
    creds.groups = {creds.gid};  // no name to look groups up by: the primary group only (never more)
    return creds;
  }
  int n = 64;
  for (int attempt = 0; attempt < 4; ++attempt) {
    creds.groups.resize(static_cast<size_t>(n));
    int want = n;
    if (getgrouplist(pw.pw_name, creds.gid, creds.groups.data(), &want) >= 0) {
      creds.groups.resize(static_cast<size_t>(want));
      return creds;
    }
    n = want > n ? want : n * 4;
  }
  return Error::internal("cannot list the groups of uid " + std::to_string(creds.uid));
}

// srun / sbatch / salloc, after every option is parsed.
int localPostOpt(spank_t, bool allocator) {
  PluginState& st = state();
  auto resolved = resolveOptions(st.raw, processEnv, st.args);
  if (!resolved.ok()) {
    slurm_error("dsec: %s", resolved.error().message().c_str());
    return -1;
  }
  if (st.raw.mounts.size() > 1) setenv(kMountsEnv, mountsToString(resolved->mounts).c_str(), 1);
  // salloc: later sruns in the allocation inherit the choice through the environment defaults.
  if (allocator && std::string(program_invocation_short_name) == "salloc" && !resolved->image.empty()) {
    for (const auto& info : optionTable()) {
      const auto& v = st.raw.get(info.id);
      if (v) setenv(info.env, info.id == OptionId::kMount ? mountsToString(resolved->mounts).c_str() : v->c_str(), 1);
    }
  }
  return 0;
}

// slurmstepd: make the step's sandbox. Never fails the callback (that would drain the node); a failure is
// recorded and reported by every task.
int remotePostOpt(spank_t sp) {
  PluginState& st = state();
  uint32_t job_id = 0, step_id = 0;
  if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_STEPID, &step_id) != ESPANK_SUCCESS) {
    st.failure = "dsec: cannot read the job and step id from Slurm";
    return 0;
  }
  if (step_id == kExternStep) return 0;  // the extern step has no tasks of the user's

  RawOptions raw = st.raw;
  if (auto all = jobEnv(sp, kMountsEnv)) {
    raw.mounts.clear();
    raw.set(OptionId::kMount, *all);
    spank_unsetenv(sp, kMountsEnv);
  }
  auto resolved = resolveOptions(
      raw, [&](const char* name) { return jobEnv(sp, name); }, st.args);
  if (!resolved.ok()) {
    st.failure = "dsec: " + resolved.error().message();
    return 0;
  }
  if (resolved->image.empty()) return 0;
  st.active = true;

  auto creds = jobCredentials(sp);
  if (!creds.ok()) {
    st.failure = "dsec: " + creds.error().message();
    return 0;
  }
  StepIdentity id{shortHostname(), job_id, step_id};
  uint64_t alloc_mb = 0;
  if (spank_get_item(sp, S_STEP_ALLOC_MEM, &alloc_mb) != ESPANK_SUCCESS) alloc_mb = 0;
  std::vector<MountSpec> extra;
  if (step_id == kBatchStep) {
    // The batch script lives in slurmd's spool directory: make it visible, read-only, at the same path.
    int argc = 0;
    char** argv = nullptr;
    if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) == ESPANK_SUCCESS && argc > 0 && argv[0] != nullptr &&
        argv[0][0] == '/') {
      std::string script = argv[0];
      extra.push_back({script.substr(0, script.rfind('/')), script.substr(0, script.rfind('/')), true});
    }
  }
  auto sandbox = StepSandbox::create(st.args, *resolved, id, *creds, static_cast<int64_t>(alloc_mb) << 20, extra);
  if (!sandbox.ok()) {
    st.failure = "dsec: cannot start a sandbox of image " + resolved->image + " on " + id.node + ": " +
                 sandbox.error().message();
    slurm_info("%s", st.failure.c_str());  // slurmd's log, for the admin
    return 0;
  }
  st.sandbox = std::move(sandbox).value();
  slurm_verbose("dsec: step %u.%u runs in sandbox %s (image %s)", job_id, step_id, st.sandbox->id().c_str(),
                resolved->image.c_str());
  return 0;
}

// What the job's fleet agents (dsec-launch, dsec serve) left on this node: their sandboxes, cgroups and layer
// mounts, found from the claims they leave in /run/dsec/jobs. Here and not in slurm.conf's Epilog: the plugin
// is on every node already, runs as root after every process of the job is gone, whatever ended the job.
void cleanUpFleetJob(uint32_t job_id) {
  std::string job = std::to_string(job_id);
  auto report = launcher::cleanUpSlurmJob(launcher::kJobRegistryDir, job, launcher::currentHostName());
  if (!report.ok()) {
    slurm_info("dsec: job %u: cleaning up its fleet sandboxes: %s", job_id, report.error().message().c_str());
    return;
  }
  if (report->sandboxes > 0 || report->leftovers > 0 || report->mounts > 0) {
    slurm_info(
        "dsec: job %u ended: destroyed %d fleet sandbox(es) and %d unrecorded cgroup(s), released %d layer "
        "mount(s)",
        job_id, report->sandboxes, report->leftovers, report->mounts);
  }
  for (const auto& note : report->notes) slurm_info("dsec: job %u: %s", job_id, note.c_str());
}

}  // namespace
}  // namespace dsec::spank

using dsec::spank::guarded;
using dsec::spank::state;

extern "C" int slurm_spank_init(spank_t sp, int ac, char** av) {
  return guarded("init", [&] {
    // Our library code logs to stderr, which is srun's terminal or slurmstepd's void: keep it to errors.
    dsec::setLogLevel(dsec::LogLevel::kError);
    auto& st = state();
    std::vector<std::string> args(av, av + ac);
    auto parsed = dsec::spank::parsePluginArgs(args);
    if (!parsed.ok()) {
      slurm_error("dsec: %s", parsed.error().message().c_str());
      return -1;
    }
    st.args = *parsed;
    switch (spank_context()) {
      case S_CTX_LOCAL:
      case S_CTX_REMOTE:
      case S_CTX_ALLOCATOR:
        return dsec::spank::registerOptions(sp);
      default:
        return 0;
    }
  });
}

extern "C" int slurm_spank_init_post_opt(spank_t sp, int, char**) {
  return guarded("init_post_opt", [&] {
    switch (spank_context()) {
      case S_CTX_LOCAL:
        return dsec::spank::localPostOpt(sp, false);
      case S_CTX_ALLOCATOR:
        return dsec::spank::localPostOpt(sp, true);
      case S_CTX_REMOTE:
        return dsec::spank::remotePostOpt(sp);
      default:
        return 0;
    }
  });
}

extern "C" int slurm_spank_task_init_privileged(spank_t, int, char**) {
  return guarded("task_init_privileged", [&] {
    auto& st = state();
    if (!st.failure.empty()) {
      slurm_error("%s", st.failure.c_str());
      return -1;
    }
    if (!st.active || !st.sandbox) return 0;
    if (auto s = dsec::spank::joinSandbox(st.sandbox->joinTarget()); !s.ok()) {
      slurm_error("dsec: cannot enter sandbox %s: %s", st.sandbox->id().c_str(), s.error().message().c_str());
      return -1;
    }
    // Last: from here on the task cannot gain privileges by execve, and the filter holds what Slurm still
    // does in it before the exec (see TaskLockdown.h for why that is safe).
    if (auto s = dsec::spank::lockDownTask(st.sandbox->taskPolicy()); !s.ok()) {
      slurm_error("dsec: cannot restrict the task to sandbox %s: %s", st.sandbox->id().c_str(),
                  s.error().message().c_str());
      return -1;
    }
    return 0;
  });
}

extern "C" int slurm_spank_task_init(spank_t sp, int, char**) {
  return guarded("task_init", [&] {
    auto& st = state();
    if (!st.active || !st.sandbox) return 0;
    const std::string& workdir = st.sandbox->joinTarget().workdir;
    if (auto s = dsec::spank::enterWorkdir(workdir); !s.ok()) {
      slurm_error("dsec: %s", s.error().message().c_str());
      return -1;
    }
    spank_setenv(sp, "PWD", workdir.c_str(), 1);
    if (auto s = dsec::spank::forkIntoPidNamespace(); !s.ok()) {
      slurm_error("dsec: %s", s.error().message().c_str());
      return -1;
    }
    return 0;
  });
}

extern "C" int slurm_spank_exit(spank_t, int, char**) {
  return guarded("exit", [&] {
    if (spank_context() != S_CTX_REMOTE) return 0;
    auto& st = state();
    if (!st.sandbox) return 0;
    if (auto s = st.sandbox->destroy(); !s.ok()) {
      slurm_error("dsec: destroying sandbox %s: %s", st.sandbox->id().c_str(), s.error().message().c_str());
    }
    st.sandbox.reset();
    return 0;
  });
}

extern "C" int slurm_spank_job_epilog(spank_t sp, int ac, char** av) {
  return guarded("job_epilog", [&] {
    // The epilog is a process of its own in which slurm_spank_init is not called: parse the arguments here.
    auto args = dsec::spank::parsePluginArgs(std::vector<std::string>(av, av + ac));
    if (!args.ok()) return 0;  // reported where it matters (slurm_spank_init in srun, slurmd, slurmstepd)
    uint32_t job_id = 0;
    if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS) return 0;
    auto reaped = dsec::spank::reapJobLeftovers(*args, dsec::spank::shortHostname(), job_id);
    if (!reaped.ok()) {
      slurm_info("dsec: job %u: reaping leftover sandboxes: %s", job_id, reaped.error().message().c_str());
    } else if (*reaped > 0) {
      slurm_info("dsec: job %u: reaped %d sandbox(es) left by a killed slurmstepd", job_id, *reaped);
    }
    dsec::spank::cleanUpFleetJob(job_id);
    return 0;  // never fail the epilog: that drains the node
  });
}
