// Opens a --dsec-mount source the way the job's user would, so a user can bind only what they could open
// themselves. slurmstepd is root: a path it resolved would reach another user's 0700 directory, root's files,
// or, through a symlink the user planted, anything at all.
//
// A forked child drops to the job's uid, gid and supplementary groups (and no capabilities), resolves the path
// with openat2(O_PATH, RESOLVE_NO_MAGICLINKS), checks the user may read the source itself and that it is not
// in /proc, and sends the O_PATH descriptor back over a socketpair (SCM_RIGHTS). The caller, still root, then
// clones the mount tree from that descriptor: nothing is resolved by name as root.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"

namespace dsec::spank {

// Whose permissions a mount source is opened with (Slurm's S_JOB_UID, S_JOB_GID, S_JOB_SUPPLEMENTARY_GIDS).
struct JobCredentials {
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary groups
};

// Returns an O_PATH descriptor of `path` opened with `creds`. Errors name the path and say why: kNotFound (no
// such path), kInvalidArgument (the user may not search the path or read the source; a /proc magic link such
// as /proc/<pid>/root or /proc/self/fd/N on the way; a source in /proc), kTimeout (the lookup hung, e.g. on a
// file system the user serves). Called from a multithreaded process: the child makes system calls only.
Result<UniqueFd> openMountSourceAs(const std::string& path, const JobCredentials& creds);

}  // namespace dsec::spank
