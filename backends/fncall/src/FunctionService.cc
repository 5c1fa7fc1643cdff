// The fncall service: pools of warm workers per (image, language) under one node-wide worker budget.
// A call takes an idle worker of its pool; when there is none, a new worker is created in the background
// (up to max_workers, evicting another pool's least recently used idle worker when the budget is full) while
// the call waits up to queue_wait_seconds for whichever worker of its pool frees up first. A maintainer
// thread replaces dead workers, keeps min_idle_workers warm in pools in use and shrinks idle ones.
#include "dsec/backends/fncall/FunctionService.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "Worker.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Prometheus.h"
#include "dsec/common/Strings.h"

namespace dsec::backends::fncall {
namespace {

constexpr const char* kLog = "fncall";
// A pool keeps min_idle_workers warm this many idle_shrink periods after its last call (then it may empty).
constexpr double kWantedShrinkPeriods = 10;
constexpr double kMaxCreateBackoffSeconds = 60;

using Clock = std::chrono::steady_clock;

std::string secondsText(double s) {
  char buf[32];
  snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

struct PoolKey {
  std::string image;
  Language language = Language::kPython;
  auto operator<=>(const PoolKey&) const = default;
};

struct IdleWorker {
  std::unique_ptr<Worker> worker;
  double since = 0;
};

struct Pool {
  std::deque<IdleWorker> idle;  // back: most recently returned (taken first, keeps caches warm)
  int busy = 0;
  int creating = 0;
  int waiting = 0;
  bool prewarmed = false;  // the default pool: kept warm from the start
  uint64_t calls = 0;
  double last_call = -1e18;
  uint64_t create_failures = 0;  // all time: waiters compare it to see a creation fail
  int failures_in_a_row = 0;
  double next_create_after = 0;  // backoff after failures (maintainer only)
  std::optional<Error> last_error;
};

class Service : public FunctionService {
 public:
  Service(FunctionServiceOptions options, WorkerSandboxFactory factory)
      : options_(std::move(options)), factory_(std::move(factory)) {}
  ~Service() override { shutdown(); }

  void begin() {
    std::lock_guard lock(mu_);
    if (options_.prewarm_default && !options_.default_image.empty() && options_.min_idle_workers > 0) {
      pools_[{options_.default_image, Language::kPython}].prewarmed = true;
    }
    maintainer_ = std::thread([this] { maintain(); });
  }

  Result<ExecResult> call(const CallRequest& request) override;
  Result<ExecResult> callOnce(const CallRequest& request, bool* started);
  FncallStats stats() override;
  void renderMetrics(std::string* out) override;
  void shutdown() override;

 private:
  void startCreate(const PoolKey& key);               // mu_ held
  void destroyLater(std::unique_ptr<Worker> worker);  // mu_ held
  bool evictIdleOutside(const PoolKey& key);          // mu_ held
  void runBackground(std::function<void()> fn);       // mu_ held
  // The most recently returned idle worker that is alive (dead ones are replaced); null when none.
  std::unique_ptr<Worker> takeIdle(Pool& pool);  // mu_ held
  // A worker of the pool for the call that began at `start`: an idle one, or one made for it within the queue
  // wait; counts the call.
  Result<std::unique_ptr<Worker>> checkOut(const PoolKey& key, double start);
  // Returns the worker after its call (replaced when unhealthy) and counts the call's outcome.
  void checkIn(const PoolKey& key, std::unique_ptr<Worker> worker, const Result<ExecResult>& result, bool healthy,
               bool started, double start);
  bool wanted(const Pool& pool, double now) const;
  void maintain();

  const FunctionServiceOptions options_;
  const WorkerSandboxFactory factory_;

  std::mutex mu_;
  std::condition_variable cv_;  // a worker came back, was created or failed; stopping
  std::map<PoolKey, Pool> pools_;
  std::set<Worker*> busy_;
  int total_ = 0;  // idle + busy + creating, over all pools
  int background_ = 0;
  bool stopping_ = false;
  bool stopped_ = false;
  std::thread maintainer_;

  uint64_t calls_ = 0, errors_ = 0, timeouts_ = 0, ooms_ = 0, rejected_ = 0;
  uint64_t created_ = 0, create_failures_ = 0, replaced_ = 0, shrunk_ = 0;
  double call_seconds_ = 0;
};

void Service::runBackground(std::function<void()> fn) {
  ++background_;
  std::thread([this, fn = std::move(fn)] {
    fn();
    std::lock_guard lock(mu_);
    --background_;
    cv_.notify_all();
  }).detach();
}

void Service::startCreate(const PoolKey& key) {
  Pool& pool = pools_[key];
  ++total_;
  ++pool.creating;
  WorkerConfig config;
  config.id = options_.node_name + "-fn-" + randomHex(12);
  config.image = key.image;
  config.language = key.language;
  config.pids = options_.worker_pids;
  config.disk_bytes = options_.worker_disk_bytes;
  config.python = options_.python;
  runBackground([this, key, config] {
    auto worker = Worker::start(config, factory_);
    std::unique_lock lock(mu_);
    Pool& pool = pools_[key];
    --pool.creating;
    if (!worker.ok()) {
      --total_;
      ++pool.create_failures;
      ++create_failures_;
      ++pool.failures_in_a_row;
      pool.next_create_after =
          monotonicSeconds() + std::min(kMaxCreateBackoffSeconds, std::pow(2.0, pool.failures_in_a_row - 1));
      // Once per run of failures (or when the cause changes): a node whose default image is not built yet
      // would otherwise log the same line at every backoff step, forever.
      bool same_cause = pool.last_error && pool.last_error->message() == worker.error().message();
      if (!same_cause) {
        DSEC_LOG(kWarn, kLog) << worker.error().toString() << " (retrying with backoff; logged once)";
      }
      pool.last_error = worker.error();
      cv_.notify_all();
      return;
    }
    pool.failures_in_a_row = 0;
    pool.last_error.reset();
    ++created_;
    if (stopping_) {
      --total_;
      lock.unlock();
      (void)(*worker)->destroy();
      return;
    }
    pool.idle.push_back({std::move(*worker), monotonicSeconds()});
    cv_.notify_all();
  });
}

void Service::destroyLater(std::unique_ptr<Worker> worker) {
  // std::function needs a copyable callable: the worker travels as a shared_ptr.
  std::shared_ptr<Worker> w(std::move(worker));
  runBackground([w] {
    Status st = w->destroy();
    if (!st.ok()) DSEC_LOG(kWarn, kLog) << "destroying worker " << w->id() << ": " << st.error().toString();
  });
}

bool Service::evictIdleOutside(const PoolKey& key) {
  Pool* victim = nullptr;
  for (auto& [k, pool] : pools_) {
    if (k == key || pool.idle.empty()) continue;
    if (victim == nullptr || pool.idle.front().since < victim->idle.front().since) victim = &pool;
  }
  if (victim == nullptr) return false;
  auto w = std::move(victim->idle.front().worker);
  victim->idle.pop_front();
  --total_;
  ++shrunk_;
  destroyLater(std::move(w));
  return true;
}

bool Service::wanted(const Pool& pool, double now) const {
  return pool.prewarmed || now - pool.last_call < kWantedShrinkPeriods * options_.idle_shrink_seconds;
}

Result<ExecResult> Service::call(const CallRequest& request) {
  DSEC_TRY(validateCallRequest(request));
  // A worker found dead when handed the request ran nothing: try another (bounded, within the queue wait).
  constexpr int kAttempts = 3;
  for (int attempt = 1;; ++attempt) {
    bool started = true;
    Result<ExecResult> r = callOnce(request, &started);
    if (started || attempt == kAttempts) return r;
  }
}

Result<ExecResult> Service::callOnce(const CallRequest& request, bool* started) {
  const std::string image = request.image.empty() ? options_.default_image : request.image;
  if (image.empty()) return Error::invalid("fncall field 'image': none given and the node has no default image");
  const PoolKey key{image, request.language};
  const double start = monotonicSeconds();
  DSEC_ASSIGN_OR_RETURN(std::unique_ptr<Worker> worker, checkOut(key, start));
  bool healthy = false;
  Result<ExecResult> result = worker->call(request, &healthy, started);
  checkIn(key, std::move(worker), result, healthy, *started, start);
  return result;
}

std::unique_ptr<Worker> Service::takeIdle(Pool& pool) {
  while (!pool.idle.empty()) {
    auto w = std::move(pool.idle.back().worker);
    pool.idle.pop_back();
    if (!w->dead()) return w;
    // Its zygote died while idle.
    --total_;
    ++replaced_;
    destroyLater(std::move(w));
  }
  return nullptr;
}

Result<std::unique_ptr<Worker>> Service::checkOut(const PoolKey& key, double start) {
  const auto deadline =
      Clock::now() + std::chrono::microseconds(static_cast<int64_t>(options_.queue_wait_seconds * 1e6));
  std::unique_lock lock(mu_);
  if (stopping_) return Error(ErrorCode::kUnavailable, "the fncall service is shutting down");
  Pool& pool = pools_[key];
  ++pool.calls;
  ++calls_;
  pool.last_call = start;
  const uint64_t failures_seen = pool.create_failures;
  std::optional<Error> create_error;
  std::unique_ptr<Worker> worker;
  ++pool.waiting;
  for (;;) {
    worker = takeIdle(pool);
    if (worker || stopping_) break;
    if (pool.create_failures != failures_seen && pool.creating == 0 && pool.last_error) {
      create_error = pool.last_error;  // the worker this call waited for could not be made
      break;
    }
    if (pool.creating < pool.waiting) {
      if (total_ < options_.max_workers || evictIdleOutside(key)) startCreate(key);
    }
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && pool.idle.empty()) break;
  }
  --pool.waiting;
  if (!worker) {
    ++errors_;
    if (stopping_) return Error(ErrorCode::kUnavailable, "the fncall service is shutting down");
    if (create_error) return create_error->wrap("no fncall worker could be started");
    ++rejected_;
    return Error(ErrorCode::kResourceExhausted,
                 "no fncall worker for " + std::string(languageName(key.language)) + " on " + key.image +
                     " became free within " + secondsText(options_.queue_wait_seconds) + " s (" +
                     std::to_string(total_) + " of " + std::to_string(options_.max_workers) +
                     " workers on this node, all busy or starting)");
  }
  ++pool.busy;
  busy_.insert(worker.get());
  return worker;
}

void Service::checkIn(const PoolKey& key, std::unique_ptr<Worker> worker, const Result<ExecResult>& result,
                      bool healthy, bool started, double start) {
  std::lock_guard lock(mu_);
  Pool& pool = pools_[key];
  --pool.busy;
  busy_.erase(worker.get());
  call_seconds_ += monotonicSeconds() - start;
  if (!started) {
    --calls_;  // counted again by the retry
    --pool.calls;
  } else if (result.ok()) {
    if (result->timed_out) ++timeouts_;
    if (result->oom_killed) ++ooms_;
  } else {
    ++errors_;
  }
  if (healthy && !stopping_) {
    pool.idle.push_back({std::move(worker), monotonicSeconds()});
  } else {
    --total_;
    if (!healthy) {
      ++replaced_;
      DSEC_LOG(kInfo, kLog) << "replacing worker " << worker->id();
    }
    destroyLater(std::move(worker));
    if (!stopping_ && pool.waiting > pool.creating && total_ < options_.max_workers) startCreate(key);
  }
  cv_.notify_all();
}

void Service::maintain() {
  std::unique_lock lock(mu_);
  const double period = std::clamp(options_.idle_shrink_seconds / 4, 0.05, 1.0);
  while (!stopping_) {
    cv_.wait_for(lock, std::chrono::microseconds(static_cast<int64_t>(period * 1e6)));
    if (stopping_) break;
    const double now = monotonicSeconds();
    for (auto& [key, pool] : pools_) {
      for (auto it = pool.idle.begin(); it != pool.idle.end();) {
        if (it->worker->dead()) {
          DSEC_LOG(kInfo, kLog) << "worker " << it->worker->id() << " died while idle; replacing it";
          --total_;
          ++replaced_;
          destroyLater(std::move(it->worker));
          it = pool.idle.erase(it);
        } else {
          ++it;
        }
      }
      const size_t keep = wanted(pool, now) ? static_cast<size_t>(std::max(0, options_.min_idle_workers)) : 0;
      while (pool.idle.size() > keep && now - pool.idle.front().since >= options_.idle_shrink_seconds) {
        --total_;
        ++shrunk_;
        destroyLater(std::move(pool.idle.front().worker));
        pool.idle.pop_front();
      }
      if (wanted(pool, now) && now >= pool.next_create_after) {
        while (pool.idle.size() + static_cast<size_t>(pool.creating) < keep && total_ < options_.max_workers) {
          startCreate(key);
        }
      }
    }
  }
}

void Service::shutdown() {
  std::vector<std::unique_ptr<Worker>> idle;
  {
    std::lock_guard lock(mu_);
    if (stopped_ || stopping_) return;
    stopping_ = true;
    for (Worker* w : busy_) w->kill();  // calls in flight return now ("worker died")
    for (auto& [key, pool] : pools_) {
      for (auto& iw : pool.idle) idle.push_back(std::move(iw.worker));
      total_ -= static_cast<int>(pool.idle.size());
      pool.idle.clear();
    }
    cv_.notify_all();
  }
  if (maintainer_.joinable()) maintainer_.join();
  for (auto& w : idle) {
    Status st = w->destroy();
    if (!st.ok()) DSEC_LOG(kWarn, kLog) << "destroying worker " << w->id() << ": " << st.error().toString();
  }
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return busy_.empty() && background_ == 0; });
  stopped_ = true;
}

