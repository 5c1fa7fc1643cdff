// ContainerSandbox::snapshot: the sandbox's writable upper (what it wrote, deleted and made opaque over the image)
// packed as an EROFS layer, dir/upper.erofs. The sandbox is frozen while its upper is copied out (UpperCopy.h:
// through fds, bounded, only what a layer may hold) so the copy is one moment's; it is thawed before the copy is
// packed. Processes and memory are not carried (SnapshotKind::kFilesystem).
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "ContainerSandbox.h"
#include "InitProtocol.h"
#include "UpperCopy.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"

namespace dsec::backends {
namespace {

// Uncompressed, mtimes kept (as the layer store packs layers): ownership, modes, the kept xattrs and the
// whiteouts (char 0/0) go in as they are in the copy.
Status packLayer(const std::string& tree, const std::string& image) {
  if (findProgram("mkfs.erofs").empty()) {
    return Error(ErrorCode::kUnsupported, "mkfs.erofs not found on PATH (install erofs-utils)");
  }
  CommandOptions options;
  options.timeout_seconds = 3600;
  DSEC_ASSIGN_OR_RETURN(CommandResult r,
                        runCommand({"mkfs.erofs", "--quiet", "--preserve-mtime", image, tree}, options));
  if (r.exit_code != 0) {
    std::string tail = r.output.size() > 2000 ? r.output.substr(r.output.size() - 2000) : r.output;
    return Error(ErrorCode::kSystem, "mkfs.erofs " + image + " failed: " + trim(tail));
  }
  return okStatus();
}

}  // namespace

Result<SnapshotKind> ContainerSandbox::snapshot(const std::string& dir) {
  if (spec_.read_only_root) {
    return Error(ErrorCode::kUnsupported,
                 "sandbox " + spec_.id + " has a read-only root: there is nothing to snapshot");
  }
  DSEC_ASSIGN_OR_RETURN(Use use, acquire(false));
  UniqueFd upper(static_cast<int>(syscall(SYS_pidfd_getfd, init_.pidfd.get(), init_protocol::kUpperFd, 0)));
  struct stat st {};
  if (!upper || ::fstat(upper.get(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Error(ErrorCode::kUnsupported,
                 "sandbox " + spec_.id + " was started by an init that keeps no upper for snapshots; recreate it");
  }
  UpperCopyLimits limits;
  limits.max_bytes = shared_->options.snapshot_max_bytes;
  limits.max_entries = shared_->options.snapshot_max_entries;
  const std::string tree = dir + "/.upper-tree";
  Result<UpperCopyStats> copied = Error::internal("not copied");
  {
    // No pause, resume or destroy while the copy runs: the sandbox stays in the state it was in.
    std::lock_guard lock(mu_);
    if (destroyed_) return Error::notFound("sandbox " + spec_.id + " is destroyed");
    const bool frozen_here = state_ != SandboxState::kPaused;
    if (frozen_here) {
      Status s = cgroup_->freeze();
      if (!s.ok()) return s.error().wrap("freeze " + spec_.id + " for its snapshot");
    }
    copied = copyUpper(upper.get(), tree, owner_, limits);
    if (frozen_here) {
      Status s = cgroup_->thaw();
      if (!s.ok()) {
        DSEC_LOG(kError, "container") << "sandbox " << spec_.id
                                      << " stays frozen after its snapshot: " << s.error().toString();
        state_ = SandboxState::kPaused;  // what it is now; a resume thaws it
      }
    }
  }
  Status packed = copied.ok() ? packLayer(tree, dir + "/upper.erofs") : Status(copied.error());
  Status removed = removeTree(tree);
  if (!packed.ok()) return packed.error().wrap("snapshot " + spec_.id);
  if (!removed.ok()) return removed.error().wrap("snapshot " + spec_.id);
  return SnapshotKind::kFilesystem;
}

}  // namespace dsec::backends
