// Starts a sandbox's QEMU: in the sandbox's cgroup from its first instruction, in a session of its own, with
// no_new_privs, stdin from /dev/null and its output in the run dir's qemu.log, holding the sandbox's uid-range
// lease at fd 5 for as long as it runs (so no other sandbox gets its uid while any of it lives).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"

namespace dsec::backends::vm {

struct LaunchedQemu {
  pid_t pid = -1;
  UniqueFd pidfd;
};

// procs_files: the cgroup.procs files the child writes "0" to before exec (Cgroup::procsFiles()).
// private_file_ram: the guest's RAM is a snapshot's file mapped privately (a restore). QEMU 7.2 gives memory the
// guest frees back by punching holes in the RAM file even when the mapping is private, which would zero those
// pages for every other restore of the snapshot; a seccomp filter installed before exec makes fallocate succeed
// without doing anything, so QEMU goes on to drop only its own private copy of the pages (madvise).
Result<LaunchedQemu> launchQemu(const std::vector<std::string>& argv, const std::vector<std::string>& procs_files,
                                int lease_fd, const std::string& log_path, bool private_file_ram);

// Whether the process behind pidfd has exited, waiting up to timeout_seconds.
bool waitExited(int pidfd, double timeout_seconds);
// Reaps the child (when it is ours; a re-adopted QEMU is not, and that is fine).
void reapChild(pid_t pid);

}  // namespace dsec::backends::vm
