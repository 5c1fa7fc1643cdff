// dsec bench fork --backend microvm|vm: one source sandbox runs a small command (it writes a file), then
// POST .../fork {"count": N}. Measured: the fork's total latency; each copy's first command (it reads the
// source's file: the copy carries the source's state); N sequential single restores of the fork's snapshot
// (the per-copy cost on its own); and the host memory each copy's QEMU costs (PSS from smaps_rollup) right
// after the fork and after each copy ran its command, beside the source's RSS.
#include "BenchFork.h"

#include <cmath>
#include <cstdio>
#include <iostream>

#include "BenchMachine.h"
#include "Progress.h"
#include "dsec/common/Strings.h"

namespace dsec::cli {
namespace {

// The target: a fork's own host memory at most this share of its parent's RSS.
constexpr double kForkMemoryTargetShare = 0.10;

struct CopyMemory {
  std::vector<double> pss_mib;
  std::vector<double> private_mib;
  int missing = 0;  // copies whose QEMU was not found or not readable
  double meanPss() const { return mean(pss_mib); }
  double maxPss() const { return percentile(pss_mib, 100); }
  double meanPrivate() const { return mean(private_mib); }
  static double mean(const std::vector<double>& v) {
    double sum = 0;
    for (double x : v) sum += x;
    return v.empty() ? 0 : sum / static_cast<double>(v.size());
  }
};

CopyMemory measureCopies(const std::string& backend, const std::vector<std::string>& ids) {
  CopyMemory memory;
  for (const auto& id : ids) {
    auto pid = findSandboxQemu(backend, id);
    auto usage = pid.ok() ? readProcessMemory(*pid) : Result<ProcessMemory>(pid.error());
    if (!usage.ok()) {
      ++memory.missing;
      continue;
    }
    memory.pss_mib.push_back(toMiB(usage->pss));
    memory.private_mib.push_back(toMiB(usage->private_));
  }
  return memory;
}

void printMemory(const char* when, const CopyMemory& m) {
  std::printf("per-fork QEMU %s: PSS mean %.1f MiB, max %.1f MiB; private mean %.1f MiB (%zu copies", when, m.meanPss(),
              m.maxPss(), m.meanPrivate(), m.pss_mib.size());
  if (m.missing > 0) std::printf(", %d not measured", m.missing);
  std::printf(")\n");
}

double rounded(double v) { return std::round(v * 100) / 100; }

}  // namespace

int benchForkMachine(const Invocation& inv, const ForkBenchOptions& options) {
  auto target = openBenchTarget(options.target);
  if (!target.ok()) return reportError(inv, target.error());
  ApiClient client(target->address);
  auto stop_node = [&] {
    if (target->node) target->node->stop(true);
  };
  if (Status usable = requireNodeBackend(client, options.backend); !usable.ok()) {
    stop_node();
    return reportError(inv, usable.error());
  }
  const int count = options.count;
  std::cout << "bench fork: " << count << " copies of a " << options.backend << " sandbox (" << target->image
            << ") against " << target->address.endpoint << "; load " << loadAverages() << "\n";
  std::fflush(stdout);
  Progress progress("bench fork");
  std::vector<std::string> to_destroy;
  std::string snapshot;
  auto cleanup = [&] {
    for (const auto& id : to_destroy) (void)client.call(HttpMethod::kDelete, "/v1/sandboxes/" + percentEncode(id));
    if (!snapshot.empty()) (void)client.call(HttpMethod::kDelete, "/v1/snapshots/" + percentEncode(snapshot));
    stop_node();
    progress.finish();
  };
  auto fail = [&](const Error& error) {
    cleanup();
    return reportError(inv, error);
  };

  progress.step("source: create and run a command", 1);
  nlohmann::json create_body{{"image", target->image}, {"backend", options.backend}};
  if (options.memory_bytes > 0) create_body["memory"] = options.memory_bytes;
  auto source = client.call(HttpMethod::kPost, "/v1/sandboxes", create_body);
  if (!source.ok()) return fail(source.error());
  const std::string source_id = source->value("id", "");
  const int64_t guest_memory = source->value("memory", int64_t{0});
  to_destroy.push_back(source_id);
  const std::string marker = "forked-from-" + source_id;
  if (Status ran = execOk(client, source_id, {"sh", "-c", "echo " + marker + " > /tmp/bench-fork-source"}); !ran.ok()) {
    return fail(ran.error());
  }
  progress.advance();
  auto source_pid = findSandboxQemu(options.backend, source_id);
  auto parent = source_pid.ok() ? readProcessMemory(*source_pid) : Result<ProcessMemory>(source_pid.error());
  if (!parent.ok()) return fail(parent.error());

  progress.step("fork", 1);
  double t0 = monotonicSeconds();
  auto fork = forkSandbox(client, source_id, count);
  double fork_ms = (monotonicSeconds() - t0) * 1000.0;
  if (!fork.ok()) return fail(fork.error());
  progress.advance();
  snapshot = fork->snapshot;
  to_destroy.insert(to_destroy.end(), fork->ids.begin(), fork->ids.end());
  CopyMemory after_fork = measureCopies(options.backend, fork->ids);

  progress.step("a command in each copy", count);
  std::vector<double> first_exec_ms;
  int wrong_state = 0;
  int failures = 0;
  std::string first_error;
  auto failed = [&](const std::string& what) {
    ++failures;
    if (first_error.empty()) first_error = what;
  };
  for (const auto& id : fork->ids) {
    double e0 = monotonicSeconds();
    auto ran = client.call(HttpMethod::kPost, "/v1/sandboxes/" + percentEncode(id) + "/exec",
                           {{"cmd", {"cat", "/tmp/bench-fork-source"}}, {"timeout", 600}});
    double e1 = monotonicSeconds();
    progress.advance();
    if (!ran.ok()) {
      failed("exec in copy " + id + ": " + ran.error().message());
      continue;
    }
    if (ran->value("exit_code", -1) != 0 || trim(ran->value("stdout", "")) != marker) ++wrong_state;
    first_exec_ms.push_back((e1 - e0) * 1000.0);
  }
  CopyMemory after_exec = measureCopies(options.backend, fork->ids);
  auto parent_now = readProcessMemory(*source_pid);

  // The copies go before the single restores are timed: idle guests left running share the host's cores.
  progress.step("destroy the copies", count);
  for (const auto& id : fork->ids) {
    (void)client.call(HttpMethod::kDelete, "/v1/sandboxes/" + percentEncode(id));
    progress.advance();
  }
  to_destroy.resize(1);
  progress.step("single restores of the fork's snapshot", count);
  std::vector<double> restore_ms;
  std::vector<double> restore_exec_ms;
  for (int i = 0; i < count; ++i) {
    double r0 = monotonicSeconds();
    auto restored = client.call(HttpMethod::kPost, "/v1/sandboxes", {{"snapshot", snapshot}});
    double r1 = monotonicSeconds();
    progress.advance();
    if (!restored.ok()) {
      failed("restore: " + restored.error().message());
      continue;
    }
    std::string id = restored->value("id", "");
    Status ran = execOk(client, id, {"true"});
    double r2 = monotonicSeconds();
    (void)client.call(HttpMethod::kDelete, "/v1/sandboxes/" + percentEncode(id));
    if (!ran.ok()) {
      failed("first exec after a restore: " + ran.error().message());
      continue;
    }
    restore_ms.push_back((r1 - r0) * 1000.0);
    restore_exec_ms.push_back((r2 - r0) * 1000.0);
  }
  cleanup();

  const double parent_rss_mib = toMiB(parent->rss);
  std::printf("%s, guest RAM %lld MiB; source QEMU RSS %.1f MiB before the fork, %.1f MiB after the copies ran\n",
              options.backend.c_str(), static_cast<long long>(guest_memory >> 20), parent_rss_mib,
              parent_now.ok() ? toMiB(parent_now->rss) : 0.0);
  std::printf("fork of %d: %.2f ms in all, %.2f ms per copy\n", count, fork_ms, fork_ms / count);
  std::printf("first command in each copy: p50 %.2f ms  p99 %.2f ms  (%d of %d saw the source's file)\n",
              percentile(first_exec_ms, 50), percentile(first_exec_ms, 99),
              static_cast<int>(first_exec_ms.size()) - wrong_state, count);
  std::printf(
      "single restore, one at a time: create p50 %.2f ms  p99 %.2f ms; with first exec p50 %.2f ms  p99 %.2f ms "
      "(%zu of %d)\n",
      percentile(restore_ms, 50), percentile(restore_ms, 99), percentile(restore_exec_ms, 50),
      percentile(restore_exec_ms, 99), restore_ms.size(), count);
  if (failures > 0) std::printf("%d failed; the first: %s\n", failures, first_error.c_str());
  printMemory("right after the fork", after_fork);
  printMemory("after a command in each", after_exec);
  const double share = parent_rss_mib > 0 ? after_exec.meanPss() / parent_rss_mib : 0;
  const bool memory_met = after_exec.missing == 0 && !after_exec.pss_mib.empty() && share <= kForkMemoryTargetShare;
  std::printf(
      "target per-fork PSS <= %.0f%% of the parent's RSS (%.1f MiB): %s (mean %.1f MiB after a command, %.1f%%)\n",
      kForkMemoryTargetShare * 100, parent_rss_mib, memory_met ? "met" : "NOT met", after_exec.meanPss(), share * 100);
  std::printf("load at the end: %s\n", loadAverages().c_str());
  nlohmann::json summary{{"backend", options.backend},
                         {"count", count},
                         {"fork_ms", rounded(fork_ms)},
                         {"fork_per_copy_ms", rounded(fork_ms / count)},
                         {"copy_first_exec_p50_ms", rounded(percentile(first_exec_ms, 50))},
                         {"restore_p50_ms", rounded(percentile(restore_ms, 50))},
                         {"restore_p99_ms", rounded(percentile(restore_ms, 99))},
                         {"restore_exec_p50_ms", rounded(percentile(restore_exec_ms, 50))},
                         {"parent_rss_mib", rounded(parent_rss_mib)},
                         {"fork_pss_mib_after_fork", rounded(after_fork.meanPss())},
                         {"fork_pss_mib_after_exec", rounded(after_exec.meanPss())},
                         {"fork_pss_max_mib_after_exec", rounded(after_exec.maxPss())},
                         {"fork_private_mib_after_exec", rounded(after_exec.meanPrivate())},
                         {"memory_target_share", kForkMemoryTargetShare},
                         {"memory_target_met", memory_met},
                         {"copies_with_source_state", static_cast<int>(first_exec_ms.size()) - wrong_state},
                         {"failures", failures}};
  std::fflush(stdout);
  std::cout << summary.dump() << std::endl;
  return failures == 0 && wrong_state == 0 && after_exec.missing == 0 ? kExitOk : kExitFailure;
}

int benchFork(const Invocation& inv) {
  CommonOptions common;
  po::options_description desc("options");
  addCommonOptions(desc, &common, true);
  addBenchTargetOptions(desc);
  desc.add_options()("backend", po::value<std::string>()->default_value("microvm"), "microvm, vm or container")(
      "count", po::value<int>(), "copies (default: 4 for microvm|vm, 64 for container)")(
      "memory", po::value<std::string>(), "microvm|vm: guest RAM (default: the node's)")(
      "workspace-mib", po::value<int>()->default_value(200), "container: MiB of random data the source writes")(
      "workspace-files", po::value<int>()->default_value(8), "container: in this many files under /work");
  po::variables_map vm;
  if (!parseCommandLine(inv, inv.args, desc, {},
                        "--backend microvm|vm|container --count N [--memory SIZE] [--workspace-mib 200]", &vm,
                        &common)) {
    return kExitOk;
  }
  ForkBenchOptions options;
  options.target = benchTargetOptions(vm, common);
  options.backend = vm["backend"].as<std::string>();
  const bool container = options.backend == "container";
  if (!container && options.backend != "microvm" && options.backend != "vm") {
    throw UsageError("--backend must be microvm, vm or container");
  }
  options.count = vm.count("count") != 0 ? vm["count"].as<int>() : (container ? 64 : 4);
  if (options.count <= 0 || options.count > 256) throw UsageError("--count must be in 1..256 (a fork's limit)");
  if (vm.count("memory") != 0) {
    auto bytes = parseByteSize(vm["memory"].as<std::string>());
    if (!bytes.ok()) throw UsageError("--memory: " + bytes.error().message());
    options.memory_bytes = *bytes;
  }
  options.workspace_mib = vm["workspace-mib"].as<int>();
  options.workspace_files = vm["workspace-files"].as<int>();
  if (options.workspace_mib <= 0 || options.workspace_mib > 4096)
    throw UsageError("--workspace-mib must be in 1..4096");
  if (options.workspace_files <= 0 || options.workspace_files > options.workspace_mib) {
    throw UsageError("--workspace-files must be in 1..--workspace-mib");
  }
  options.target.max_sandboxes = std::max<int64_t>(4096, 2 * options.count + 16);
  raiseFileLimit();
  return container ? benchForkContainer(inv, options) : benchForkMachine(inv, options);
}

}  // namespace dsec::cli
