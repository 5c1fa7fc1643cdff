// dsec-bench-create-loop: the container backend's create -> exec /bin/true -> destroy, timed per iteration in
// one process (as the node agent does it), over a plain rootfs directory as the only lower layer. Prints one
// line per iteration (milliseconds), then a JSON summary line. Used by bench/create-vs-peers.
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dsec/backends/container/ContainerBackend.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"

namespace po = boost::program_options;
using namespace dsec;

namespace {

// What an egress policy costs a connect, as an A/B in one run: two processes join the same sandbox's network
// namespace and time connect() to the sandbox's own address (allowed by its policy; nothing listens, so the kernel
// refuses it at once and the connect is all local work). One of them is in the cgroup2 directory the agent's
// programs are attached to (on a v1 host: unified/<parent>/agent-<our pid>-*), so its connects take the policy's
// whole allow path; the other is not, so its connects see no program at all. Also the programs' own cost per call
// by the kernel's accounting (kernel.bpf_stats_enabled).
struct ProgramStats {
  uint64_t runs = 0;
  uint64_t ns = 0;
};

ProgramStats egressProgramStats() {
  ProgramStats total;
  uint32_t id = 0;
  while (bpf_prog_get_next_id(id, &id) == 0) {
    int fd = bpf_prog_get_fd_by_id(id);
    if (fd < 0) continue;
    bpf_prog_info info{};
    uint32_t len = sizeof info;
    if (bpf_obj_get_info_by_fd(fd, &info, &len) == 0 && std::string(info.name).rfind("dsec_connect", 0) == 0) {
      total.runs += info.run_cnt;
      total.ns += info.run_time_ns;
    }
    close(fd);
  }
  return total;
}

// The p50 of n connect()s to ip4:9 in the network namespace netns_fd, from a child process that first joins the
// cgroup2 directory cgroup_dir ("" = stays where it is); microseconds.
Result<double> connectP50InChild(int netns_fd, const std::string& cgroup_dir, uint32_t ip4, int n) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return Error::sys(errno, "pipe");
  pid_t child = fork();
  if (child < 0) return Error::sys(errno, "fork");
  if (child == 0) {
    close(pipe_fds[0]);
    double p50 = -1;
    if ((cgroup_dir.empty() || writeFile(cgroup_dir + "/cgroup.procs", std::to_string(getpid())).ok()) &&
        setns(netns_fd, CLONE_NEWNET) == 0) {
      std::vector<double> samples;
      sockaddr_in to{};
      to.sin_family = AF_INET;
      to.sin_port = htons(9);
      to.sin_addr.s_addr = htonl(ip4);
      for (int i = 0; i < n; ++i) {
        int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        double start = monotonicSeconds();
        (void)connect(s, reinterpret_cast<sockaddr*>(&to), sizeof to);
        samples.push_back((monotonicSeconds() - start) * 1e6);
        close(s);
      }
      std::sort(samples.begin(), samples.end());
      p50 = samples[samples.size() / 2];
    }
    (void)!write(pipe_fds[1], &p50, sizeof p50);
    _exit(0);
  }
  close(pipe_fds[1]);
  double p50 = -1;
  ssize_t got = read(pipe_fds[0], &p50, sizeof p50);
  close(pipe_fds[0]);
  int status = 0;
  waitpid(child, &status, 0);
  if (got != sizeof p50 || p50 < 0) return Error::internal("the connect probe's child could not join the sandbox");
  return p50;
}

