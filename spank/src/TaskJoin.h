// How a Slurm task enters its step's sandbox. Two stages, because slurmstepd decides what happens in between:
//  1. joinSandbox, in slurm_spank_task_init_privileged (the task process, root, single-threaded, before Slurm
//     drops to the job's user): join the sandbox's cgroup, setns into its mount, UTS, IPC, cgroup (and, with
//     --dsec-net=none, network) namespaces and chroot to its root. setns(CLONE_NEWPID) only moves the task's
//     future children into the sandbox's PID namespace. slurmstepd then chdir()s to the job's working
//     directory (and complains on the user's terminal if it is missing), so that path is created, empty,
//     inside the sandbox (on its own root file system only, never inside a bind: SandboxPath.h); the task
//     leaves it for --dsec-workdir in stage 2. Then the task is locked down (TaskLockdown.h).
//  2. enterWorkdir and forkIntoPidNamespace, in slurm_spank_task_init (the job's user, after slurmstepd has put the
//  task into
//     its process tracking cgroup, just before execve): fork once. The child, now inside the sandbox's PID
//     namespace (so /proc/self and `ps` work and the sandbox's init is pid 1), returns and becomes the user's
//     program; the parent stays behind as a shim that waits for it and exits with its status, so Slurm sees
//     the task end exactly when the program ends. The child inherits Slurm's tracking cgroup, so signals from
//     scancel/srun reach it directly; the shim ignores them.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dsec/common/Result.h"

namespace dsec::spank {

struct JoinTarget {
  pid_t init_pid = -1;
  uint64_t init_start_time = 0;          // guards against a recycled pid
  std::vector<std::string> procs_files;  // cgroup.procs files to write "0" into (Slurm's own hierarchies excluded)
  bool join_network = true;              // false with --dsec-net=host: the task keeps the node's network
  std::string workdir = "/";
};

Status joinSandbox(const JoinTarget& target);
// chdir to the workdir inside the sandbox (as the job's user: a directory the user cannot enter is an error).
Status enterWorkdir(const std::string& workdir);

// Returns in the child (the future user program). In the parent it never returns: it waits for the child
// and _exit()s with its exit status (or dies of the same signal). An error means nothing was forked.
Status forkIntoPidNamespace();

}  // namespace dsec::spank
