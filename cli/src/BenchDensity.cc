// dsec bench density: holds as many idle sandboxes (a sleeping process in each) as asked or as the host allows,
// and reports the host memory each one costs.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <mutex>

#include "BenchSupport.h"
#include "dsec/common/Strings.h"

namespace dsec::cli {

int benchDensity(const Invocation& inv) {
  CommonOptions common;
  po::options_description desc("options");
  addCommonOptions(desc, &common, true);
  addBenchTargetOptions(desc);
  desc.add_options()("count", po::value<int>()->default_value(1000), "sandboxes to hold")(
      "concurrency", po::value<int>()->default_value(8), "client threads creating them")(
      "memory", po::value<std::string>()->default_value("64M"), "memory limit of each sandbox");
  po::variables_map vm;
  if (!parseCommandLine(inv, inv.args, desc, {}, "--count N [--image IMAGE]", &vm, &common)) return kExitOk;
  int count = vm["count"].as<int>();
  int concurrency = vm["concurrency"].as<int>();
  if (count <= 0) throw UsageError("--count must be > 0");
  if (concurrency <= 0 || concurrency > 1024) throw UsageError("--concurrency must be in 1..1024");
  int64_t memory = parseSizeOption("memory", vm["memory"].as<std::string>());
  raiseFileLimit();

  BenchTargetOptions target_options = benchTargetOptions(vm, common);
  target_options.max_sandboxes = std::max<int64_t>(4096, count + 16);
  auto target = openBenchTarget(target_options);
  if (!target.ok()) return reportError(inv, target.error());
  std::cout << "bench density: up to " << count << " idle sandboxes of " << target->image << " against "
            << target->address.endpoint << "\n";
  auto mem_before = hostMemoryUsedMb();
  if (!mem_before.ok()) return reportError(inv, mem_before.error());

  std::mutex mu;
  std::vector<std::string> ids;
  std::string first_error;
  std::atomic<int> next{0};
  std::atomic<bool> stop{false};
  std::atomic<int> held{0};
  nlohmann::json create_body{{"image", target->image}, {"memory", memory}};
  // setsid + redirections: the sleeper outlives the exec and holds none of its pipes, so the exec returns.
  nlohmann::json exec_body{{"cmd", "setsid sleep 100000 </dev/null >/dev/null 2>&1 &"}};

  double start = monotonicSeconds();
  runWorkers(target->address, concurrency, [&](ApiClient& client, int) {
    while (!stop.load() && next++ < count) {
      std::string error = createAndExec(client, create_body, exec_body, &mu, &ids);
      if (!error.empty()) {
        stop.store(true);
        std::lock_guard lock(mu);
        if (first_error.empty()) first_error = error;
        continue;
      }
      int now = ++held;
      if (now % 250 == 0) std::printf("  %d held after %.1f s\n", now, monotonicSeconds() - start), std::fflush(stdout);
    }
  });
  double seconds = monotonicSeconds() - start;
  auto mem_after = hostMemoryUsedMb();
  double per_sandbox = held.load() > 0 && mem_after.ok() ? (*mem_after - *mem_before) / held.load() : 0.0;

  double destroy_start = monotonicSeconds();
  int destroy_failures = destroyAll(target->address, ids, concurrency);
  double destroy_seconds = monotonicSeconds() - destroy_start;
  if (target->node) target->node->stop(true);

  std::printf("held %d of %d sandboxes (started in %.2f s); host memory %.0f -> %.0f MB = %.3f MB per sandbox\n",
              held.load(), count, seconds, *mem_before, mem_after.ok() ? *mem_after : 0.0, per_sandbox);
  std::printf("destroyed %zu in %.2f s (%d failed)\n", ids.size(), destroy_seconds, destroy_failures);
  if (!first_error.empty()) std::printf("stopped at the first failure: %s\n", first_error.c_str());
  nlohmann::json summary{{"held", held.load()},
                         {"host_mb_per_sandbox", std::round(per_sandbox * 1000) / 1000},
                         {"requested", count},
                         {"seconds", std::round(seconds * 100) / 100}};
  std::fflush(stdout);
  std::cout << summary.dump() << std::endl;
  return held.load() == count && destroy_failures == 0 ? kExitOk : kExitFailure;
}

}  // namespace dsec::cli
