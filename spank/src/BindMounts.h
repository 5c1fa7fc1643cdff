// Binds host paths (--dsec-mount, the batch script's directory) into a running sandbox.
//
// Sources: a user's source is opened with the job's credentials (MountSource.h), the plugin's own (the batch
// script's directory in slurmd's spool) as root; either way the tree is cloned from the descriptor with
// open_tree(), never from a name resolved as root. Every clone is nosuid and nodev (recursively, submounts
// included), read-only with :ro, and private (nothing mounted later on the host shows up inside, nor back).
//
// Targets: a forked child joins the sandbox's mount namespace, chroots to its root and walks each target one
// component at a time from descriptors. A missing component is created (as root) only on the sandbox's own
// root file system, never inside another bind: there root would create directories and files on the host,
// in a tree the user named but maybe may not write. The clone is attached with move_mount() onto the final
// descriptor. The child runs only system calls: slurmstepd, the caller, is multithreaded.
#pragma once

#include <string>
#include <vector>

#include "MountSource.h"
#include "SpankConfig.h"
#include "dsec/common/Result.h"

namespace dsec::spank {

struct BindRequest {
  MountSpec mount;
  bool as_job_user = true;  // false: a path the plugin chose itself (opened as root)
};

// init_pidfd: pidfd of the sandbox's init; root_fd: O_PATH fd of its root (/proc/<init>/root).
// All or nothing per mount: an error names the mount and the step that failed.
Status bindIntoSandbox(int init_pidfd, int root_fd, const std::vector<BindRequest>& mounts,
                       const JobCredentials& creds);

}  // namespace dsec::spank
