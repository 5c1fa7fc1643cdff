// The node agent's sessions: loading and reconciling them, pausing the sandboxes of a lapsed one, dropping one
// whose retention passed, and the session operations of the API.
#include "dsec/common/Logging.h"
#include "dsec/launcher/node/CpuAllocator.h"
#include "dsec/launcher/node/NodeAgent.h"

namespace dsec::launcher {
namespace {
constexpr const char* kLog = "node";
}  // namespace

void NodeAgent::loadSessions() {
  if (auto st = sessions_->load(); !st.ok()) {
    DSEC_LOG(kWarn, kLog) << "loading sessions: " << st.error().toString();
  }
  // Without a backend nothing was adopted, and reconciling would empty every session: keep them as they are.
  if (!backend_) return;
  std::map<std::string, std::string> members;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, rec] : sandboxes_) {
      if (!rec->params.session.empty()) members[id] = rec->params.session;
    }
  }
  sessions_->reconcile(members, wallSeconds());
}

void NodeAgent::pauseForLease(const std::string& id, const std::string& session) {
  auto rec = find(id);
  if (!rec) return;
  std::lock_guard lock(rec->mu);
  if (rec->destroyed) return;
  if (rec->sandbox->state() == backends::SandboxState::kRunning) {
    if (auto st = rec->sandbox->pause(); !st.ok()) {
      DSEC_LOG(kWarn, kLog) << "pausing " << id << " (session " << session << " lapsed): " << st.error().toString();
      return;
    }
    rec->paused_by = PausedBy::kLease;
    if (auto st = persist(*rec); !st.ok())
      DSEC_LOG(kWarn, kLog) << "persisting " << id << ": " << st.error().toString();
  }
  if (rec->sandbox->state() != backends::SandboxState::kPaused) return;
  // Frozen processes cannot touch their pages, so what the kernel pushes out now stays out until resume.
  if (auto st = rec->sandbox->reclaimMemory(); !st.ok()) {
    DSEC_LOG(kDebug, kLog) << "reclaiming memory of " << id << ": " << st.error().toString();
  }
}

void NodeAgent::reapSessions() {
  auto due = sessions_->tick(wallSeconds());
  for (const auto& [name, ids] : due.lapsed) {
    for (const auto& id : ids) pauseForLease(id, name);
  }
  for (const auto& [name, ids] : due.expired) {
    // The session goes first, so that once any of its sandboxes is seen gone the session is too, and no
    // attach can renew a session whose sandboxes are being destroyed. A crash in between is safe: a restart
    // finds the remaining sandboxes without a session file and restores the session lapsed.
    sessions_->erase(name);
    int destroyed = 0;
    for (const auto& id : ids) {
      if (destroy(id, "retention of session " + name + " passed").ok()) {
        ++destroyed;
        metrics_->reaped_total++;
      }
    }
    DSEC_LOG(kInfo, kLog) << "session " << name << " dropped: lapsed for its whole retention, destroyed " << destroyed
                          << " sandbox(es)";
  }
}

Result<Session> NodeAgent::putSession(const std::string& name, const SessionSettings& settings) {
  return sessions_->put(name, settings, wallSeconds());
}

Result<Session> NodeAgent::getSession(const std::string& name) { return sessions_->get(name); }

std::vector<Session> NodeAgent::listSessions() { return sessions_->list(); }

Result<AttachedSession> NodeAgent::attachSession(const std::string& name, std::optional<double> lease) {
  AttachedSession out;
  // The trainer is back: its sandboxes' idle time starts again now (the time the lease was lapsed is not idleness
  // the trainer chose), else an idle timeout passed during the lapse would destroy them the moment they are handed
  // back. Before the renewal: until then the reaper spares them as a lapsed session's.
  if (auto before = sessions_->get(name); before.ok()) {
    for (const auto& id : before->sandboxes) {
      if (auto rec = find(id)) rec->touch();
    }
  }
  DSEC_ASSIGN_OR_RETURN(out.session, sessions_->renew(name, lease, wallSeconds()));
  // Sandboxes stay paused: the first exec or file request to each resumes it.
  for (const auto& id : out.session.sandboxes) {
    if (auto i = info(id); i.ok()) out.sandboxes.push_back(std::move(*i));
  }
  return out;
}

Result<DeletedSession> NodeAgent::deleteSession(const std::string& name) {
  DSEC_ASSIGN_OR_RETURN(auto ids, sessions_->beginDelete(name));
  int destroyed = 0;
  std::optional<Error> failure;
  for (const auto& id : ids) {
    auto st = destroy(id, "session " + name + " deleted");
    if (st.ok()) {
      ++destroyed;
    } else if (st.error().code() != ErrorCode::kNotFound && !failure) {
      failure = st.error();
    }
  }
  if (failure) {
    // Keep the session (with what is left of it) so the delete can be retried.
    sessions_->cancelDelete(name);
    return failure->wrap("deleting session " + name);
  }
  sessions_->erase(name);
  DSEC_LOG(kInfo, kLog) << "session " << name << " deleted with " << destroyed << " sandbox(es)";
  return DeletedSession{name, destroyed};
}

}  // namespace dsec::launcher
