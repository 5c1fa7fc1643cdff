// Process creation for container sandboxes. Nothing that a sandbox can see, signal or ptrace ever shares the
// agent's memory, file table or credentials:
// - a sandbox's init is a fresh exec of dsec-sandbox-init, started as a plain child in the host's namespaces (the
//   vfork-style clone that starts it runs only until that exec, and no sandbox exists yet); it makes the sandbox's
//   namespaces itself (InitProtocol.h);
// - commands are started by dsec-sandbox-spawner, another fresh exec, undumpable, in the host's namespaces
//   (SpawnProtocol.h); the command is the agent's child (CLONE_PARENT), so the agent waits for it with its pidfd.
#pragma once

#include <linux/filter.h>
#include <sys/types.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "dsec/backends/Sandbox.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"

namespace dsec::backends {

struct SpawnedProcess {
  pid_t pid = -1;
  UniqueFd pidfd;
};

struct InitSpawnRequest {
  std::string init_path;
  bool user_namespace = true;     // stage 1 makes a user namespace and waits for its id maps
  int64_t userns_owner = -1;      // the host id that makes it (the sandbox root's); -1: host root
  bool network_namespace = true;  // a new network namespace (else the host's: SPANK steps only)
  int config_fd = -1;             // becomes fd 3 of init (a unix stream socket)
  int status_fd = -1;             // becomes fd 4 of init
  int lease_fd = -1;              // becomes fd 5 of init when >= 0 (held for the sandbox's life)
};

class Spawner;

// Starts stage 1 of dsec-sandbox-init (stdin/stdout/stderr on /dev/null, every signal blocked) through the spawner
// (its clone copies the spawner's few fds, not the agent's thousands), or, without one, from this process. The
// caller completes the handshake (InitPool.cc) and reaps it.
Result<SpawnedProcess> spawnInitStage(const InitSpawnRequest& request, Spawner* spawner);

struct CommandSpawnRequest {
  std::vector<int> procs_fds;  // the sandbox cgroup's files, opened for writing
  int init_pidfd = -1;
  int namespace_flags = 0;       // what to setns into besides the user namespace
  bool user_namespace = false;   // join the sandbox's user namespace and become its root
  bool controlling_tty = false;  // stdin is the sandbox's terminal: the command's session takes it
  int stdin_fd = -1, stdout_fd = -1, stderr_fd = -1;
  std::string cwd;
  std::vector<std::string> argv;
  std::vector<std::string> env;         // "K=V"
  std::vector<std::string> candidates;  // absolute paths to try for argv[0], in order
  uint64_t keep_caps = 0;               // bounding/permitted/effective/inheritable set of the command
  int sched_policy = -1;  // SCHED_IDLE etc. set on the command before exec (its children inherit it); -1 = keep
};

// A command the spawner started. It may not have exec'd yet: status_fd (the read end of its status pipe) gets a
// ChildFailure when a step before exec fails and EOF once it has exec'd (awaitExec).
struct SpawnedCommand {
  pid_t pid = -1;
  UniqueFd pidfd;
  UniqueFd status_fd;
};

// The outcome of the steps before exec: 0 once the command runs, else the errno of the failed step (the child
// exits 127). kTimeout when it did not get there by the deadline (then the caller kills it).
struct ExecStart {
  int exec_errno = 0;
  int step = 0;  // spawn_protocol::ChildStep of the failure
};
Result<ExecStart> awaitExec(SpawnedCommand& command, double deadline);

// The agent's end of one dsec-sandbox-spawner, started on first use and restarted if it dies. Thread-safe: one
// request at a time on the socket (the spawner answers at once, without waiting for the command).
class Spawner {
 public:
  Spawner(std::string path, std::vector<sock_filter> seccomp);
  ~Spawner();
  Spawner(const Spawner&) = delete;
  Spawner& operator=(const Spawner&) = delete;

  Result<SpawnedCommand> spawn(const CommandSpawnRequest& request);
  // Starts path (a sandbox init) with args and fds (at 0..n-1) as our child in the host's namespaces.
  Result<SpawnedProcess> startInit(const std::string& path, const std::vector<std::string>& args,
                                   const std::vector<int>& fds);
  // Keeps the spawner (now and after every restart) in this cgroup v2 directory as well, so what it starts is
  // too: on a v1 host, the directory the egress BPF programs are attached to. A spawner that cannot be put there
  // is not used.
  Status placeIn(const std::string& cgroup2_dir);

 private:
  Status startLocked();
  void stopLocked();
  Result<SpawnedCommand> sendLocked(const CommandSpawnRequest& request, const std::string& strings, bool* sent);
  Result<SpawnedProcess> sendInitLocked(const std::string& path, const std::vector<std::string>& args,
                                        const std::vector<int>& fds, bool* sent);
  Result<SpawnedProcess> readReplyLocked(const std::string& what);

  const std::string path_;
  const std::vector<sock_filter> seccomp_;
  std::mutex mu_;
  UniqueFd channel_;
  SpawnedProcess process_;
  std::string cgroup2_dir_;  // placeIn()
};

// Where dsec-sandbox-spawner is: next to the running executable, else in the build tree.
std::string findSpawner();

// The scheduling policy every process of a sandbox runs under (CPU QoS): SCHED_IDLE for batch sandboxes when
// the backend applies QoS, else -1 (the agent's own, SCHED_OTHER).
int sandboxSchedPolicy(const SandboxSpec& spec, bool cpu_qos);

}  // namespace dsec::backends
