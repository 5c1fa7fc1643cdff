// dsec bench create: C client threads, each with its own keep-alive connection, create sandboxes and run `true`
// in each; the latency sample is create request start to first exec completion. All sandboxes stay alive until
// the phase ends (node memory is measured then), and are destroyed afterwards.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <mutex>

#include "BenchMachineCreate.h"
#include "BenchSupport.h"
#include "Progress.h"
#include "dsec/backends/BackendKind.h"
#include "dsec/common/Strings.h"

namespace dsec::cli {
namespace {

struct CreatePhase {
  std::vector<double> latencies_ms;  // create request start to first exec completion
  std::vector<double> create_ms;     // the create request alone
  std::vector<std::string> ids;
  int failures = 0;
  std::string first_error;
  double wall = 0;
};

// count creates of create_body, each followed by `true`, on `concurrency` keep-alive connections.
CreatePhase createAll(const BenchTarget& target, const nlohmann::json& create_body, int count, int concurrency,
                      Progress& progress) {
  CreatePhase phase;
  std::mutex mu;
  std::atomic<int> next{0};
  nlohmann::json exec_body{{"cmd", nlohmann::json::array({"true"})}};
  double start = monotonicSeconds();
  runWorkers(target.address, concurrency, [&](ApiClient& client, int) {
    while (next++ < count) {
      double t0 = monotonicSeconds();
      double t1 = t0;
      std::string error = createAndExec(client, create_body, exec_body, &mu, &phase.ids, &t1);
      double t2 = monotonicSeconds();
      progress.advance();
      std::lock_guard lock(mu);
      if (!error.empty()) {
        ++phase.failures;
        if (phase.first_error.empty()) phase.first_error = error;
        continue;
      }
      phase.latencies_ms.push_back((t2 - t0) * 1000.0);
      phase.create_ms.push_back((t1 - t0) * 1000.0);
    }
  });
  phase.wall = monotonicSeconds() - start;
  return phase;
}

}  // namespace

int benchCreate(const Invocation& inv) {
  CommonOptions common;
  po::options_description desc("options");
  addCommonOptions(desc, &common, true);
  addBenchTargetOptions(desc);
  desc.add_options()(
      "backend",
      po::value<std::string>()->default_value(dsec::backends::backendKindName(dsec::backends::BackendKind::kContainer)),
      "sandbox backend: container, or microvm|vm (cold, restore and a plain QEMU peer, one at a time)")(
      "count", po::value<int>()->default_value(100), "sandboxes to create (microvm|vm: 10 of each kind)")(
      "concurrency", po::value<int>()->default_value(8), "client threads, one connection each (container)")(
      "memory", po::value<std::string>(), "microvm|vm: guest RAM (default: the node's)");
  po::variables_map vm;
  if (!parseCommandLine(inv, inv.args, desc, {},
                        "--backend container --count N --concurrency C [--image IMAGE]\n"
                        "       --backend microvm|vm [--count N] [--memory SIZE] [--image IMAGE]",
                        &vm, &common)) {
    return kExitOk;
  }
  int count = vm["count"].as<int>();
  std::string backend = vm["backend"].as<std::string>();
  if (backend == "microvm" || backend == "vm") {
    MachineCreateOptions machine;
    machine.target = benchTargetOptions(vm, common);
    machine.backend = backend;
    machine.count = vm["count"].defaulted() ? 10 : count;
    if (machine.count <= 0) throw UsageError("--count must be > 0");
    if (vm.count("memory") != 0) {
      auto bytes = parseByteSize(vm["memory"].as<std::string>());
      if (!bytes.ok()) throw UsageError("--memory: " + bytes.error().message());
      machine.memory_bytes = *bytes;
    }
    return benchMachineCreate(inv, machine);
  }
  int concurrency = vm["concurrency"].as<int>();
  if (count <= 0) throw UsageError("--count must be > 0");
  if (concurrency <= 0 || concurrency > 1024) throw UsageError("--concurrency must be in 1..1024");
  raiseFileLimit();

  BenchTargetOptions target_options = benchTargetOptions(vm, common);
  target_options.max_sandboxes = std::max<int64_t>(4096, count + 16);
  auto target = openBenchTarget(target_options);
  if (!target.ok()) return reportError(inv, target.error());
  std::cout << "bench create: " << count << " x " << target->image << " (" << backend << ") at concurrency "
            << concurrency << " against " << target->address.endpoint << "\n";
  auto mem_before = hostMemoryUsedMb();
  if (!mem_before.ok()) return reportError(inv, mem_before.error());
  Progress progress("bench create");
  progress.step("create and exec", count);
  CreatePhase phase =
      createAll(*target, {{"image", target->image}, {"backend", backend}}, count, concurrency, progress);
  auto mem_after = hostMemoryUsedMb();

  double destroy_start = monotonicSeconds();
  progress.step("destroy", static_cast<int64_t>(phase.ids.size()));
  int destroy_failures = destroyAll(target->address, phase.ids, concurrency, &progress);
  double destroy_seconds = monotonicSeconds() - destroy_start;
  if (target->node) target->node->stop(true);
  progress.finish();

  const auto& latencies_ms = phase.latencies_ms;
  double per_second = static_cast<double>(latencies_ms.size()) / phase.wall;
  std::printf("created %zu sandboxes in %.3f s (%.1f/s), %d failures\n", latencies_ms.size(), phase.wall, per_second,
              phase.failures);
  std::printf("create+first exec: p50 %.2f ms  p90 %.2f ms  p99 %.2f ms  max %.2f ms\n", percentile(latencies_ms, 50),
              percentile(latencies_ms, 90), percentile(latencies_ms, 99), percentile(latencies_ms, 100));
  std::printf("create request alone: p50 %.2f ms  p99 %.2f ms\n", percentile(phase.create_ms, 50),
              percentile(phase.create_ms, 99));
  std::printf("node memory used: %.0f MB before, %.0f MB with all alive; destroyed all in %.3f s (%d failed)\n",
              *mem_before, mem_after.ok() ? *mem_after : 0.0, destroy_seconds, destroy_failures);
  if (!phase.first_error.empty()) std::printf("first failure: %s\n", phase.first_error.c_str());
  nlohmann::json summary{{"count", count},
                         {"concurrency", concurrency},
                         {"p50_ms", std::round(percentile(latencies_ms, 50) * 1000) / 1000},
                         {"p99_ms", std::round(percentile(latencies_ms, 99) * 1000) / 1000},
                         {"per_second", std::round(per_second * 10) / 10},
                         {"node_mem_before_mb", std::round(*mem_before)},
                         {"node_mem_after_mb", mem_after.ok() ? std::round(*mem_after) : 0.0},
                         {"failures", phase.failures}};
  std::fflush(stdout);
  std::cout << summary.dump() << std::endl;
  return phase.failures == 0 && destroy_failures == 0 ? kExitOk : kExitFailure;
}

}  // namespace dsec::cli
