// dsec bench density: holds as many idle sandboxes as asked or as the node admits, and reports the host memory
// each one costs. --workload plain: a sleeping process in each. --workload python: a Python REPL (python3 -i,
// waiting at its prompt) in each, held once with the density controller (--controller on) and once with
// static limits (off: committed memory <= capacity), and measures how the sandboxes share the image's
// layers in the page cache (docs/density.md).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <optional>
#include <utility>

#include "BenchDensityMemory.h"
#include "BenchSupport.h"
#include "Progress.h"
#include "dsec/common/Directory.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/LayerRef.h"
#include "dsec/fs3/LayerStore.h"
#include "dsec/launcher/node/NodeAgent.h"

namespace dsec::cli {
namespace {

using nlohmann::json;

constexpr double kMiB = 1 << 20;

double round3(double v) { return std::round(v * 1000) / 1000; }

struct RunConfig {
  std::string workload;
  bool controller = true;
  int count = 0;
  int concurrency = 0;
  int64_t memory = 0;
  double cpus = 0;
  int64_t node_memory = 0;  // 0: physical
  BenchTargetOptions target;
};

struct RunResult {
  int held = 0;
  double host_mb_per_sandbox = 0;
  double seconds = 0;
  double create_p50_first_ms = 0, create_p50_last_ms = 0;
  size_t create_p50_window = 0;
  std::string stopped_by;
  std::string detail = "{}";  // JSON text (a json member would make the implicit moves throwing)
};

// The node for one run (embedded, or the running fleet named), its sandboxes' cgroup parent limited when the
// node is embedded and has a memory capacity; *limited is the parent to remove afterwards ("" for none).
Result<BenchTarget> openDensityTarget(const RunConfig& rc, std::string* limited) {
  BenchTargetOptions target_options = rc.target;
  target_options.overcommit = rc.controller;
  target_options.memory_capacity_bytes = rc.node_memory;
  // Only the sandboxes under test in the node's cgroup: no warm fncall workers (python processes themselves).
  // CPU QoS does not change memory; the sandboxes ask for no CPU limit.
  target_options.fncall = false;
  target_options.cpu_qos = false;
  if (rc.node_memory > 0 && target_options.endpoint.empty() && !target_options.use_fleet) {
    *limited = limitParent(target_options.root, rc.node_memory + (512LL << 20));
  }
  return openBenchTarget(target_options);
}

// What each sandbox runs and leaves running.
json idleExecBody(const std::string& workload) {
  if (workload == "python") {
    // python3 -i reads its commands from a FIFO that a sleeper holds open, so the REPL waits at its prompt
    // for good; the exec returns once the prompt is there (the REPL is really up).
    return {{"cmd",
             "mkfifo /tmp/repl && (setsid sleep 1000000000 >/tmp/repl 2>/dev/null &) && "
             "(setsid python3 -i </tmp/repl >/tmp/repl.out 2>&1 &) && "
             "i=0; while [ $i -lt 300 ]; do grep -q '>>>' /tmp/repl.out 2>/dev/null && exit 0; sleep 0.1; "
             "i=$((i+1)); done; echo 'python3 -i did not reach its prompt:' >&2; cat /tmp/repl.out >&2; exit 1"},
            {"timeout", 120}};
  }
  // setsid + redirections: the sleeper outlives the exec and holds none of its pipes, so the exec returns.
  return {{"cmd", "setsid sleep 100000 </dev/null >/dev/null 2>&1 &"}};
}

struct Held {
  std::vector<std::string> ids;  // every sandbox created, to destroy
  int held = 0;                  // those whose workload started
  std::string first_error;       // what stopped the run ("" : the count was reached)
  double seconds = 0;
  // Each create request's latency, by when it started (seconds since the run began, milliseconds).
  std::vector<std::pair<double, double>> creates;
};

// p50 of the first and the last creates: 1,000 of each, or a tenth of them when there are fewer than 10,000 (the
// first show the empty node, the last the full one: a create's cost must not grow with the live sandboxes).
struct CreateP50s {
  double first_ms = 0, last_ms = 0;
  size_t window = 0;  // creates in each
};
CreateP50s firstAndLastCreateP50(std::vector<std::pair<double, double>> creates) {
  if (creates.empty()) return {};
  std::sort(creates.begin(), creates.end());
  const size_t window = creates.size() >= 10000 ? 1000 : std::max<size_t>(1, creates.size() / 10);
  std::vector<double> first, last;
  for (size_t i = 0; i < window; ++i) {
    first.push_back(creates[i].second);
    last.push_back(creates[creates.size() - window + i].second);
  }
  return {percentile(first, 50), percentile(last, 50), window};
}

// Creates sandboxes until the count is reached or one create or exec fails.
Held holdSandboxes(const BenchTarget& target, const RunConfig& rc, Progress& progress) {
  Held out;
  std::mutex mu;
  std::atomic<int> next{0};
  std::atomic<bool> stop{false};
  std::atomic<int> held{0};
  json create_body{{"image", target.image}, {"memory", rc.memory}};
  if (rc.cpus >= 0) create_body["cpus"] = rc.cpus;
  const json exec_body = idleExecBody(rc.workload);
  double start = monotonicSeconds();
  runWorkers(target.address, rc.concurrency, [&](ApiClient& client, int) {
    while (!stop.load() && next++ < rc.count) {
      const double began = monotonicSeconds();
      double created_at = 0;
      std::string error = createAndExec(client, create_body, exec_body, &mu, &out.ids, &created_at);
      {
        std::lock_guard lock(mu);
        out.creates.emplace_back(began - start, (created_at - began) * 1000);
      }
      if (!error.empty()) {
        stop.store(true);
        std::lock_guard lock(mu);
        if (out.first_error.empty()) out.first_error = error;
        continue;
      }
      ++held;
      progress.advance();
    }
  });
  out.seconds = monotonicSeconds() - start;
  out.held = held.load();
  return out;
}

// Host memory and page cache before and after the sandboxes, and the node's view of them.
struct MemoryReading {
  std::optional<double> host_before_mb, host_after_mb;
  // Open fds of this process (an embedded node is the agent) before and after the sandboxes; -1 when the node
  // runs elsewhere.
  int agent_fds_before = -1, agent_fds_after = -1;
  int64_t cache_before = 0, cache_after = 0;  // the image's layer pages resident, bytes
  ProcessMemory processes;
  // GET /v1/node "density" as JSON text ("" if none): a json member would make the implicit moves throwing.
  std::string node_density;
};

std::optional<double> hostMemoryMb() {
  auto mb = hostMemoryUsedMb();
  return mb.ok() ? std::optional<double>(*mb) : std::nullopt;
}

int openFdsIfEmbedded(const BenchTarget& target) {
  if (!target.node) return -1;
  auto fds = listDirectory("/proc/self/fd");
  return fds.ok() ? static_cast<int>(fds->size()) : -1;
}

void readAfter(const BenchTarget& target, const RunConfig& rc, MemoryReading* m) {
  m->host_after_mb = hostMemoryMb();
  m->agent_fds_after = openFdsIfEmbedded(target);
  m->cache_after = imageResidentBytes(rc.target.root, target.image);
  m->processes = sandboxProcessMemory(launcher::cgroupParentForRoot(rc.target.root));
  ApiClient client(target.address);
  if (auto node = client.call(HttpMethod::kGet, "/v1/node"); node.ok()) {
    if (auto density = node->value("density", json()); density.is_object()) m->node_density = density.dump();
  }
}

// Host memory per sandbox: what the host lost (MemTotal - MemAvailable, which leaves clean page cache out)
// plus the image's layer pages that came into the page cache, counted once however many sandboxes map them.
double cacheDeltaMb(const MemoryReading& m) {
  return static_cast<double>(std::max<int64_t>(0, m.cache_after - m.cache_before)) / kMiB;
}

RunResult runResult(const RunConfig& rc, const Held& held, const MemoryReading& m) {
  RunResult res;
  res.held = held.held;
  res.seconds = held.seconds;
  int n = std::max(1, res.held);
  if (m.host_before_mb && m.host_after_mb && res.held > 0) {
    res.host_mb_per_sandbox = (*m.host_after_mb - *m.host_before_mb + cacheDeltaMb(m)) / n;
  }
  res.stopped_by = held.first_error.empty() ? "count reached" : held.first_error;
  CreateP50s p50s = firstAndLastCreateP50(held.creates);
  res.create_p50_first_ms = p50s.first_ms;
  res.create_p50_last_ms = p50s.last_ms;
  res.create_p50_window = p50s.window;
  const ProcessMemory& pm = m.processes;
  json detail = {{"controller", rc.controller ? "on" : "off"},
                 {"held", res.held},
                 {"host_mb_per_sandbox", round3(res.host_mb_per_sandbox)},
                 {"seconds", std::round(res.seconds * 100) / 100},
                 {"create_p50_first_ms", round3(res.create_p50_first_ms)},
                 {"create_p50_last_ms", round3(res.create_p50_last_ms)},
                 {"load_average", loadAverages()},
                 {"stopped_by", res.stopped_by},
                 {"layer_cache_mb", round3(static_cast<double>(m.cache_after) / kMiB)},
                 {"rss_file_mb_per_sandbox", round3(pm.rss_file / kMiB / n)},
                 {"pss_file_mb_per_sandbox", round3(pm.pss_file / kMiB / n)},
                 {"rss_anon_mb_per_sandbox", round3(pm.rss_anon / kMiB / n)},
                 {"processes", pm.processes}};
  if (m.agent_fds_before >= 0 && m.agent_fds_after >= 0 && res.held > 0) {
    detail["agent_fds_per_sandbox"] = round3(static_cast<double>(m.agent_fds_after - m.agent_fds_before) / n);
  }
  if (pm.pss_file > 0) detail["file_sharing_factor"] = std::round(pm.rss_file / pm.pss_file * 10) / 10;
  if (!m.node_density.empty()) {
    json density = json::parse(m.node_density);
    detail["memory_ratio"] = density.value("memory_ratio", 0.0);
    detail["level"] = density.value("level", "");
    detail["paused"] = density.value("paused_sandboxes", 0);
    detail["actions_total"] = density.value("actions_total", json::object());
  }
  res.detail = detail.dump();
  return res;
}

void printRun(const RunConfig& rc, const RunResult& res, const MemoryReading& m) {
  const ProcessMemory& pm = m.processes;
  int n = std::max(1, res.held);
  std::printf(
      "held %d of %d sandboxes (started in %.2f s); host memory %.0f -> %.0f MB (+%.1f MB layer cache) = "
      "%.3f MB per sandbox\n",
      res.held, rc.count, res.seconds, m.host_before_mb.value_or(0.0), m.host_after_mb.value_or(0.0), cacheDeltaMb(m),
      res.host_mb_per_sandbox);
  std::printf("create p50: %.2f ms over the first %zu creates, %.2f ms over the last %zu (load average %s)\n",
              res.create_p50_first_ms, res.create_p50_window, res.create_p50_last_ms, res.create_p50_window,
              loadAverages().c_str());
  if (m.agent_fds_before >= 0 && m.agent_fds_after >= 0) {
    std::printf("agent open fds: %d -> %d (%.2f per sandbox)\n", m.agent_fds_before, m.agent_fds_after,
                static_cast<double>(m.agent_fds_after - m.agent_fds_before) / n);
  }
  if (pm.processes > 0) {
    std::printf(
        "page cache: the image's layers hold %.1f MB resident, counted once; each sandbox maps %.2f MB of "
        "file pages (RssFile) but its proportional share is %.2f MB (Pss_File): %.0fx shared\n",
        static_cast<double>(m.cache_after) / kMiB, pm.rss_file / kMiB / n, pm.pss_file / kMiB / n,
        pm.pss_file > 0 ? pm.rss_file / pm.pss_file : 0.0);
  }
}

RunResult runOnce(const Invocation& inv, const RunConfig& rc, int* exit_code) {
  std::string limited;
  auto target = openDensityTarget(rc, &limited);
  if (!target.ok()) {
    *exit_code = reportError(inv, target.error());
    return RunResult{};
  }
  std::cout << "bench density (" << rc.workload << ", controller " << (rc.controller ? "on" : "off") << "): up to "
            << rc.count << " idle sandboxes of " << target->image << ", memory limit " << formatBytes(rc.memory)
            << ", node memory " << (rc.node_memory ? formatBytes(rc.node_memory) : std::string("physical")) << "\n";
  MemoryReading memory;
  memory.host_before_mb = hostMemoryMb();
  memory.cache_before = imageResidentBytes(rc.target.root, target->image);
  memory.agent_fds_before = openFdsIfEmbedded(*target);
  Progress progress(std::string("bench density (controller ") + (rc.controller ? "on" : "off") + ")");
  progress.step("create and hold", rc.count);
  Held held = holdSandboxes(*target, rc, progress);
  progress.step("settling, then measuring");
  sleep(2);  // let the page cache and the controller settle before measuring
  readAfter(*target, rc, &memory);
  RunResult res = runResult(rc, held, memory);

  double destroy_start = monotonicSeconds();
  progress.step("destroy", static_cast<int64_t>(held.ids.size()));
  int destroy_failures = destroyAll(target->address, held.ids, rc.concurrency, &progress);
  double destroy_seconds = monotonicSeconds() - destroy_start;
  if (target->node) target->node->stop(true);
  progress.finish(std::to_string(held.held) + " held");
  if (!limited.empty()) ::rmdir(limited.c_str());

  printRun(rc, res, memory);
  std::printf("destroyed %zu in %.2f s (%d failed)\n", held.ids.size(), destroy_seconds, destroy_failures);
  std::printf("stopped by: %s\n", res.stopped_by.c_str());
  if (destroy_failures != 0) *exit_code = kExitFailure;
  return res;
}

void addDensityBenchOptions(po::options_description& desc) {
  desc.add_options()("count", po::value<int>(), "sandboxes to hold at most (plain 1000, python 2000)")(
      "concurrency", po::value<int>(), "client threads creating them (plain 8, python 4)")(
      "memory", po::value<std::string>(), "memory limit of each sandbox (plain 64M, python 128M)")(
      "cpus", po::value<double>(),
      "CPU limit of each sandbox (plain: the node's default; python 0 = no CPU limit, "
      "so memory is what admission counts)")("workload", po::value<std::string>()->default_value("plain"),
                                             "plain (a sleeper) or python (a python3 -i REPL)")(
      "controller", po::value<std::string>()->default_value("on"),
      "on: overcommit under the density controller; off: static limits (ratio 1.0); both: off then on")(
      "node-memory", po::value<std::string>(),
      "memory capacity of the embedded node, also its sandboxes' parent cgroup limit (+512M) (python: 2G)");
}

// The run's settings with the workload's defaults; the python workload's image must be in an embedded node's
// root. *controller: on, off or both.
Result<RunConfig> densityRunConfig(const po::variables_map& vm, const CommonOptions& common, std::string* controller) {
  RunConfig rc;
  rc.workload = vm["workload"].as<std::string>();
  if (rc.workload != "plain" && rc.workload != "python") throw UsageError("--workload wants plain or python");
  bool python = rc.workload == "python";
  *controller = vm["controller"].as<std::string>();
  if (*controller != "on" && *controller != "off" && *controller != "both") {
    throw UsageError("--controller wants on, off or both");
  }
  rc.count = vm.count("count") ? vm["count"].as<int>() : (python ? 2000 : 1000);
  rc.concurrency = vm.count("concurrency") ? vm["concurrency"].as<int>() : (python ? 4 : 8);
  if (rc.count <= 0) throw UsageError("--count must be > 0");
  if (rc.concurrency <= 0 || rc.concurrency > 1024) throw UsageError("--concurrency must be in 1..1024");
  rc.memory =
      parseSizeOption("memory", vm.count("memory") ? vm["memory"].as<std::string>() : (python ? "128M" : "64M"));
  rc.cpus = vm.count("cpus") ? vm["cpus"].as<double>() : (python ? 0.0 : -1.0);
  if (vm.count("node-memory")) {
    rc.node_memory = parseSizeOption("node-memory", vm["node-memory"].as<std::string>());
  } else if (python) {
    rc.node_memory = 2LL << 30;
  }
  rc.target = benchTargetOptions(vm, common);
  rc.target.max_sandboxes = std::max<int64_t>(4096, rc.count + 16);
  if (!python) return rc;
  if (rc.target.image.empty()) rc.target.image = "debian:12+python:3.11";
  if (rc.target.endpoint.empty() && !rc.target.use_fleet) {
    fs3::LayerStore store(rc.target.root);
    DSEC_ASSIGN_OR_RETURN(auto layers, fs3::parseImageRef(rc.target.image));
    if (auto st = store.checkImage(layers); !st.ok()) {
      return st.error().wrap(
          "the python workload needs an image with python3 (default debian:12+python:3.11, as in examples/rollout) "
          "in " +
          rc.target.root + "; build it or pass --image");
    }
  }
  return rc;
}

json densitySummary(const RunConfig& rc, const std::string& controller, const std::vector<RunResult>& runs) {
  json summary;
  const RunResult& last = runs.back();
  summary["workload"] = rc.workload;
  summary["requested"] = rc.count;
  summary["memory_limit_mb"] = static_cast<double>(rc.memory) / kMiB;
  summary["node_memory_mb"] = rc.node_memory ? static_cast<double>(rc.node_memory) / kMiB : 0.0;
  summary["controller"] = controller;
  summary["held"] = last.held;
  summary["host_mb_per_sandbox"] = round3(last.host_mb_per_sandbox);
  summary["seconds"] = std::round(last.seconds * 100) / 100;
  summary["create_p50_first_ms"] = round3(last.create_p50_first_ms);
  summary["create_p50_last_ms"] = round3(last.create_p50_last_ms);
  if (runs.size() == 2) {
    summary["held_static"] = runs[0].held;
    summary["held_controller"] = runs[1].held;
    summary["static"] = json::parse(runs[0].detail);
    summary["on"] = json::parse(runs[1].detail);
  } else {
    json detail = json::parse(last.detail);
    for (const auto& [k, v] : detail.items()) {
      if (!summary.contains(k)) summary[k] = v;
    }
  }
  return summary;
}

}  // namespace

int benchDensity(const Invocation& inv) {
  CommonOptions common;
  po::options_description desc("options");
  addCommonOptions(desc, &common, true);
  addBenchTargetOptions(desc);
  addDensityBenchOptions(desc);
  po::variables_map vm;
  if (!parseCommandLine(inv, inv.args, desc, {},
                        "[--workload plain|python] [--controller on|off|both] [--count N] [--image IMAGE]", &vm,
                        &common)) {
    return kExitOk;
  }
  std::string controller;
  auto config = densityRunConfig(vm, common, &controller);
  if (!config.ok()) return reportError(inv, config.error());
  RunConfig rc = std::move(*config);
  raiseFileLimit();
  int exit_code = kExitOk;
  std::vector<RunResult> runs;
  std::vector<bool> modes =
      controller == "both" ? std::vector<bool>{false, true} : std::vector<bool>{controller == "on"};
  for (bool mode : modes) {
    rc.controller = mode;
    runs.push_back(runOnce(inv, rc, &exit_code));
    if (exit_code != kExitOk && runs.back().held == 0) return exit_code;
  }
  json summary = densitySummary(rc, controller, runs);
  std::fflush(stdout);
  std::cout << summary.dump() << std::endl;
  // Plain: holding all of them is the point. Python: the node stopping admission is the measurement.
  if (rc.workload != "python" && runs.back().held != rc.count) return kExitFailure;
  return exit_code;
}

}  // namespace dsec::cli
