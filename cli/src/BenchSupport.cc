#include "BenchSupport.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "LayerBuild.h"
#include "Progress.h"
#include "dsec/common/Pressure.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/LayerStore.h"

namespace dsec::cli {

void addBenchTargetOptions(po::options_description& desc) {
  desc.add_options()("image", po::value<std::string>(),
                     "image to use (default: bench-busybox:1, built if missing; fncall: debian:12+python:3.11)")(
      "endpoint", po::value<std::string>(), "benchmark this running fleet instead of an embedded node")(
      "token", po::value<std::string>(), "with --endpoint: the bearer token (default $DSEC_TOKEN)");
}

BenchTargetOptions benchTargetOptions(const po::variables_map& vm, const CommonOptions& common) {
  BenchTargetOptions options;
  options.root = common.root;
  options.fleet = common.fleet;
  options.use_fleet = common.fleet_given;
  if (vm.count("image") != 0) options.image = vm["image"].as<std::string>();
  if (vm.count("endpoint") != 0) options.endpoint = vm["endpoint"].as<std::string>();
  if (vm.count("token") != 0) {
    options.token = vm["token"].as<std::string>();
  } else if (const char* token = std::getenv("DSEC_TOKEN"); token != nullptr) {
    options.token = token;
  }
  return options;
}

launcher::ServeOptions benchServeOptions(const std::string& root, const std::string& node_name) {
  launcher::ServeOptions serve;
  serve.node.root = root;
  serve.http.listen = "127.0.0.1:0";
  serve.node.fleet_name = "bench";
  serve.node.node_name = node_name;
  serve.write_fleet_file = false;
  return serve;
}

Result<BenchTarget> openBenchTarget(const BenchTargetOptions& options) {
  BenchTarget target;
  target.image = options.image;
  if (target.image.empty()) {
    // The image must be in the store of the node under test; for a running fleet that is this host's --root.
    fs3::LayerStore store(options.root);
    DSEC_ASSIGN_OR_RETURN(auto ref, fs3::parseLayerRef("bench-busybox:1"));
    DSEC_ASSIGN_OR_RETURN(auto manifest, ensureBusyboxLayer(store, ref));
    target.image = manifest.ref.toString();
  }
  if (!options.endpoint.empty()) {
    target.address = FleetAddress{options.endpoint, options.token};
    return target;
  }
  if (options.use_fleet) {
    DSEC_ASSIGN_OR_RETURN(target.address, resolveFleet(options.fleet, true));
    return target;
  }
  launcher::ServeOptions serve = benchServeOptions(options.root);
  serve.node.max_sandboxes = options.max_sandboxes;
  serve.node.density.overcommit = options.overcommit;
  serve.node.memory_capacity_bytes = options.memory_capacity_bytes;
  if (!options.fncall) serve.node.fncall.max_workers = 0;
  serve.node.cpu_qos = options.cpu_qos;
  DSEC_ASSIGN_OR_RETURN(target.node, launcher::EmbeddedNode::start(serve));
  target.address = FleetAddress{target.node->endpoint(), target.node->token()};
  return target;
}

Result<double> hostMemoryUsedMb() {
  DSEC_ASSIGN_OR_RETURN(MemInfo info, readMemInfo());
  return static_cast<double>(info.used_bytes()) / (1024.0 * 1024.0);
}

std::string loadAverages() {
  auto text = readFile("/proc/loadavg");
  if (!text.ok()) return "?";
  auto parts = split(trim(*text), ' ');
  return parts.size() >= 3 ? parts[0] + " " + parts[1] + " " + parts[2] : "?";
}

double loadAverage1m() { return std::atof(loadAverages().c_str()); }

double percentile(std::vector<double> samples, double p) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  auto rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(samples.size())));
  rank = std::clamp<size_t>(rank, 1, samples.size());
  return samples[rank - 1];
}

void raiseFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

void runWorkers(const FleetAddress& address, int threads, const std::function<void(ApiClient&, int)>& work) {
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      ApiClient client(address);
      work(client, t);
    });
  }
  for (auto& thread : pool) thread.join();
}

int destroyAll(const FleetAddress& address, const std::vector<std::string>& ids, int threads, Progress* progress) {
  std::atomic<size_t> next{0};
  std::atomic<int> failures{0};
  runWorkers(address, threads, [&](ApiClient& client, int) {
    for (size_t i = next++; i < ids.size(); i = next++) {
      if (!client.call(HttpMethod::kDelete, "/v1/sandboxes/" + percentEncode(ids[i])).ok()) ++failures;
      if (progress != nullptr) progress->advance();
    }
  });
  return failures.load();
}

std::string createAndExec(ApiClient& client, const nlohmann::json& create_body, const nlohmann::json& exec_body,
                          std::mutex* mu, std::vector<std::string>* ids, double* created_at, bool retry_when_full) {
  auto info = client.call(HttpMethod::kPost, "/v1/sandboxes", create_body);
  const double give_up = monotonicSeconds() + 60;
  while (retry_when_full && !info.ok() && info.error().code() == ErrorCode::kResourceExhausted &&
         monotonicSeconds() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    info = client.call(HttpMethod::kPost, "/v1/sandboxes", create_body);
  }
  if (created_at != nullptr) *created_at = monotonicSeconds();
  if (!info.ok()) return "create: " + info.error().message();
  std::string id = info->value("id", "");
  {
    std::lock_guard lock(*mu);
    ids->push_back(id);
  }
  auto ran = client.call(HttpMethod::kPost, "/v1/sandboxes/" + percentEncode(id) + "/exec", exec_body);
  if (!ran.ok()) return "exec: " + ran.error().message();
  if (ran->value("exit_code", -1) != 0) {
    return "exec: exited with " + std::to_string(ran->value("exit_code", -1)) + ": " + ran->value("stderr", "");
  }
  return "";
}

}  // namespace dsec::cli
