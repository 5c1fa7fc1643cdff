// Protected paths of a running container sandbox (PathProtection.h) and the file API's way around them.
#include "ContainerSandbox.h"
#include "SandboxFiles.h"
#include "dsec/common/Logging.h"

namespace dsec::backends {

Status ContainerSandbox::setProtectedPaths(const std::vector<std::string>& paths) {
  DSEC_ASSIGN_OR_RETURN(std::vector<std::string> normal, parseProtectedPaths(paths));
  DSEC_ASSIGN_OR_RETURN(Use use, acquire(false));
  std::lock_guard policy(policy_mu_);
  // The sandbox's processes stay frozen while the mounts change: no one sees a moment with the old protection
  // gone and the new one not yet there, or writes into a file whose links are being broken. Holding mu_ keeps a
  // resume() from thawing them early; a paused sandbox stays paused.
  std::lock_guard lock(mu_);
  const bool freeze = state_ == SandboxState::kRunning;
  if (freeze) DSEC_TRY(cgroup_->freeze());
  Status changed = protection_->change(init_.pidfd.get(), normal);
  Status thawed = freeze ? cgroup_->thaw() : okStatus();
  if (!changed.ok()) return changed.error().wrap("protect paths of " + spec_.id);
  if (!thawed.ok()) return thawed.error().wrap("resume " + spec_.id + " after protecting paths");
  watchProtectedPaths();
  DSEC_LOG(kDebug, "container") << spec_.id << ": " << normal.size() << " protected paths";
  return okStatus();
}

Result<FileRoute> ContainerSandbox::fileRoute(const std::string& path) {
  DSEC_ASSIGN_OR_RETURN(UniqueFd root, openRoot());
  auto normal = normalizeSandboxPath(path);
  if (normal.ok()) {
    DSEC_ASSIGN_OR_RETURN(std::optional<FileRoute> route, protection_->routeFor(init_.pidfd.get(), *normal));
    if (route) return std::move(*route);
  }
  return FileRoute{std::move(root), path};
}

}  // namespace dsec::backends
