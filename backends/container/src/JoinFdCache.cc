#include "JoinFdCache.h"

#include <fcntl.h>

#include <cerrno>

namespace dsec::backends {

Result<JoinFdCache::Fds> JoinFdCache::get(const std::string& id, const std::vector<std::string>& files) {
  {
    std::lock_guard lock(mu_);
    auto it = index_.find(id);
    if (it != index_.end()) {
      recent_.splice(recent_.begin(), recent_, it->second);
      return it->second->second;
    }
  }
  // Opened without the lock: other sandboxes' commands do not wait for these opens.
  auto opened = std::make_shared<std::vector<UniqueFd>>();
  for (const auto& f : files) {
    opened->emplace_back(::open(f.c_str(), O_WRONLY | O_CLOEXEC));
    if (!opened->back()) return Error::sys(errno, "open " + f);
  }
  Fds fds = std::move(opened);
  if (capacity_ == 0) return fds;
  std::lock_guard lock(mu_);
  if (auto it = index_.find(id); it != index_.end()) return it->second->second;  // another command's, kept
  recent_.emplace_front(id, fds);
  index_[id] = recent_.begin();
  while (recent_.size() > capacity_) {
    index_.erase(recent_.back().first);
    recent_.pop_back();
  }
  return fds;
}

void JoinFdCache::forget(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = index_.find(id);
  if (it == index_.end()) return;
  recent_.erase(it->second);
  index_.erase(it);
}

size_t JoinFdCache::size() const {
  std::lock_guard lock(mu_);
  return recent_.size();
}

}  // namespace dsec::backends