FncallStats Service::stats() {
  std::lock_guard lock(mu_);
  FncallStats s;
  for (const auto& [key, pool] : pools_) {
    FncallPoolStats p;
    p.image = key.image;
    p.language = key.language;
    p.idle = static_cast<int>(pool.idle.size());
    p.busy = pool.busy;
    p.creating = pool.creating;
    p.waiting = pool.waiting;
    p.calls = pool.calls;
    if (pool.last_error) p.last_error = pool.last_error->message();
    s.idle += p.idle;
    s.busy += p.busy;
    s.creating += p.creating;
    s.pools.push_back(std::move(p));
  }
  s.max_workers = options_.max_workers;
  s.workers = total_;
  s.calls = calls_;
  s.errors = errors_;
  s.timeouts = timeouts_;
  s.oom_kills = ooms_;
  s.rejected = rejected_;
  s.workers_created = created_;
  s.worker_create_failures = create_failures_;
  s.workers_replaced = replaced_;
  s.workers_shrunk = shrunk_;
  s.call_seconds = call_seconds_;
  return s;
}

void Service::renderMetrics(std::string* out) {
  FncallStats s = stats();
  auto counter = [&](const char* name, const char* help, uint64_t value) {
    prometheus::counter(out, name, help, value);
  };
  counter("dsec_fncall_calls_total", "Function calls received.", s.calls);
  counter("dsec_fncall_call_errors_total", "Function calls that failed (no result).", s.errors);
  counter("dsec_fncall_timeouts_total", "Function calls killed at their timeout.", s.timeouts);
  counter("dsec_fncall_oom_kills_total", "Function calls killed at their memory limit.", s.oom_kills);
  counter("dsec_fncall_rejected_total", "Function calls rejected for lack of a free worker.", s.rejected);
  counter("dsec_fncall_workers_created_total", "Workers started.", s.workers_created);
  counter("dsec_fncall_worker_create_failures_total", "Workers that failed to start.", s.worker_create_failures);
  counter("dsec_fncall_workers_replaced_total", "Workers destroyed after dying or failing.", s.workers_replaced);
  counter("dsec_fncall_workers_shrunk_total", "Idle workers destroyed to shrink a pool.", s.workers_shrunk);
  prometheus::family(out, "dsec_fncall_workers", "gauge", "Workers by state.");
  for (auto [state, count] :
       {std::pair{"idle", s.idle}, std::pair{"busy", s.busy}, std::pair{"creating", s.creating}}) {
    prometheus::sample(out, "dsec_fncall_workers", {{"state", state}}, prometheus::number(count));
  }
  prometheus::family(out, "dsec_fncall_call_seconds", "summary", "Time from receiving a call to its result.");
  prometheus::sample(out, "dsec_fncall_call_seconds_sum", std::to_string(s.call_seconds));
  prometheus::sample(out, "dsec_fncall_call_seconds_count", prometheus::number(s.calls));
}

}  // namespace

Result<std::unique_ptr<FunctionService>> FunctionService::start(const FunctionServiceOptions& options,
                                                                WorkerSandboxFactory factory) {
  if (!factory) return Error::invalid("fncall needs a worker sandbox factory");
  if (options.max_workers <= 0) return Error::invalid("fncall max_workers must be positive");
  if (options.min_idle_workers < 0 || options.min_idle_workers > options.max_workers) {
    return Error::invalid("fncall min_idle_workers must be between 0 and max_workers");
  }
  if (!(options.queue_wait_seconds >= 0) || !(options.idle_shrink_seconds > 0)) {
    return Error::invalid("fncall queue_wait_seconds must be >= 0 and idle_shrink_seconds > 0");
  }
  if (options.worker_pids < 8) return Error::invalid("fncall worker_pids must be at least 8");
  if (options.node_name.empty()) return Error::invalid("fncall needs a node name");
  auto service = std::make_unique<Service>(options, std::move(factory));
  service->begin();
  return std::unique_ptr<FunctionService>(std::move(service));
}

}  // namespace dsec::backends::fncall
