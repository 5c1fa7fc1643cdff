// Shared by `dsec bench create` and `dsec bench density`: the fleet under test (an embedded node started here,
// or a running one), the benchmark image, host memory, percentiles and a pool of client threads.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ApiClient.h"
#include "Cli.h"
#include "dsec/launcher/api/Serve.h"

namespace dsec::cli {

class Progress;

struct BenchTargetOptions {
  std::string root;
  std::string endpoint;  // use this running fleet (token from DSEC_TOKEN or --token)
  std::string token;
  bool use_fleet = false;  // use the fleet named by common.fleet
  std::string fleet;
  std::string image;  // empty: bench-busybox:1, built in root if missing
  int64_t max_sandboxes = 4096;
  bool overcommit = true;             // embedded node: the density controller (false: static limits)
  int64_t memory_capacity_bytes = 0;  // embedded node: memory admission counts against (0: physical)
  bool fncall = true;                 // embedded node: warm fncall workers (false: none)
  bool cpu_qos = true;                // embedded node: CPU QoS
};

struct BenchTarget {
  std::unique_ptr<launcher::EmbeddedNode> node;  // null when benchmarking a running fleet
  FleetAddress address;
  std::string image;
};

// An embedded node a bench starts on root: 127.0.0.1 on a free port, fleet "bench", no fleet file.
launcher::ServeOptions benchServeOptions(const std::string& root, const std::string& node_name = "bench");

void addBenchTargetOptions(po::options_description& desc);
BenchTargetOptions benchTargetOptions(const po::variables_map& vm, const CommonOptions& common);
Result<BenchTarget> openBenchTarget(const BenchTargetOptions& options);

// Host memory in use: MemTotal - MemAvailable from /proc/meminfo, in MiB.
Result<double> hostMemoryUsedMb();
// "0.52 0.61 0.70" from /proc/loadavg ("?" if unreadable), and its first figure (0 if unreadable).
std::string loadAverages();
double loadAverage1m();
// p in [0, 100], nearest-rank on a sorted copy; 0 for no samples.
double percentile(std::vector<double> samples, double p);
// Raises RLIMIT_NOFILE to its hard limit (an in-process node holds several fds per sandbox).
void raiseFileLimit();

// Runs work(client, worker) on `threads` threads, each with its own keep-alive connection.
void runWorkers(const FleetAddress& address, int threads, const std::function<void(ApiClient&, int)>& work);

// One benchmark step: POST /v1/sandboxes with create_body, then exec_body in the new sandbox. The id goes into
// *ids under *mu at once, so the sandbox is destroyed later even if the exec fails. *created_at (if set) gets the
// time the create answered. With retry_when_full a create refused because the node is full (429) is tried again
// after a short pause for up to 60 s, as a client honouring Retry-After does. Returns "" or what failed
// ("create: ..." / "exec: ...").
std::string createAndExec(ApiClient& client, const nlohmann::json& create_body, const nlohmann::json& exec_body,
                          std::mutex* mu, std::vector<std::string>* ids, double* created_at = nullptr,
                          bool retry_when_full = false);

// Destroys the sandboxes with `threads` clients; returns how many failed. progress (optional) counts each.
int destroyAll(const FleetAddress& address, const std::vector<std::string>& ids, int threads,
               Progress* progress = nullptr);

}  // namespace dsec::cli
