// Stages of a running sandbox: its egress policy and protected paths replaced in place (and recorded, so a
// restarted agent restores them), and the refusals its processes met.
#include "dsec/common/Logging.h"
#include "dsec/launcher/node/NodeAgent.h"

namespace dsec::launcher {
namespace {
constexpr const char* kLog = "node";
}  // namespace

Result<SandboxInfo> NodeAgent::setEgress(const std::string& id, const backends::EgressPolicy& policy) {
  auto rec = find(id);
  if (!rec) return Error::notFound("no sandbox " + id);
  std::lock_guard lock(rec->mu);
  if (rec->destroyed) return Error::notFound("no sandbox " + id);
  DSEC_TRY(rec->sandbox->setEgress(policy));
  rec->params.egress = policy;
  if (auto st = persist(*rec); !st.ok()) DSEC_LOG(kWarn, kLog) << "persisting " << id << ": " << st.error().toString();
  return infoLocked(*rec);
}

Result<SandboxInfo> NodeAgent::setProtectedPaths(const std::string& id, const std::vector<std::string>& paths) {
  DSEC_ASSIGN_OR_RETURN(std::vector<std::string> normal, backends::parseProtectedPaths(paths));
  auto rec = find(id);
  if (!rec) return Error::notFound("no sandbox " + id);
  std::lock_guard lock(rec->mu);
  if (rec->destroyed) return Error::notFound("no sandbox " + id);
  DSEC_TRY(rec->sandbox->setProtectedPaths(normal));
  rec->params.protected_paths = normal;
  if (auto st = persist(*rec); !st.ok()) DSEC_LOG(kWarn, kLog) << "persisting " << id << ": " << st.error().toString();
  return infoLocked(*rec);
}

Result<std::vector<backends::Violation>> NodeAgent::violations(const std::string& id) {
  auto rec = find(id);
  if (!rec) return Error::notFound("no sandbox " + id);
  return rec->sandbox->violations();
}

}  // namespace dsec::launcher
