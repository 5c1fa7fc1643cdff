// What a task of a step sandbox may do: the container backend's seccomp filter and capability set, applied to
// each task by slurm_spank_task_init_privileged right after it joined the sandbox (TaskJoin.h).
//
// Where it sits in slurmstepd's task setup (Slurm 22.05, mgr.c/_fork_all_tasks and task.c/exec_task): the task
// process (single-threaded, root) runs our privileged callback, then drops to the job's user (setgroups,
// setresgid, setresuid), chdir()s, sets up stdio, waits for slurmstepd, runs slurm_spank_task_init (our PID
// namespace fork), the task plugins (affinity, rlimits) and execve()s the user's program. None of that uses a
// system call the filter denies (mount, setns, unshare, keyctl, bpf, module and clock calls, namespace flags
// of clone, ...), and no_new_privs does not restrict setuid()/setgid(), only what an execve() can gain.
//
// The capability sets of the task are not cut down before execve: slurmstepd still needs CAP_SETUID/SETGID to
// become the job's user (both are in the sandbox's set anyway) and, for a root job, other capabilities for
// its task plugins. What the program gets is decided at execve: a non-root job has none; a root job gets at
// most the bounding set, which is the sandbox's (inheritable and ambient sets are cut to it as well, since
// root's execve adds them back).
#pragma once

#include <linux/filter.h>

#include <cstdint>
#include <vector>

#include "dsec/common/Result.h"

namespace dsec::spank {

struct TaskPolicy {
  std::vector<sock_filter> seccomp;  // the sandbox's filter, as raw BPF (never empty)
  uint64_t keep_caps = 0;            // capability bits a task may keep (bounding set)
};

// Built once per step by slurmstepd, before any task is forked (the task must not need libseccomp).
Result<TaskPolicy> sandboxTaskPolicy();

// In the task, as root, after joinSandbox: drops every capability outside keep_caps from the bounding,
// inheritable and ambient sets, sets no_new_privs and installs the filter. System calls only.
Status lockDownTask(const TaskPolicy& policy);

}  // namespace dsec::spank
