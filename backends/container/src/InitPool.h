// Sandbox inits started ahead of time. Cloning and exec'ing init (new pid, uts, ipc and network
// namespaces) is a fixed part of every create; a background thread keeps a few inits waiting for their
// config so the create path only hands one its setup. A waiting init is ours alone: it runs no sandbox code,
// is in no sandbox cgroup and still in the host mount namespace (it unshares its own once configured).
// When the agent dies, the config pipe's write end closes and a waiting init exits on its own.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "NetnsPool.h"
#include "Spawn.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"

namespace dsec::backends {

// An init waiting for its config: write it to config_w and close it, then read the status from status_r.
struct IdleInit {
  SpawnedProcess process;
  UniqueFd config_w;
  UniqueFd status_r;
};

// Starts an init in new pid, uts and ipc namespaces; with new_net also a network namespace (the pooled one
// in netns when valid, else CLONE_NEWNET), otherwise it keeps the host's.
Result<IdleInit> spawnIdleInit(const std::string& init_path, bool new_net, UniqueFd netns);

// Kills an init that never got (or never finished) its config and reaps it.
void discardIdleInit(IdleInit& init);

class InitPool {
 public:
  // Inits with a new network namespace (network "none"), taking namespaces from netns when it has some.
  InitPool(size_t target, std::string init_path, NetnsPool& netns);
  ~InitPool();
  InitPool(const InitPool&) = delete;
  InitPool& operator=(const InitPool&) = delete;

  // A waiting init nobody else has, or nothing when the pool is empty. The second call starts the refill.
  std::optional<IdleInit> take();

 private:
  void run();

  const size_t target_;
  const std::string init_path_;
  NetnsPool& netns_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<IdleInit> ready_;
  bool stop_ = false;
  int takes_ = 0;
  std::thread thread_;
};

}  // namespace dsec::backends
