// The record of what one sandbox's processes were refused (egress, names, protected files): a bounded ring, the
// newest kept, and per-kind totals for /metrics. Written from the egress filter's event thread, the resolver and
// the file watcher; read by violations().
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

#include "dsec/backends/NetworkPolicy.h"

namespace dsec::backends {

class ViolationLog {
 public:
  static constexpr size_t kCapacity = 1024;

  void record(Violation violation) {
    countViolation(violation.kind);
    std::lock_guard lock(mu_);
    if (ring_.size() == kCapacity) {
      ring_.pop_front();
      ++dropped_;
    }
    ring_.push_back(std::move(violation));
  }
  std::vector<Violation> list() const {
    std::lock_guard lock(mu_);
    return {ring_.begin(), ring_.end()};
  }
  // Violations pushed out of the ring by newer ones.
  uint64_t dropped() const {
    std::lock_guard lock(mu_);
    return dropped_;
  }

 private:
  mutable std::mutex mu_;
  std::deque<Violation> ring_;
  uint64_t dropped_ = 0;
};

}  // namespace dsec::backends
