// Process creation for container sandboxes. The agent is multithreaded, so children run only
// async-signal-safe code between clone and execve; everything they need is prepared before.
// Both spawners use vfork-style clones (CLONE_VM|CLONE_VFORK on a private stack): no page tables are copied,
// which keeps create and exec cheap no matter how large the agent is.
#pragma once

#include <linux/filter.h>
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dsec/backends/Sandbox.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"

namespace dsec::backends {

struct InitSpawnRequest {
  std::string init_path;
  std::vector<std::string> procs_files;  // optional: the child writes "0" into each before exec (the backend
                                         // leaves this empty: init joins from its config)
  int namespace_flags = 0;               // CLONE_NEW*
  int config_fd = -1;                    // becomes fd 3 of init
  int status_fd = -1;                    // becomes fd 4 of init
  int netns_fd = -1;                     // a pre-made network namespace to join instead of CLONE_NEWNET
};

struct SpawnedProcess {
  pid_t pid = -1;
  UniqueFd pidfd;
};

// Clones init into new namespaces and execs it (stdin/stdout/stderr on /dev/null).
Result<SpawnedProcess> spawnInit(const InitSpawnRequest& request);

struct CommandSpawnRequest {
  std::vector<std::string> procs_files;  // the sandbox cgroup
  int init_pidfd = -1;
  int namespace_flags = 0;  // what to setns into
  int root_fd = -1;         // O_PATH fd of the sandbox root (chroot target after setns)
  int stdin_fd = -1, stdout_fd = -1, stderr_fd = -1;
  std::string cwd;
  std::vector<std::string> argv;
  std::vector<std::string> env;         // "K=V"
  std::vector<std::string> candidates;  // absolute paths to try for argv[0], in order
  const std::vector<sock_filter>* seccomp = nullptr;
  uint64_t keep_caps = 0;  // bounding/permitted/effective/inheritable set of the command
  int sched_policy = -1;   // SCHED_IDLE etc. set on the command before exec (its children inherit it); -1 = keep
};

struct SpawnedCommand {
  pid_t pid = -1;
  UniqueFd pidfd;
  int exec_errno = 0;  // the command could not be executed (the child exited 127 and was reaped)
};

// The calling thread joins the sandbox (one setns through the init's pidfd, then chroot to its root), clones
// the command straight into it (CLONE_VM|CLONE_VFORK: the command is the agent's own child, in the sandbox's
// pid namespace) and returns to its own namespaces and root before anything else runs on it. The command
// joins the cgroup through fds opened on the host, starts its own session, and drops to reduced
// capabilities, no_new_privs and the seccomp filter before execve.
Result<SpawnedCommand> spawnCommand(const CommandSpawnRequest& request);

// The scheduling policy every process of a sandbox runs under (CPU QoS): SCHED_IDLE for batch sandboxes when
// the backend applies QoS, else -1 (the agent's own, SCHED_OTHER).
int sandboxSchedPolicy(const SandboxSpec& spec, bool cpu_qos);

}  // namespace dsec::backends
