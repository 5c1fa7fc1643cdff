// Idle keep-alive connections of the HTTP client (HttpClient.h), per endpoint: the gateway to its nodes, the CLI to its
// fleet. A create then costs one request on an open connection instead of a TCP handshake and a thread on the node for
// each request (docs/fleet.md, "Performance"). A connection goes back only after a complete answer on a keep-alive
// response; one taken back out is checked first (a node that restarted or timed the connection out closed it: it reads
// EOF), and connections idle for longer than max_idle_seconds (below the node's own idle timeout) are closed.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "dsec/common/Fd.h"

namespace dsec::launcher::client {

class ConnectionPool {
 public:
  explicit ConnectionPool(size_t max_idle_per_endpoint = 64, double max_idle_seconds = 30.0)
      : max_idle_(max_idle_per_endpoint), max_idle_seconds_(max_idle_seconds) {}
  ConnectionPool(const ConnectionPool&) = delete;
  ConnectionPool& operator=(const ConnectionPool&) = delete;

  // The most recently used idle connection to endpoint that is still open, or an invalid fd.
  UniqueFd take(const std::string& endpoint);
  // Keeps a connection whose last answer was complete and keep-alive (closed when the pool is full).
  void give(const std::string& endpoint, UniqueFd fd);
  // Closes every idle connection to endpoint (its node was declared lost or left).
  void drop(const std::string& endpoint);
  size_t idle(const std::string& endpoint);
  uint64_t reused() const { return reused_.load(std::memory_order_relaxed); }
  uint64_t returned() const { return returned_.load(std::memory_order_relaxed); }

 private:
  struct Idle {
    UniqueFd fd;
    double since = 0;  // monotonic
  };
  size_t max_idle_;
  double max_idle_seconds_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::vector<Idle>> idle_;
  std::atomic<uint64_t> reused_{0};
  std::atomic<uint64_t> returned_{0};
};

}  // namespace dsec::launcher::client
