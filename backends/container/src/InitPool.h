// Sandbox inits started ahead of time. Starting init and making its namespaces (user, pid, uts, ipc, network:
// the network namespace alone is ~0.4 ms) is a fixed part of every create; a background thread keeps a few inits
// waiting for their config so the create path only hands one its setup. A waiting init is ours alone: it runs no
// sandbox code, is in no sandbox cgroup and still in the host mount namespace (it unshares its own once
// configured). When the agent dies, its end of the config socket closes and a waiting init exits on its own.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "Spawn.h"
#include "UserNamespace.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"

namespace dsec::backends {

// An init waiting for its config: send it (with the layer mounts) on config and shut that down, then read the
// status from status_r (after status_read, which came with its pid line).
struct IdleInit {
  SpawnedProcess process;  // PID 1 of the sandbox, our child
  UniqueFd config;         // our end of the config socket
  UniqueFd status_r;
  std::string status_read;  // bytes already read from status_r past init's pid line
  UniqueFd userns;          // its user namespace (to idmap the layers to); invalid without one
  uint32_t host_base = 0;   // host uid/gid of its root; 0 without a user namespace
  IdRangeHold lease;        // the agent's hold on the range (UserNamespace.h); empty without one
};

// What kind of init to start.
struct InitKind {
  std::string init_path;
  IdRangeAllocator* id_ranges = nullptr;  // a user namespace with a leased id range; nullptr: none
  bool userns_owned_by_root = false;      // the kernel refuses user namespaces made by unprivileged ids
  bool network_namespace = true;          // false: the host's network (SPANK steps only)
  Spawner* spawner = nullptr;             // starts the init (Spawn.h); nullptr: this process does
};

// Reads one status line of init from fd by the chunk; a line's bytes may come in several reads and the next line's
// with it, so buffered holds what was read past the last newline (the next call starts with it). "err STEP ERRNO
// MESSAGE" lines are returned as that error.
Result<std::string> readStatusLine(int fd, double deadline, std::string& buffered);

// Starts an init and waits until it is PID 1 of its namespaces, waiting for its config.
Result<IdleInit> spawnIdleInit(const InitKind& kind);

// Kills an init that never got (or never finished) its config, reaps it and then lets its id range go.
void discardIdleInit(IdleInit& init);

class InitPool {
 public:
  // Inits of the given kind (always with a network namespace of their own).
  InitPool(size_t target, InitKind kind);
  ~InitPool();
  InitPool(const InitPool&) = delete;
  InitPool& operator=(const InitPool&) = delete;

  // A waiting init nobody else has, or nothing when the pool is empty. The second call starts the refill.
  std::optional<IdleInit> take();
  // As take(), but while the refill is starting an init, waits for it (up to wait_seconds): for a create that could
  // not start an init of its own because the refill holds what it needed (the node's last free id range).
  std::optional<IdleInit> takeInFlight(double wait_seconds);

 private:
  void run();
  std::optional<IdleInit> popReadyLocked();  // mu_ held

  const size_t target_;
  const InitKind kind_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<IdleInit> ready_;
  bool stop_ = false;
  bool spawning_ = false;  // the refill is starting an init (it holds an id range for it)
  int takes_ = 0;
  std::thread thread_;
};

}  // namespace dsec::backends
