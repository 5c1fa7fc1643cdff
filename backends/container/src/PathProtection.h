// Protected paths of one container sandbox (docs/security.md, "Protected paths"): what its processes cannot
// change, and the route dsec's own file API takes to change it anyway.
//
// In the sandbox's mount namespace each protected path P gets a recursive read-only bind of itself (writes,
// creates, unlinks, renames inside, chmod/chown/utimes: EROFS; links into or out of it: EXDEV; renaming or
// replacing P itself: EBUSY, it is a mount point). Every directory above P (but /) is bound onto itself, writable,
// after P's bind: a mount point cannot be renamed or removed, so no one can move P's parent away and put another
// tree at P's path; the copies of P's bind those self-binds carry keep P read-only through every mount.
// Files under P that share their inode with a link outside P (a hardlink made before protection) get their own
// copy, so nothing writable outside reaches P's data. Sandbox processes cannot undo any of it: they lack
// CAP_SYS_ADMIN and the seccomp filter refuses mount, umount2, move_mount, open_tree, mount_setattr, setns and
// unshare.
//
// The file API resolves paths under P (or under a self-bound parent) in a writable detached clone of that mount
// made by the same helper (the clone has no submounts, so no read-only bind is in its way); lookups there keep
// RESOLVE_IN_ROOT, so a symlink inside still cannot leave the clone's tree.
#pragma once

#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"

namespace dsec::backends {

// The mounts a set of protected paths needs, in the order they are made (unmade in reverse).
struct ProtectionPlan {
  std::vector<std::string> read_only;  // the paths, without those under another protected path
  std::vector<std::string> parents;    // every directory above them but /, shallowest first
};
ProtectionPlan planProtection(const std::vector<std::string>& normal_paths);

// Where the file API finds a path: an O_PATH root and the path inside it.
struct FileRoute {
  UniqueFd root;
  std::string path;
};

class PathProtection {
 public:
  // paths: normalised (parseProtectedPaths), already in force in the sandbox (adoption) or empty.
  explicit PathProtection(std::vector<std::string> paths);

  std::vector<std::string> paths() const;
  // Replaces the protected set in the sandbox init_pidfd names; the caller keeps the sandbox's processes frozen
  // meanwhile. A path that does not exist or has a symlink in it is refused and nothing changes.
  Status change(int init_pidfd, const std::vector<std::string>& next);
  // The route for a normalised path when protection is in its way; nullopt: the sandbox's root as usual.
  Result<std::optional<FileRoute>> routeFor(int init_pidfd, const std::string& normal_path);
  // Closes the clones (they hold the sandbox's file systems; destroy() lets them go).
  void release();

 private:
  Status loadClones(int init_pidfd);  // under mu_
  Status breakOutsideLinks();         // under mu_

  mutable std::mutex mu_;
  std::vector<std::string> paths_;
  ProtectionPlan plan_;
  // Writable clones of the mounts at each planned path and at /, made on first use after a change or adoption.
  std::map<std::string, UniqueFd> clones_;
};

}  // namespace dsec::backends
