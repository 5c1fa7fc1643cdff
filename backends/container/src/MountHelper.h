// Changes mounts inside a running sandbox's mount namespace from the agent: a short-lived child of the agent
// joins the namespace (setns through init's pidfd) and runs a list of mount operations. The agent itself never
// joins (it is multi-threaded, and a mount namespace is per process); the sandbox's own processes cannot do any of
// this (no CAP_SYS_ADMIN, and the seccomp filter refuses every mount syscall).
#pragma once

#include <string>
#include <vector>

#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"

namespace dsec::backends {

struct MountOp {
  enum Kind {
    kCheck,         // the path exists without a symlink in any component (a directory or a regular file)
    kCheckDir,      // the same, and it is a directory
    kUnmount,       // detach the topmost mount at the path (none there is fine: nothing to undo)
    kBindReadOnly,  // bind the path onto itself, recursively read-only
    kBindSelf,      // bind the path onto itself writable (it becomes a mount point: no rename, no rmdir)
    kCloneWritable  // a detached clone of the mount at the path (no submounts), writable, handed to the agent
  };
  Kind kind;
  std::string path;
};

struct MountOpsResult {
  // Index of the op that failed and its errno; failed == ops.size() when all ran.
  size_t failed = 0;
  int error = 0;
  // One per kCloneWritable, in order (only for ops that ran).
  std::vector<UniqueFd> clones;
};

// Runs ops in order in the mount namespace of the process init_pidfd names, stopping at the first failure. An
// error here is the helper's own (fork, setns); a failed op is reported in the result.
Result<MountOpsResult> runMountOps(int init_pidfd, const std::vector<MountOp>& ops);

}  // namespace dsec::backends
