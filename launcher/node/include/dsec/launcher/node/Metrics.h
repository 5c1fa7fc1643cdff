// A small metrics registry rendered as Prometheus text (/metrics). Counters and histograms are updated on
// hot paths from many threads, so they are lock-free atomics; labelled families take a mutex only when a new
// label value first appears.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace dsec::launcher {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  // Appends the _bucket/_sum/_count lines of `name`.
  void render(const std::string& name, std::string* out) const;
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // one per bound, plus +Inf
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_micros_{0};
};

class Metrics {
 public:
  Metrics();

  std::atomic<uint64_t> creates_total{0};
  std::atomic<uint64_t> create_failures_total{0};
  std::atomic<uint64_t> execs_total{0};
  std::atomic<uint64_t> destroys_total{0};
  std::atomic<uint64_t> reaped_total{0};  // destroyed by the node for a timeout
  Histogram create_seconds;

  void countHttpRequest(int status);
  uint64_t httpRequests(int status) const;

  // Gauges computed at render time by the owner (sandbox counts, mounts, memory committed).
  using GaugeFn = std::function<void(std::string* out)>;
  void setGaugeRenderer(GaugeFn fn);

  std::string render() const;

 private:
  mutable std::mutex mu_;
  std::map<int, std::unique_ptr<std::atomic<uint64_t>>> http_requests_;
  GaugeFn gauges_;
};

}  // namespace dsec::launcher
