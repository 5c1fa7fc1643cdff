#include "dsec/launcher/node/Metrics.h"

#include <cmath>

#include "dsec/common/Prometheus.h"

namespace dsec::launcher {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  if (value > 0 && std::isfinite(value)) {
    sum_micros_.fetch_add(static_cast<uint64_t>(value * 1e6), std::memory_order_relaxed);
  }
}

void Histogram::render(const std::string& name, std::string* out) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += buckets_[i].load(std::memory_order_relaxed);
    std::string le = i < bounds_.size() ? prometheus::number(bounds_[i]) : "+Inf";
    prometheus::sample(out, name + "_bucket", {{"le", le}}, prometheus::number(cumulative));
  }
  prometheus::sample(out, name + "_sum",
                     prometheus::number(static_cast<double>(sum_micros_.load(std::memory_order_relaxed)) / 1e6));
  prometheus::sample(out, name + "_count", prometheus::number(count_.load(std::memory_order_relaxed)));
}

Metrics::Metrics() : create_seconds({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}) {}

void Metrics::countHttpRequest(int status) {
  std::lock_guard lock(mu_);
  auto& slot = http_requests_[status];
  if (!slot) slot = std::make_unique<std::atomic<uint64_t>>(0);
  slot->fetch_add(1, std::memory_order_relaxed);
}

uint64_t Metrics::httpRequests(int status) const {
  std::lock_guard lock(mu_);
  auto it = http_requests_.find(status);
  return it == http_requests_.end() ? 0 : it->second->load();
}

void Metrics::setGaugeRenderer(GaugeFn fn) {
  std::lock_guard lock(mu_);
  gauges_ = std::move(fn);
}

std::string Metrics::render() const {
  std::string out;
  auto counter = [&out](const char* name, const char* help, uint64_t value) {
    prometheus::counter(&out, name, help, value);
  };
  counter("dsec_sandbox_creates_total", "Sandboxes created.", creates_total.load());
  counter("dsec_sandbox_create_failures_total", "Sandbox creates that failed.", create_failures_total.load());
  counter("dsec_sandbox_destroys_total", "Sandboxes destroyed.", destroys_total.load());
  counter("dsec_sandbox_reaped_total", "Sandboxes destroyed by the node for a timeout.", reaped_total.load());
  counter("dsec_execs_total", "Exec requests run.", execs_total.load());
  prometheus::family(&out, "dsec_sandbox_create_seconds", "histogram", "Sandbox create latency.");
  create_seconds.render("dsec_sandbox_create_seconds", &out);
  GaugeFn gauges;
  {
    std::lock_guard lock(mu_);
    prometheus::family(&out, "dsec_http_requests_total", "counter", "HTTP requests by status code.");
    for (const auto& [code, value] : http_requests_) {
      prometheus::sample(&out, "dsec_http_requests_total", {{"code", std::to_string(code)}},
                         prometheus::number(value->load()));
    }
    gauges = gauges_;
  }
  if (gauges) gauges(&out);
  return out;
}

}  // namespace dsec::launcher
