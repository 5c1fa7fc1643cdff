// Binds host paths (--dsec-mount, the batch script's directory) into a running sandbox. The source trees are
// cloned with open_tree() in the caller's mount namespace (where the host paths resolve); a forked child then
// joins the sandbox's mount namespace, chroots to its root, creates the targets and attaches the clones there
// with move_mount(). The child runs only system calls: slurmstepd, the caller, is multithreaded.
#pragma once

#include <string>
#include <vector>

#include "SpankConfig.h"
#include "dsec/common/Result.h"

namespace dsec::spank {

// init_pidfd: pidfd of the sandbox's init; root_fd: O_PATH fd of its root (/proc/<init>/root).
// All or nothing per mount: an error names the mount and the step that failed.
Status bindIntoSandbox(int init_pidfd, int root_fd, const std::vector<MountSpec>& mounts);

}  // namespace dsec::spank
