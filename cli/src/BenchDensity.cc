// dsec bench density: holds as many idle sandboxes as asked or as the node admits, and reports the host memory
// each one costs. --workload plain: a sleeping process in each. --workload python: a Python REPL (python3 -i,
// waiting at its prompt) in each, held once with the density controller (--controller on) and once with
// static limits (off: committed memory <= capacity), and measures how the sandboxes share the image's
// layers in the page cache (docs/density.md).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <mutex>

#include "BenchSupport.h"
#include "dsec/common/Directory.h"
#include "dsec/common/Pressure.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/LayerRef.h"
#include "dsec/fs3/LayerStore.h"
#include "dsec/launcher/node/NodeAgent.h"

namespace dsec::cli {
namespace {

constexpr double kMiB = 1 << 20;

double round3(double v) { return std::round(v * 1000) / 1000; }

// Bytes of a file resident in the page cache (mincore over a shared read-only mapping: counts each page once,
// whoever faulted it in).
int64_t residentBytes(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  struct stat st {};
  int64_t resident = 0;
  if (::fstat(fd, &st) == 0 && st.st_size > 0) {
    void* map = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
    if (map != MAP_FAILED) {
      long page = sysconf(_SC_PAGESIZE);
      size_t pages = (static_cast<size_t>(st.st_size) + page - 1) / page;
      std::vector<unsigned char> vec(pages);
      if (::mincore(map, static_cast<size_t>(st.st_size), vec.data()) == 0) {
        for (unsigned char v : vec) resident += (v & 1) ? page : 0;
      }
      ::munmap(map, static_cast<size_t>(st.st_size));
    }
  }
  ::close(fd);
  return resident;
}

int64_t imageResidentBytes(const std::string& root, const std::string& image) {
  auto layers = fs3::parseImageRef(image);
  if (!layers.ok()) return 0;
  int64_t total = 0;
  for (const auto& l : *layers) total += residentBytes(root + "/layers/" + l.name + "/" + l.version + "/layer.erofs");
  return total;
}

// Rss and Pss of every process in the node's sandboxes (their cgroups under the node's parent).
struct ProcessMemory {
  double rss_file = 0, rss_anon = 0, pss_file = 0, pss_anon = 0;  // bytes
  int processes = 0;
};

ProcessMemory sandboxProcessMemory(const std::string& parent) {
  ProcessMemory m;
  PressurePaths paths = resolvePressurePaths(parent);
  auto sandboxes = listDirectory(paths.memory_dir);
  if (!sandboxes.ok()) return m;
  for (const auto& ent : *sandboxes) {
    if (ent.name[0] == '.' || !ent.is_dir) continue;
    auto procs = readFile(paths.memory_dir + "/" + ent.name + "/cgroup.procs");
    if (!procs.ok()) continue;
    for (const auto& pid : split(*procs, '\n')) {
      if (pid.empty()) continue;
      auto rollup = readFile("/proc/" + pid + "/smaps_rollup");
      if (!rollup.ok()) continue;
      std::map<std::string, double> kv;
      for (const auto& line : split(*rollup, '\n')) {
        auto f = split(line, ':');
        if (f.size() != 2) continue;
        kv[f[0]] = std::atof(trim(f[1]).c_str()) * 1024;
      }
      auto status = readFile("/proc/" + pid + "/status");
      if (status.ok()) {
        for (const auto& line : split(*status, '\n')) {
          auto f = split(line, ':');
          if (f.size() == 2 && (f[0] == "RssFile" || f[0] == "RssAnon"))
            kv[f[0]] = std::atof(trim(f[1]).c_str()) * 1024;
        }
      }
      m.rss_file += kv["RssFile"];
      m.rss_anon += kv["RssAnon"];
      m.pss_file += kv["Pss_File"];
      m.pss_anon += kv["Pss_Anon"];
      ++m.processes;
    }
  }
  return m;
}

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
  std::string stopped_by;
  std::string detail = "{}";  // JSON text (a json member would make the implicit moves throwing)
};

// Limits the node's parent cgroup (the bench never needs more than its capacity plus headroom), so a run
// cannot eat the host. Returns the directory to remove afterwards, or "".
std::string limitParent(const std::string& root, int64_t bytes) {
  std::string parent = launcher::cgroupParentForRoot(root);
  PressurePaths paths = resolvePressurePaths(parent);
  if (paths.cgroup_version == 0) return "";
  ::mkdir(paths.memory_dir.c_str(), 0755);
  std::string file = paths.memory_dir + (paths.cgroup_version == 2 ? "/memory.max" : "/memory.limit_in_bytes");
  if (!writeFile(file, std::to_string(bytes)).ok()) return "";
  return paths.memory_dir;
}

RunResult runOnce(const Invocation& inv, const RunConfig& rc, int* exit_code) {
  RunResult res;
  BenchTargetOptions target_options = rc.target;
  target_options.overcommit = rc.controller;
  target_options.memory_capacity_bytes = rc.node_memory;
  // Only the sandboxes under test in the node's cgroup: no warm fncall workers (python processes themselves).
  // CPU QoS does not change memory; the sandboxes ask for no CPU limit.
  target_options.fncall = false;
  target_options.cpu_qos = false;
  std::string limited;
  if (rc.node_memory > 0 && target_options.endpoint.empty() && !target_options.use_fleet) {
    limited = limitParent(target_options.root, rc.node_memory + (512LL << 20));
  }
  auto target = openBenchTarget(target_options);
  if (!target.ok()) {
    *exit_code = reportError(inv, target.error());
    return res;
  }
  std::string parent = launcher::cgroupParentForRoot(target_options.root);
  std::cout << "bench density (" << rc.workload << ", controller " << (rc.controller ? "on" : "off") << "): up to "
            << rc.count << " idle sandboxes of " << target->image << ", memory limit " << formatBytes(rc.memory)
            << ", node memory " << (rc.node_memory ? formatBytes(rc.node_memory) : std::string("physical")) << "\n";
  auto mem_before = hostMemoryUsedMb();
  int64_t cache_before = imageResidentBytes(target_options.root, target->image);

  std::mutex mu;
  std::vector<std::string> ids;
  std::string first_error;
  std::atomic<int> next{0};
  std::atomic<bool> stop{false};
  std::atomic<int> held{0};
  nlohmann::json create_body{{"image", target->image}, {"memory", rc.memory}};
  if (rc.cpus >= 0) create_body["cpus"] = rc.cpus;
  nlohmann::json exec_body;
  if (rc.workload == "python") {
    // python3 -i reads its commands from a FIFO that a sleeper holds open, so the REPL waits at its prompt
    // for good; the exec returns once the prompt is there (the REPL is really up).
    exec_body = {{"cmd",
                  "mkfifo /tmp/repl && (setsid sleep 1000000000 >/tmp/repl 2>/dev/null &) && "
                  "(setsid python3 -i </tmp/repl >/tmp/repl.out 2>&1 &) && "
                  "i=0; while [ $i -lt 300 ]; do grep -q '>>>' /tmp/repl.out 2>/dev/null && exit 0; sleep 0.1; "
                  "i=$((i+1)); done; echo 'python3 -i did not reach its prompt:' >&2; cat /tmp/repl.out >&2; exit 1"},
                 {"timeout", 120}};
  } else {
    // setsid + redirections: the sleeper outlives the exec and holds none of its pipes, so the exec returns.
    exec_body = {{"cmd", "setsid sleep 100000 </dev/null >/dev/null 2>&1 &"}};
  }

  double start = monotonicSeconds();
  runWorkers(target->address, rc.concurrency, [&](ApiClient& client, int) {
    while (!stop.load() && next++ < rc.count) {
      std::string error = createAndExec(client, create_body, exec_body, &mu, &ids);
      if (!error.empty()) {
        stop.store(true);
        std::lock_guard lock(mu);
        if (first_error.empty()) first_error = error;
        continue;
      }
      int now = ++held;
      if (now % 100 == 0) std::printf("  %d held after %.1f s\n", now, monotonicSeconds() - start), std::fflush(stdout);
    }
  });
  res.seconds = monotonicSeconds() - start;
  // Let the page cache and the controller settle before measuring.
  sleep(2);
  auto mem_after = hostMemoryUsedMb();
  int64_t cache_after = imageResidentBytes(target_options.root, target->image);
  ProcessMemory pm = sandboxProcessMemory(parent);
  nlohmann::json node_density;
  {
    ApiClient client(target->address);
    if (auto node = client.call(HttpMethod::kGet, "/v1/node"); node.ok())
      node_density = node->value("density", nlohmann::json());
  }
  res.held = held.load();
  int n = std::max(1, res.held);
  // Host memory per sandbox: what the host lost (MemTotal - MemAvailable, which leaves clean page cache out)
  // plus the image's layer pages that came into the page cache, counted once however many sandboxes map them.
  double cache_delta_mb = static_cast<double>(std::max<int64_t>(0, cache_after - cache_before)) / kMiB;
  if (mem_before.ok() && mem_after.ok() && res.held > 0) {
    res.host_mb_per_sandbox = (*mem_after - *mem_before + cache_delta_mb) / n;
  }
  res.stopped_by = first_error.empty() ? "count reached" : first_error;
  nlohmann::json detail = {{"controller", rc.controller ? "on" : "off"},
                           {"held", res.held},
                           {"host_mb_per_sandbox", round3(res.host_mb_per_sandbox)},
                           {"seconds", std::round(res.seconds * 100) / 100},
                           {"stopped_by", res.stopped_by},
                           {"layer_cache_mb", round3(static_cast<double>(cache_after) / kMiB)},
                           {"rss_file_mb_per_sandbox", round3(pm.rss_file / kMiB / n)},
                           {"pss_file_mb_per_sandbox", round3(pm.pss_file / kMiB / n)},
                           {"rss_anon_mb_per_sandbox", round3(pm.rss_anon / kMiB / n)},
                           {"processes", pm.processes}};
  if (pm.pss_file > 0) detail["file_sharing_factor"] = std::round(pm.rss_file / pm.pss_file * 10) / 10;
  if (node_density.is_object()) {
    detail["memory_ratio"] = node_density.value("memory_ratio", 0.0);
    detail["level"] = node_density.value("level", "");
    detail["paused"] = node_density.value("paused_sandboxes", 0);
    detail["actions_total"] = node_density.value("actions_total", nlohmann::json::object());
  }
  res.detail = detail.dump();

  double destroy_start = monotonicSeconds();
  int destroy_failures = destroyAll(target->address, ids, rc.concurrency);
  double destroy_seconds = monotonicSeconds() - destroy_start;
  if (target->node) target->node->stop(true);
  if (!limited.empty()) ::rmdir(limited.c_str());

  std::printf(
      "held %d of %d sandboxes (started in %.2f s); host memory %.0f -> %.0f MB (+%.1f MB layer cache) = "
      "%.3f MB per sandbox\n",
      res.held, rc.count, res.seconds, mem_before.ok() ? *mem_before : 0.0, mem_after.ok() ? *mem_after : 0.0,
      cache_delta_mb, res.host_mb_per_sandbox);
  if (pm.processes > 0) {
    std::printf(
        "page cache: the image's layers hold %.1f MB resident, counted once; each sandbox maps %.2f MB of "
        "file pages (RssFile) but its proportional share is %.2f MB (Pss_File): %.0fx shared\n",
        static_cast<double>(cache_after) / kMiB, pm.rss_file / kMiB / n, pm.pss_file / kMiB / n,
        pm.pss_file > 0 ? pm.rss_file / pm.pss_file : 0.0);
  }
  std::printf("destroyed %zu in %.2f s (%d failed)\n", ids.size(), destroy_seconds, destroy_failures);
  std::printf("stopped by: %s\n", res.stopped_by.c_str());
  if (destroy_failures != 0) *exit_code = kExitFailure;
  return res;
}

}  // namespace