Result<nlohmann::json> probeConnects(backends::Backend& backend, const backends::SandboxSpec& base, int connects) {
  backends::SandboxSpec spec = base;
  spec.id = "bench-" + randomHex(12);
  // Its own address is allowed (the links' subnet): every connect takes the policy's whole allow path.
  DSEC_ASSIGN_OR_RETURN(backends::EgressRule own, backends::parseEgressRule("100.64.0.0/10"));
  spec.egress.rules.push_back(own);
  DSEC_ASSIGN_OR_RETURN(auto sandbox, backend.create(spec));
  const pid_t init = sandbox->persistentState().at("init_pid").get<pid_t>();
  backends::ExecRequest request;
  request.argv = {"/bin/sh", "-c", "ip -4 addr show eth0 | sed -n 's/.*inet \\([0-9.]*\\).*/\\1/p'"};
  auto address = sandbox->exec(request);
  std::string agent_dir;
  for (const auto& entry : std::filesystem::directory_iterator("/sys/fs/cgroup/unified/dsec")) {
    if (entry.path().filename().string().rfind("agent-" + std::to_string(getpid()) + "-", 0) == 0) {
      agent_dir = entry.path().string();
    }
  }
  UniqueFd netns(::open(("/proc/" + std::to_string(init) + "/ns/net").c_str(), O_RDONLY | O_CLOEXEC));
  in_addr ip{};
  if (!address.ok() || inet_pton(AF_INET, trim(address->stdout_data).c_str(), &ip) != 1 || !netns ||
      agent_dir.empty()) {
    (void)sandbox->destroy();
    return Error::internal("connect probe: no address, namespace or agent directory (a v1 host is needed)");
  }
  const char* stats_file = "/proc/sys/kernel/bpf_stats_enabled";
  auto was = readFile(stats_file);
  (void)writeFile(stats_file, "1");
  std::vector<double> with, without;
  ProgramStats before = egressProgramStats();
  for (int round = 0; round < 5; ++round) {  // interleaved, so machine noise hits both alike
    auto a = connectP50InChild(netns.get(), agent_dir, ntohl(ip.s_addr), connects);
    auto b = connectP50InChild(netns.get(), "", ntohl(ip.s_addr), connects);
    if (!a.ok() || !b.ok()) break;
    with.push_back(*a);
    without.push_back(*b);
  }
  ProgramStats after = egressProgramStats();
  if (was.ok()) (void)writeFile(stats_file, trim(*was));
  (void)sandbox->destroy();
  if (with.size() != 5) return Error::internal("connect probe failed");
  std::sort(with.begin(), with.end());
  std::sort(without.begin(), without.end());
  const uint64_t runs = after.runs - before.runs;
  return nlohmann::json{
      {"connects", connects * 5},
      {"connect_with_policy_us", with[2]},
      {"connect_without_programs_us", without[2]},
      {"with_over_without", with[2] / without[2]},
      {"program_runs", runs},
      {"policy_check_ns", runs == 0 ? 0.0 : static_cast<double>(after.ns - before.ns) / static_cast<double>(runs)}};
}

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
  int connect_probe = 0;
  po::options_description desc("usage: dsec-bench-create-loop --lower ROOTFS [options]");
  desc.add_options()("help,h", "print this help")("lower", po::value<std::string>(&lower)->required(),
                                                  "rootfs directory used as the (only) lower layer")(
      "iterations", po::value<int>(&iterations)->default_value(200), "timed iterations")(
      "warmup", po::value<int>(&warmup)->default_value(5), "untimed iterations first")(
      "network", po::value<std::string>(&network)->default_value("none"),
      "none (loopback only), egress (veth and NAT, anywhere but the node) or policy (veth, NAT and an egress policy "
      "of 16 rules)")("init", po::value<std::string>(&init),
                      "path of dsec-sandbox-init (default: next to this binary)")("quiet", po::bool_switch(&quiet),
                                                                                  "only the JSON summary")(
      "connect-probe", po::value<int>(&connect_probe)->default_value(0),
      "with --network policy: N connects in one sandbox, reporting the egress programs' cost per check");
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
  if (network != "none" && network != "egress" && network != "policy") {
    std::cerr << "dsec-bench-create-loop: --network must be none, egress or policy\n";
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
  spec.network = network == "none" ? backends::NetworkMode::kNone : backends::NetworkMode::kEgress;
  if (network != "none") {
    // "egress": the route anywhere but the node; "policy": what a rollout's setup stage might list.
    std::vector<std::string> rules = {"0.0.0.0/0"};
    if (network == "policy") {
      rules = {"deb.debian.org:80", "pypi.org:443", "files.pythonhosted.org:443", "*.githubusercontent.com:443"};
      for (int i = 0; i < 12; ++i) rules.push_back("10." + std::to_string(i) + ".0.0/16:443");
    }
    auto policy = backends::parseEgressPolicy(rules);
    if (!policy.ok()) {
      std::cerr << "dsec-bench-create-loop: " << policy.error().message() << "\n";
      return 1;
    }
    spec.egress = *policy;
  }
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
  if (connect_probe > 0 && network != "none") {
    auto probe = probeConnects(**backend, spec, connect_probe);
    if (!probe.ok()) {
      std::cerr << "dsec-bench-create-loop: " << probe.error().message() << "\n";
      return 1;
    }
    summary["connect_probe"] = *probe;
  }
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
