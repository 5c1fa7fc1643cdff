// dsec-bench-create-loop: the container backend's create -> exec /bin/true -> destroy, timed per iteration in
// one process (as the node agent does it), over a plain rootfs directory as the only lower layer. Prints one
// line per iteration (milliseconds), then a JSON summary line. Used by bench/create-vs-peers.
#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <exception>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dsec/backends/container/ContainerBackend.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"

namespace po = boost::program_options;
using namespace dsec;

namespace {

double percentile(std::vector<double> samples, double p) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  auto rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(samples.size())));
  return samples[std::clamp<size_t>(rank, 1, samples.size()) - 1];
}

struct Timing {
  double total_ms = 0;
  double create_ms = 0;
  double exec_ms = 0;
  double destroy_ms = 0;
};

// One sandbox lifetime, timed as a whole and per phase.
Result<Timing> oneIteration(backends::Backend& backend, const backends::SandboxSpec& base) {
  backends::SandboxSpec spec = base;
  spec.id = "bench-" + randomHex(12);
  double start = monotonicSeconds();
  DSEC_ASSIGN_OR_RETURN(auto sandbox, backend.create(spec));
  double created = monotonicSeconds();
  backends::ExecRequest request;
  request.argv = {"/bin/true"};
  auto ran = sandbox->exec(request);
  double executed = monotonicSeconds();
  Status destroyed = sandbox->destroy();
  double end = monotonicSeconds();
  if (!ran.ok()) return ran.error().wrap("exec /bin/true");
  if (ran->exit_code != 0) return Error::internal("/bin/true exited with " + std::to_string(ran->exit_code));
  DSEC_TRY(destroyed);
  return Timing{(end - start) * 1000, (created - start) * 1000, (executed - created) * 1000, (end - executed) * 1000};
}

int run(int argc, char** argv) {
  std::string lower;
  std::string init;
  std::string network;
  int iterations = 200;
  int warmup = 5;
  bool quiet = false;
  po::options_description desc("usage: dsec-bench-create-loop --lower ROOTFS [options]");
  desc.add_options()("help,h", "print this help")("lower", po::value<std::string>(&lower)->required(),
                                                  "rootfs directory used as the (only) lower layer")(
      "iterations", po::value<int>(&iterations)->default_value(200), "timed iterations")(
      "warmup", po::value<int>(&warmup)->default_value(5), "untimed iterations first")(
      "network", po::value<std::string>(&network)->default_value("none"),
      "none (loopback only) or egress (veth and NAT)")("init", po::value<std::string>(&init),
                                                       "path of dsec-sandbox-init (default: next to this binary)")(
      "quiet", po::bool_switch(&quiet), "only the JSON summary");
  try {
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("help") != 0) {
      std::cout << desc << "\n";
      return 0;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "dsec-bench-create-loop: " << e.what() << "\n";
    return 2;
  }
  if (network != "none" && network != "egress") {
    std::cerr << "dsec-bench-create-loop: --network must be none or egress\n";
    return 2;
  }
  setLogLevel(LogLevel::kWarn);

  backends::ContainerBackendOptions options;
  options.init_path = init;
  auto backend = backends::makeContainerBackend(options);
  if (!backend.ok()) {
    std::cerr << "dsec-bench-create-loop: " << backend.error().message() << "\n";
    return 1;
  }
  backends::SandboxSpec spec;
  spec.image = "bench-rootfs";
  spec.lower_dirs = {lower};
  spec.memory_bytes = 512LL << 20;
  spec.cpus = 1;
  spec.pids = 1024;
  spec.disk_bytes = 1LL << 30;
  spec.network = network == "egress" ? backends::NetworkMode::kEgress : backends::NetworkMode::kNone;
  spec.env = {{"PATH", "/usr/sbin:/usr/bin:/sbin:/bin"}};

  std::vector<double> samples, creates, execs, destroys;
  for (int i = 0; i < warmup + iterations; ++i) {
    auto t = oneIteration(**backend, spec);
    if (!t.ok()) {
      std::cerr << "dsec-bench-create-loop: iteration " << i << ": " << t.error().message() << "\n";
      return 1;
    }
    if (i < warmup) continue;
    samples.push_back(t->total_ms);
    creates.push_back(t->create_ms);
    execs.push_back(t->exec_ms);
    destroys.push_back(t->destroy_ms);
    if (!quiet) std::printf("%.4f\n", t->total_ms);
  }
  nlohmann::json summary{{"iterations", iterations},
                         {"p50_ms", percentile(samples, 50)},
                         {"p99_ms", percentile(samples, 99)},
                         {"min_ms", percentile(samples, 0)},
                         {"create_p50_ms", percentile(creates, 50)},
                         {"exec_p50_ms", percentile(execs, 50)},
                         {"destroy_p50_ms", percentile(destroys, 50)}};
  std::cout << summary.dump() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Report anything thrown (bad_alloc, a JSON error) as a failed run instead of an abort.
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "dsec-bench-create-loop: " << e.what() << "\n";
    return 1;
  }
}