int benchDensity(const Invocation& inv) {
  CommonOptions common;
  po::options_description desc("options");
  addCommonOptions(desc, &common, true);
  addBenchTargetOptions(desc);
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
  po::variables_map vm;
  if (!parseCommandLine(inv, inv.args, desc, {},
                        "[--workload plain|python] [--controller on|off|both] [--count N] [--image IMAGE]", &vm,
                        &common)) {
    return kExitOk;
  }
  RunConfig rc;
  rc.workload = vm["workload"].as<std::string>();
  if (rc.workload != "plain" && rc.workload != "python") throw UsageError("--workload wants plain or python");
  bool python = rc.workload == "python";
  std::string controller = vm["controller"].as<std::string>();
  if (controller != "on" && controller != "off" && controller != "both") {
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
  raiseFileLimit();
  rc.target = benchTargetOptions(vm, common);
  rc.target.max_sandboxes = std::max<int64_t>(4096, rc.count + 16);
  if (python) {
    if (rc.target.image.empty()) rc.target.image = "debian:12+python:3.11";
    if (rc.target.endpoint.empty() && !rc.target.use_fleet) {
      fs3::LayerStore store(rc.target.root);
      auto layers = fs3::parseImageRef(rc.target.image);
      if (!layers.ok()) return reportError(inv, layers.error());
      if (auto st = store.checkImage(*layers); !st.ok()) {
        return reportError(inv, st.error().wrap("the python workload needs an image with python3 (default "
                                                "debian:12+python:3.11, as in examples/rollout) in " +
                                                rc.target.root + "; build it or pass --image"));
      }
    }
  }

  int exit_code = kExitOk;
  std::vector<RunResult> runs;
  std::vector<bool> modes;
  if (controller == "both") {
    modes = {false, true};
  } else {
    modes = {controller == "on"};
  }
  for (bool mode : modes) {
    rc.controller = mode;
    runs.push_back(runOnce(inv, rc, &exit_code));
    if (exit_code != kExitOk && runs.back().held == 0) return exit_code;
  }
  nlohmann::json summary;
  const RunResult& last = runs.back();
  summary["workload"] = rc.workload;
  summary["requested"] = rc.count;
  summary["memory_limit_mb"] = static_cast<double>(rc.memory) / kMiB;
  summary["node_memory_mb"] = rc.node_memory ? static_cast<double>(rc.node_memory) / kMiB : 0.0;
  summary["controller"] = controller;
  summary["held"] = last.held;
  summary["host_mb_per_sandbox"] = round3(last.host_mb_per_sandbox);
  summary["seconds"] = std::round(last.seconds * 100) / 100;
  if (runs.size() == 2) {
    summary["held_static"] = runs[0].held;
    summary["held_controller"] = runs[1].held;
    summary["static"] = nlohmann::json::parse(runs[0].detail);
    summary["on"] = nlohmann::json::parse(runs[1].detail);
  } else {
    nlohmann::json detail = nlohmann::json::parse(last.detail);
    for (const auto& [k, v] : detail.items()) {
      if (!summary.contains(k)) summary[k] = v;
    }
  }
  std::fflush(stdout);
  std::cout << summary.dump() << std::endl;
  // Plain: holding all of them is the point. Python: the node stopping admission is the measurement.
  if (!python && last.held != rc.count) return kExitFailure;
  return exit_code;
}

}  // namespace dsec::cli
