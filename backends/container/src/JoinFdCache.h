// The cgroup files a new command writes "0" into to join its sandbox (cgroupJoinFiles), opened for writing and kept
// for the sandboxes that started a command most recently. Opening them costs tens of microseconds per command on
// cgroup v1 (one file per controller), but keeping them for every idle sandbox would cost the agent one fd per
// controller per sandbox: tens of thousands of fds on a full node. The least recently used go first.
#pragma once

#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"

namespace dsec::backends {

class JoinFdCache {
 public:
  using Fds = std::shared_ptr<const std::vector<UniqueFd>>;

  explicit JoinFdCache(size_t capacity) : capacity_(capacity) {}

  // The files of sandbox id, opened now unless kept; they stay open for the holder even if dropped meanwhile.
  Result<Fds> get(const std::string& id, const std::vector<std::string>& files);
  // Drops id's files (its sandbox is gone or no longer ours).
  void forget(const std::string& id);
  size_t size() const;

 private:
  using Entry = std::pair<std::string, Fds>;

  mutable std::mutex mu_;
  const size_t capacity_;
  std::list<Entry> recent_;  // most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
};

}  // namespace dsec::backends
