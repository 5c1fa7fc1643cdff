// The node agent at start-up: re-adopting the sandboxes its records name and reaping what no record accounts for.
#include <algorithm>
#include <set>

#include "dsec/common/Logging.h"
#include "dsec/launcher/node/CpuAllocator.h"
#include "dsec/launcher/node/NodeAgent.h"

namespace dsec::launcher {
namespace {
constexpr const char* kLog = "node";
}  // namespace

Status NodeAgent::adoptAll() {
  auto stored = state_->loadAll();
  if (!stored.ok()) return stored.error().wrap("reading the sandboxes' records");
  // A record a newer dsec wrote names a sandbox that node still owns: stop before reaping anything.
  for (const auto& entry : *stored) {
    if (!entry.record.ok() && entry.record.error().code() == ErrorCode::kUnsupported) {
      return Error(ErrorCode::kUnsupported, "sandbox " + entry.id + ": " + entry.record.error().message() +
                                                "; run that dsec, or destroy its sandboxes with it, before this one");
    }
  }
  int adopted = 0, reaped = 0;
  for (auto& entry : *stored) {
    if (adoptOne(entry)) {
      ++adopted;
    } else {
      ++reaped;
    }
  }
  reaped += reapLeftovers();
  if (auto st = images_->releaseUnused(); !st.ok()) {
    DSEC_LOG(kWarn, kLog) << "unmounting unused layers: " << st.error().toString();
  }
  if (adopted || reaped) DSEC_LOG(kInfo, kLog) << "re-adopted " << adopted << " sandbox(es), reaped " << reaped;
  return okStatus();
}

bool NodeAgent::ownedByThisJob(const std::string& slurm_job) const {
  if (slurm_job == options_.slurm_job) return true;
  return std::find(options_.adopt_jobs.begin(), options_.adopt_jobs.end(), slurm_job) != options_.adopt_jobs.end();
}

bool NodeAgent::adoptOne(StoredState& entry) {
  const std::string& id = entry.id;
  std::string why;
  std::unique_ptr<fs3::ImageMount> mount;
  std::unique_ptr<backends::Sandbox> sandbox;
  if (!entry.record.ok()) {
    why = entry.record.error().message();
  } else if (!ownedByThisJob(entry.record->slurm_job)) {
    // Another job's, which ended without its epilog cleaning up (or never had one): its sandboxes end with it.
    DSEC_LOG(kWarn, kLog) << "sandbox " << id << " belongs to "
                          << (entry.record->slurm_job.empty() ? "no Slurm job" : "Slurm job " + entry.record->slurm_job)
                          << ", not to this agent's "
                          << (options_.slurm_job.empty() ? "(none)" : "job " + options_.slurm_job)
                          << ": reaping it instead of adopting it";
    why = "owned by another job";
  } else if (auto m = images_->acquire(entry.record->params.layers); !m.ok()) {
    why = m.error().toString();
  } else if (auto sb = backendForState(entry.record->backend_state)->adopt(entry.record->backend_state); !sb.ok()) {
    why = sb.error().toString();
  } else {
    mount = std::move(*m);
    sandbox = std::move(*sb);
  }
  if (!sandbox) {
    DSEC_LOG(kInfo, kLog) << "cannot adopt " << id << " (" << why << "), reaping it";
    if (!entry.backend_state.empty()) {
      if (auto st = backendForState(entry.backend_state)->reap(entry.backend_state); !st.ok()) {
        DSEC_LOG(kWarn, kLog) << "reaping " << id << ": " << st.error().toString();
      }
    }
    (void)state_->remove(id);
    return false;
  }
  SandboxStateRecord& record = *entry.record;
  auto rec = std::make_shared<SandboxRecord>();
  rec->id = id;
  rec->params = std::move(record.params);
  rec->timeout = rec->params.timeout;
  rec->created_unix = record.created_unix > 0 ? record.created_unix : wallSeconds();
  rec->touch();
  rec->mount = std::move(mount);
  rec->sandbox = std::move(sandbox);
  if (rec->sandbox->state() == backends::SandboxState::kPaused) {
    // A record without a reason (none is written so) would otherwise show a paused sandbox as running.
    rec->paused_by = record.paused_by == PausedBy::kNone ? PausedBy::kUser : record.paused_by;
  }
  {
    std::lock_guard lock(mu_);
    sandboxes_[id] = rec;
  }
  if (auto st = cpu_->readopt(id, rec->params.qos, rec->params.cpus, record.cpuset); !st.ok()) {
    DSEC_LOG(kWarn, kLog) << "re-adopted " << id << " without its cores: " << st.error().toString();
  }
  if (record.slurm_job != options_.slurm_job) {
    // Taken over from another running job (adopt_jobs): from now on this job owns it and its epilog destroys it.
    DSEC_LOG(kInfo, kLog) << "took sandbox " << id << " over from Slurm job " << record.slurm_job;
    std::lock_guard sandbox_lock(rec->mu);
    if (auto st = persist(*rec); !st.ok()) DSEC_LOG(kWarn, kLog) << "saving " << id << ": " << st.error().toString();
  }
  return true;
}

int NodeAgent::reapLeftovers() {
  std::set<std::string> known;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, rec] : sandboxes_) known.insert(id);
  }
  // Machine backends first: a VM's cgroup is also under the container backend's parent, its run dir only theirs.
  std::vector<backends::Backend*> all;
  for (const auto& [kind, backend] : machine_backends_) all.push_back(backend.get());
  all.push_back(backend_.get());
  int reaped = 0;
  for (backends::Backend* backend : all) {
    auto leftovers = backend->listLeftovers();
    if (!leftovers.ok()) {
      DSEC_LOG(kWarn, kLog) << "listing leftovers: " << leftovers.error().toString();
      continue;
    }
    for (const auto& id : *leftovers) {
      if (known.count(id)) continue;
      DSEC_LOG(kInfo, kLog) << "reaping leftover " << backend->name() << " sandbox " << id;
      if (auto st = backend->reapLeftover(id); !st.ok()) {
        DSEC_LOG(kWarn, kLog) << "reaping leftover " << id << ": " << st.error().toString();
      }
      ++reaped;
    }
  }
  return reaped;
}

}  // namespace dsec::launcher
