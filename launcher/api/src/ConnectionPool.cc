#include "dsec/launcher/api/ConnectionPool.h"

#include <sys/socket.h>

#include <cerrno>

#include "dsec/common/Strings.h"

namespace dsec::launcher::client {
namespace {

// An idle HTTP connection has nothing to read: readable means the peer closed it (EOF) or sent something
// unasked (an error it writes before closing). Either way it cannot carry a request.
bool stillOpen(int fd) {
  char byte;
  ssize_t n = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

}  // namespace

UniqueFd ConnectionPool::take(const std::string& endpoint) {
  std::vector<UniqueFd> expired;  // closed outside the lock
  UniqueFd out;
  {
    std::lock_guard lock(mu_);
    auto it = idle_.find(endpoint);
    if (it == idle_.end()) return out;
    auto& list = it->second;
    double now = monotonicSeconds();
    while (!list.empty()) {
      Idle entry = std::move(list.back());
      list.pop_back();
      if (now - entry.since > max_idle_seconds_) {
        expired.push_back(std::move(entry.fd));
        continue;
      }
      out = std::move(entry.fd);
      break;
    }
    // The rest are older than the one taken (LIFO): drop those past their age from the front.
    size_t old = 0;
    while (old < list.size() && now - list[old].since > max_idle_seconds_) ++old;
    for (size_t i = 0; i < old; ++i) expired.push_back(std::move(list[i].fd));
    list.erase(list.begin(), list.begin() + static_cast<std::ptrdiff_t>(old));
  }
  if (out && !stillOpen(out.get())) out.reset();
  if (out) reused_.fetch_add(1, std::memory_order_relaxed);
  return out;
}

void ConnectionPool::give(const std::string& endpoint, UniqueFd fd) {
  if (!fd) return;
  std::lock_guard lock(mu_);
  auto& list = idle_[endpoint];
  if (list.size() >= max_idle_) return;  // fd closes here
  list.push_back(Idle{std::move(fd), monotonicSeconds()});
  returned_.fetch_add(1, std::memory_order_relaxed);
}

void ConnectionPool::drop(const std::string& endpoint) {
  std::vector<Idle> gone;
  std::lock_guard lock(mu_);
  auto it = idle_.find(endpoint);
  if (it == idle_.end()) return;
  gone = std::move(it->second);
  idle_.erase(it);
}

size_t ConnectionPool::idle(const std::string& endpoint) {
  std::lock_guard lock(mu_);
  auto it = idle_.find(endpoint);
  return it == idle_.end() ? 0 : it->second.size();
}

}  // namespace dsec::launcher::client
