// A small pool of pre-made network namespaces (loopback up). A new network namespace is the most expensive
// part of a sandbox create here (~0.4 ms, p99 several ms); a background thread makes them ahead of time so
// the create path only joins one. When the pool is empty, create falls back to CLONE_NEWNET.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "dsec/common/Fd.h"

namespace dsec::backends {

class NetnsPool {
 public:
  explicit NetnsPool(size_t target);
  ~NetnsPool();
  NetnsPool(const NetnsPool&) = delete;
  NetnsPool& operator=(const NetnsPool&) = delete;

  // A namespace fd nobody else has, or an invalid fd when the pool is empty.
  UniqueFd take();

 private:
  void run();

  const size_t target_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<UniqueFd> ready_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace dsec::backends
