// dsec bench fncall: C client threads, each with its own keep-alive connection, send `print(sum(range(1000)))`
// to POST /v1/call (count calls after a warm-up that lets the pools grow). In the same run, the baseline is
// what SandboxFusion does for each call: create a fresh container sandbox, exec a fresh `python3 -c CODE` in
// it, destroy it. The last line is one JSON object with the figures.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <mutex>

#include "BenchSupport.h"
#include "Progress.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/LayerStore.h"
#include "dsec/launcher/node/NodeFncall.h"

namespace dsec::cli {
namespace {

struct Phase {
  std::vector<double> latencies_ms;
  int failures = 0;
  std::string first_error;
  double wall = 0;

  double perSecond() const { return wall > 0 ? static_cast<double>(latencies_ms.size()) / wall : 0.0; }
  void fail(const std::string& error) {
    ++failures;
    if (first_error.empty()) first_error = error;
  }
};

double round3(double v) { return std::round(v * 1000) / 1000; }

struct FncallBenchConfig {
  std::string language;
  int count = 0;
  int concurrency = 0;
  int warmup = 0;
  int baseline_count = 0;
  std::string code;  // what every call and every baseline run executes; it prints kExpected
};

constexpr const char* kExpected = "499500\n";

void addFncallBenchOptions(po::options_description& desc) {
  desc.add_options()("language", po::value<std::string>()->default_value("python"), "python | bash")(
      "count", po::value<int>()->default_value(2000), "calls to measure")(
      "concurrency", po::value<int>()->default_value(8), "client threads, one keep-alive connection each")(
      "warmup", po::value<int>()->default_value(-1), "unmeasured calls first (default: max(50, 4 x concurrency))")(
      "baseline-count", po::value<int>()->default_value(-1),
      "fresh-sandbox runs for the baseline (default: min(count, 200); 0 skips it)");
}

FncallBenchConfig fncallBenchConfig(const po::variables_map& vm) {
  FncallBenchConfig c;
  c.count = vm["count"].as<int>();
  c.concurrency = vm["concurrency"].as<int>();
  c.language = vm["language"].as<std::string>();
  if (c.count <= 0) throw UsageError("--count must be > 0");
  if (c.concurrency <= 0 || c.concurrency > 1024) throw UsageError("--concurrency must be in 1..1024");
  if (c.language != "python" && c.language != "bash") throw UsageError("--language must be python or bash");
  c.warmup = vm["warmup"].as<int>() >= 0 ? vm["warmup"].as<int>() : std::max(50, 4 * c.concurrency);
  c.baseline_count = vm["baseline-count"].as<int>() >= 0 ? vm["baseline-count"].as<int>() : std::min(c.count, 200);
  c.code = c.language == "python" ? "print(sum(range(1000)))" : "echo $(( 999 * 1000 / 2 ))";
  return c;
}

std::string interpreter(const FncallBenchConfig& c) { return c.language == "python" ? "python3" : "bash"; }

// An embedded node runs the image from --root: it must be there, with python3 and bash.
Status checkEmbeddedImage(const std::string& root, const std::string& image) {
  fs3::LayerStore store(root);
  DSEC_ASSIGN_OR_RETURN(auto layers, fs3::parseImageRef(image));
  if (auto st = store.checkImage(layers); !st.ok()) {
    return Error::invalid(st.error().message() + " (the bench needs an image with python3 and bash in --root " + root +
                          ": examples/rollout.py builds " + launcher::kDefaultFncallImage +
                          "; or `dsec layer build NAME:VER --from-dir DIR` and --image NAME:VER)");
  }
  return okStatus();
}

// n calls of POST /v1/call over the configured concurrency.
Phase runCalls(const BenchTarget& target, const FncallBenchConfig& c, int n, Progress& progress) {
  Phase phase;
  nlohmann::json call_body{{"code", c.code}, {"language", c.language}, {"image", target.image}};
  std::mutex mu;
  std::atomic<int> next{0};
  double start = monotonicSeconds();
  runWorkers(target.address, c.concurrency, [&](ApiClient& client, int) {
    std::vector<double> mine;
    while (next++ < n) {
      double t0 = monotonicSeconds();
      auto r = client.call(HttpMethod::kPost, "/v1/call", call_body);
      double ms = (monotonicSeconds() - t0) * 1000.0;
      progress.advance();
      std::string error;
      if (!r.ok()) {
        error = r.error().message();
      } else if (r->value("exit_code", -1) != 0 || r->value("stdout", "") != kExpected) {
        error = "unexpected result " + r->dump().substr(0, 300);
      }
      if (!error.empty()) {
        std::lock_guard lock(mu);
        phase.fail(error);
        continue;
      }
      mine.push_back(ms);
    }
    std::lock_guard lock(mu);
    phase.latencies_ms.insert(phase.latencies_ms.end(), mine.begin(), mine.end());
  });
  phase.wall = monotonicSeconds() - start;
  return phase;
}

// What SandboxFusion does per call: a fresh sandbox, a fresh interpreter in it, the sandbox destroyed.
Phase runBaseline(const BenchTarget& target, const FncallBenchConfig& c, Progress& progress) {
  Phase baseline;
  std::mutex mu;
  std::atomic<int> next{0};
  // Batch QoS like the fncall workers (a plain shared-pool sandbox, as SandboxFusion's would be).
  nlohmann::json create_body{{"image", target.image}, {"memory", "256M"}, {"qos", "batch"}};
  nlohmann::json exec_body{{"cmd", nlohmann::json::array({interpreter(c), "-c", c.code})}, {"timeout", 10}};
  double start = monotonicSeconds();
  runWorkers(target.address, c.concurrency, [&](ApiClient& client, int) {
    while (next++ < c.baseline_count) {
      double t0 = monotonicSeconds();
      std::vector<std::string> mine;
      // A full node (the baseline's own sandboxes commit CPUs) is waited for, not counted as a failure.
      std::string error = createAndExec(client, create_body, exec_body, &mu, &mine, nullptr, true);
      for (const auto& id : mine) {
        if (!client.call(HttpMethod::kDelete, "/v1/sandboxes/" + percentEncode(id)).ok() && error.empty()) {
          error = "destroy " + id + " failed";
        }
      }
      double ms = (monotonicSeconds() - t0) * 1000.0;
      progress.advance();
      std::lock_guard lock(mu);
      if (!error.empty()) {
        baseline.fail(error);
      } else {
        baseline.latencies_ms.push_back(ms);
      }
    }
  });
  baseline.wall = monotonicSeconds() - start;
  return baseline;
}

// The node's fncall counters (GET /v1/node "fncall") as JSON text; "" if it has none.
std::string fncallStats(const BenchTarget& target) {
  ApiClient client(target.address);
  if (auto node = client.call(HttpMethod::kGet, "/v1/node"); node.ok() && node->contains("fncall")) {
    return (*node)["fncall"].dump();
  }
  return "";
}

struct FncallBenchRun {
  Phase warm, measured, baseline;
  double load_before = 0, load_after = 0;
  std::string fncall_stats;
};

void printReport(const FncallBenchConfig& c, const FncallBenchRun& run) {
  const Phase& measured = run.measured;
  const Phase& baseline = run.baseline;
  double per_second = static_cast<double>(measured.latencies_ms.size()) / measured.wall;
  double baseline_per_second = baseline.perSecond();
  std::printf("warm-up: %d calls in %.3f s, %d failures\n", c.warmup, run.warm.wall, run.warm.failures);
  std::printf("fncall: %zu calls in %.3f s (%.1f/s), %d failures; p50 %.2f ms  p90 %.2f ms  p99 %.2f ms  max %.2f ms\n",
              measured.latencies_ms.size(), measured.wall, per_second, measured.failures,
              percentile(measured.latencies_ms, 50), percentile(measured.latencies_ms, 90),
              percentile(measured.latencies_ms, 99), percentile(measured.latencies_ms, 100));
  std::printf(
      "baseline (fresh sandbox + fresh %s each): %zu in %.3f s (%.1f/s), %d failures; p50 %.2f ms  p99 %.2f ms\n",
      interpreter(c).c_str(), baseline.latencies_ms.size(), baseline.wall, baseline_per_second, baseline.failures,
      percentile(baseline.latencies_ms, 50), percentile(baseline.latencies_ms, 99));
  std::printf("load average: %.2f before the measured phase, %.2f at the end\n", run.load_before, run.load_after);
  if (!run.fncall_stats.empty()) std::printf("fncall stats: %s\n", run.fncall_stats.c_str());
  for (const Phase* p : {&run.warm, &measured, &baseline}) {
    if (!p->first_error.empty()) std::printf("first failure: %s\n", p->first_error.c_str());
  }
  nlohmann::json summary{
      {"language", c.language},
      {"count", c.count},
      {"concurrency", c.concurrency},
      {"p50_ms", round3(percentile(measured.latencies_ms, 50))},
      {"p99_ms", round3(percentile(measured.latencies_ms, 99))},
      {"per_second", std::round(per_second * 10) / 10},
      {"baseline_per_second", std::round(baseline_per_second * 10) / 10},
      {"ratio", baseline_per_second > 0 ? std::round(per_second / baseline_per_second * 100) / 100 : 0.0},
      {"baseline_count", c.baseline_count},
      {"load_avg_1m", run.load_after},
      {"failures", measured.failures + baseline.failures}};
  std::fflush(stdout);
  std::cout << summary.dump() << std::endl;
}

}  // namespace

int benchFncall(const Invocation& inv) {
  CommonOptions common;
  po::options_description desc("options");
  addCommonOptions(desc, &common, true);
  addBenchTargetOptions(desc);
  addFncallBenchOptions(desc);
  po::variables_map vm;
  if (!parseCommandLine(inv, inv.args, desc, {}, "--language python --count N --concurrency C [--image IMAGE]", &vm,
                        &common)) {
    return kExitOk;
  }
  const FncallBenchConfig c = fncallBenchConfig(vm);
  raiseFileLimit();

  BenchTargetOptions target_options = benchTargetOptions(vm, common);
  if (target_options.image.empty()) target_options.image = launcher::kDefaultFncallImage;
  if (target_options.endpoint.empty() && !target_options.use_fleet) {
    if (auto st = checkEmbeddedImage(common.root, target_options.image); !st.ok()) return reportError(inv, st.error());
  }
  target_options.max_sandboxes = std::max<int64_t>(4096, c.baseline_count + 16);
  auto target = openBenchTarget(target_options);
  if (!target.ok()) return reportError(inv, target.error());
  std::cout << "bench fncall: " << c.count << " " << c.language << " calls on " << target->image << " at concurrency "
            << c.concurrency << " against " << target->address.endpoint << "\n";

  FncallBenchRun run;
  Progress progress("bench fncall");
  progress.step("warm-up calls", c.warmup);
  run.warm = runCalls(*target, c, c.warmup, progress);
  run.load_before = loadAverage1m();
  progress.step("measured calls", c.count);
  run.measured = runCalls(*target, c, c.count, progress);
  if (c.baseline_count > 0) {
    progress.step("baseline: a sandbox per call", c.baseline_count);
    run.baseline = runBaseline(*target, c, progress);
  }
  run.load_after = loadAverage1m();
  run.fncall_stats = fncallStats(*target);
  if (target->node) target->node->stop(true);
  progress.finish();
  printReport(c, run);
  return run.measured.failures == 0 && run.baseline.failures == 0 ? kExitOk : kExitFailure;
}

}  // namespace dsec::cli
