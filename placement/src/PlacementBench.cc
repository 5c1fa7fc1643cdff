// A simulated cell: every node is a real NodePlacer (admission and cores), the fleet is a real ClusterPlacer.
#include "dsec/placement/PlacementBench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <utility>

#include "dsec/common/Strings.h"
#include "dsec/placement/NodePlacer.h"

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#define DSEC_HAVE_RDTSC 1
#endif

namespace dsec::placement {

namespace {

constexpr int64_t kGiB = 1LL << 30;

// Per-decision timing: a clock read costs ~60-100 ns in this VM, more than a decision, so use the TSC
// (a few ns) calibrated against the steady clock where there is one.
class Ticks {
 public:
  Ticks() {
#ifdef DSEC_HAVE_RDTSC
    auto t0 = std::chrono::steady_clock::now();
    uint64_t c0 = __rdtsc();
    while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(20)) {
    }
    uint64_t c1 = __rdtsc();
    double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    ns_per_tick_ = ns / static_cast<double>(c1 - c0);
#endif
  }
  static uint64_t now() {
#ifdef DSEC_HAVE_RDTSC
    return __rdtsc();
#else
    return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
#endif
  }
  double toNs(uint64_t ticks) const { return static_cast<double>(ticks) * ns_per_tick_; }

 private:
  double ns_per_tick_ = 1.0;
};

struct Sandbox {
  double cpus;
  int64_t memory;
  Qos qos;
};

double percentile(std::vector<uint32_t>& samples, double p) {
  if (samples.empty()) return 0;
  auto rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(samples.size())));
  rank = std::clamp<size_t>(rank, 1, samples.size()) - 1;
  std::nth_element(samples.begin(), samples.begin() + static_cast<std::ptrdiff_t>(rank), samples.end());
  return samples[rank];
}

double maxOverMean(const std::vector<double>& values) {
  if (values.empty()) return 0;
  double sum = 0;
  double max = 0;
  for (double v : values) {
    sum += v;
    max = std::max(max, v);
  }
  double mean = sum / static_cast<double>(values.size());
  return mean > 0 ? max / mean : 0;
}

std::unique_ptr<ClusterPlacer> makeCell(const PlacementBenchOptions& options, Strategy strategy,
                                        const NodeSummary& node, double cpu_ratio, double memory_ratio) {
  ClusterPlacerOptions cell;
  cell.k = options.k;
  cell.seed = options.seed;
  cell.strategy = strategy;
  auto placer = std::make_unique<ClusterPlacer>(cell);
  // Every simulated node admits by the bench's ratios (its NodePlacer does the same), as it would report them.
  NodeAdmission admission;
  admission.cpu_ratio = cpu_ratio;
  admission.memory_ratio = memory_ratio;
  admission.cpus = node.pus;
  admission.memory_capacity_bytes = node.memory_bytes;
  for (int i = 0; i < options.nodes; ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "node-%03d", i);
    NodeInfo info;
    info.name = name;
    info.capacity = node;
    info.backends = {"container", "microvm"};
    info.admission = admission;
    placer->addNode(info);
  }
  return placer;
}

// Pass 1, the rate: decisions and confirms alone, no timers in the loop (what a gateway thread sustains).
double decisionRate(const PlacementBenchOptions& options, Strategy strategy, const NodeSummary& node,
                    const std::vector<Sandbox>& sandboxes, double cpu_ratio, double memory_ratio) {
  auto cell_ptr = makeCell(options, strategy, node, cpu_ratio, memory_ratio);
  ClusterPlacer& cell = *cell_ptr;
  auto start = std::chrono::steady_clock::now();
  int64_t decisions = 0;
  for (const auto& sb : sandboxes) {
    auto ticket = cell.place({sb.cpus, sb.memory, "container"});
    ++decisions;
    if (ticket.ok()) cell.confirm(*ticket, true);
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(decisions) / seconds;
}

// Spread of what the nodes themselves committed, against physical capacity.
void recordSpread(const std::vector<std::unique_ptr<NodePlacer>>& nodes, const NodeSummary& node,
                  StrategyResult& result) {
  std::vector<double> util, cpu, mem;
  for (const auto& placer : nodes) {
    NodeUsage u = placer->usage();
    double c = u.committed_cpus / node.pus;
    double m =
        node.memory_bytes > 0 ? static_cast<double>(u.committed_memory) / static_cast<double>(node.memory_bytes) : 0;
    cpu.push_back(c);
    mem.push_back(m);
    util.push_back(std::max(c, m));
  }
  result.max_over_mean = maxOverMean(util);
  result.cpu_max_over_mean = maxOverMean(cpu);
  result.memory_max_over_mean = maxOverMean(mem);
  double sum = 0;
  for (double u : util) sum += u;
  result.mean_utilisation = util.empty() ? 0 : sum / static_cast<double>(util.size());
}

StrategyResult runStrategy(const PlacementBenchOptions& options, Strategy strategy, const NodeModel& model,
                           const std::vector<Sandbox>& sandboxes, double cpu_ratio, double memory_ratio,
                           const Ticks& ticks) {
  StrategyResult result;
  result.strategy = strategyName(strategy);
  const NodeSummary node = model.summary();
  result.decisions_per_second = decisionRate(options, strategy, node, sandboxes, cpu_ratio, memory_ratio);

  // Pass 2, the simulation: each decision timed, each node admitting through its own NodePlacer, rejects
  // placed again elsewhere.
  auto cell_ptr = makeCell(options, strategy, node, cpu_ratio, memory_ratio);
  ClusterPlacer& cell = *cell_ptr;
  NodePlacerOptions node_options;
  node_options.cpu_overcommit = cpu_ratio;
  node_options.memory_overcommit = memory_ratio;
  node_options.min_shared_cores = std::max(1, node.cores / 4);
  std::vector<std::unique_ptr<NodePlacer>> nodes;
  for (int i = 0; i < options.nodes; ++i) nodes.push_back(std::make_unique<NodePlacer>(model, node_options));

  std::vector<uint32_t> decision_ns;
  decision_ns.reserve(sandboxes.size() + sandboxes.size() / 8);
  std::vector<NodeId> exclude;
  auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < sandboxes.size(); ++i) {
    const Sandbox& sb = sandboxes[i];
    exclude.clear();
    while (true) {
      uint64_t t0 = Ticks::now();
      auto ticket = cell.place({sb.cpus, sb.memory, "container"}, exclude);
      uint64_t t1 = Ticks::now();
      decision_ns.push_back(static_cast<uint32_t>(std::min(ticks.toNs(t1 - t0), 4e9)));
      if (!ticket.ok()) {
        ++result.rejected;
        break;
      }
      SandboxRequest request;
      request.id = "sb-" + std::to_string(i);
      request.qos = sb.qos;
      request.cpus = sb.cpus;
      request.memory_bytes = sb.memory;
      bool admitted = nodes[ticket->node]->place(request).ok();
      cell.confirm(*ticket, admitted);
      if (admitted) {
        ++result.placed;
        break;
      }
      ++result.node_rejects;
      exclude.push_back(ticket->node);
    }
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.end_to_end_per_second = static_cast<double>(sandboxes.size()) / seconds;
  result.p50_decision_ns = percentile(decision_ns, 50);
  result.p99_decision_ns = percentile(decision_ns, 99);
  recordSpread(nodes, node, result);
  return result;
}

nlohmann::json toJson(const StrategyResult& r) {
  return {{"decisions_per_second", std::round(r.decisions_per_second)},
          {"end_to_end_per_second", std::round(r.end_to_end_per_second)},
          {"max_over_mean", std::round(r.max_over_mean * 10000) / 10000},
          {"rejected", r.rejected},
          {"node_rejects", r.node_rejects},
          {"p50_decision_ns", r.p50_decision_ns},
          {"p99_decision_ns", r.p99_decision_ns}};
}

void printRow(std::ostream& out, const StrategyResult& r) {
  out << "  " << std::left << std::setw(17) << r.strategy << std::right << std::fixed << std::setprecision(0)
      << std::setw(12) << r.decisions_per_second << std::setw(12) << r.end_to_end_per_second << std::setw(9)
      << r.p50_decision_ns << std::setw(9) << r.p99_decision_ns << std::setprecision(4) << std::setw(10)
      << r.max_over_mean << std::setw(9) << r.cpu_max_over_mean << std::setw(9) << r.memory_max_over_mean
      << std::setw(9) << r.rejected << std::setw(8) << r.node_rejects << "\n";
}

// What the cell offers and what the sandboxes ask of it in all.
struct CellDemand {
  double cell_pus = 0, cell_memory = 0;
  double requested_cpus = 0, requested_memory = 0;
};

// The mean CPUs and memory of one sandbox of the mix; its shares must add up to 1.
Result<std::pair<double, double>> mixMeans(const std::vector<SandboxSize>& mix) {
  double share_sum = 0, mean_cpus = 0, mean_memory = 0;
  for (const auto& size : mix) {
    share_sum += size.share;
    mean_cpus += size.share * size.cpus;
    mean_memory += size.share * static_cast<double>(size.memory_bytes);
  }
  if (std::abs(share_sum - 1.0) > 1e-6) return Error::invalid("sandbox mix shares must add up to 1");
  return std::pair{mean_cpus, mean_memory};
}

void printPremise(std::ostream& out, const PlacementBenchOptions& options, const NodeModel& model,
                  const std::vector<SandboxSize>& mix, double mean_cpus, const CellDemand& demand,
                  const PlacementBenchResult& result) {
  const NodeSummary& node = result.node;
  out << "cell: " << options.nodes << " nodes of " << model.source() << "\n"
      << "  per node: " << node.packages << " packages, " << node.numa_domains << " NUMA, " << node.l3_groups
      << " L3 groups, " << node.cores << " cores, " << node.pus << " PUs, " << formatBytes(node.memory_bytes) << "\n"
      << "  cell: " << static_cast<int64_t>(demand.cell_pus) << " PUs, "
      << formatBytes(static_cast<int64_t>(demand.cell_memory)) << "\n";
  out << "mix:";
  for (const auto& size : mix)
    out << " " << size.share * 100 << "% " << size.cpus << " CPU/" << formatBytes(size.memory_bytes);
  out << "; " << options.latency_fraction * 100 << "% latency QoS (dedicated cores)\n";
  out << std::fixed << std::setprecision(2);
  out << "overcommit: " << options.sandboxes << " sandboxes x " << mean_cpus
      << " CPUs = " << static_cast<int64_t>(demand.requested_cpus) << " CPUs requested / "
      << static_cast<int64_t>(demand.cell_pus) << " PUs = " << demand.requested_cpus / demand.cell_pus << "x; memory "
      << formatBytes(static_cast<int64_t>(demand.requested_memory)) << " / "
      << formatBytes(static_cast<int64_t>(demand.cell_memory)) << " = " << demand.requested_memory / demand.cell_memory
      << "x\n"
      << "  ratios used (+" << options.headroom * 100 << "% headroom, rounded up to 0.5): CPU " << result.cpu_overcommit
      << "x, memory " << result.memory_overcommit << "x"
      << "\n  (DSec: ~90% of sandboxes use <=5% of the CPU they ask for; if they use u% on average the cell is "
      << "u% x " << result.cpu_overcommit << " busy: 2% -> " << std::setprecision(0) << result.cpu_overcommit * 2
      << "%, 4% -> " << result.cpu_overcommit * 4
      << "%; the density controller lowers the ratio when that is too much)\n";
}

// One sequence of sandboxes for every strategy, so they are compared on the same input.
std::vector<Sandbox> drawSandboxes(const PlacementBenchOptions& options, const std::vector<SandboxSize>& mix) {
  std::mt19937_64 rng(options.seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<Sandbox> sandboxes;
  sandboxes.reserve(static_cast<size_t>(options.sandboxes));
  for (int64_t i = 0; i < options.sandboxes; ++i) {
    double u = uniform(rng);
    const SandboxSize* pick = &mix.back();
    for (const auto& size : mix) {
      if (u < size.share) {
        pick = &size;
        break;
      }
      u -= size.share;
    }
    Qos qos = uniform(rng) < options.latency_fraction ? Qos::kLatency : Qos::kBatch;
    sandboxes.push_back({pick->cpus, pick->memory_bytes, qos});
  }
  return sandboxes;
}

void printResults(std::ostream& out, const PlacementBenchResult& result) {
  out << "results (decisions/s: place+confirm alone; e2e/s: with node admission; ns per decision; spread = max/mean"
         " node utilisation):\n"
      << "  strategy           decisions/s       e2e/s      p50      p99    spread   cpu      mem      rejected"
         " node-rej\n";
  printRow(out, result.ours);
  for (const auto& b : result.baselines) printRow(out, b);
  out << "  mean node utilisation (committed / physical, larger of CPU and memory): " << std::setprecision(2)
      << result.ours.mean_utilisation << "\n";
  out.unsetf(std::ios::floatfield);
}

std::string resultJson(const PlacementBenchOptions& options, const PlacementBenchResult& result) {
  nlohmann::json json = toJson(result.ours);
  json["strategy"] = "power-of-k";
  json["k"] = options.k;
  json["nodes"] = options.nodes;
  json["sandboxes"] = options.sandboxes;
  json["placed"] = result.ours.placed;
  json["cpu_overcommit"] = result.cpu_overcommit;
  json["memory_overcommit"] = result.memory_overcommit;
  json["mean_utilisation"] = std::round(result.ours.mean_utilisation * 10000) / 10000;
  nlohmann::json baselines = nlohmann::json::object();
  for (const auto& b : result.baselines)
    baselines[b.strategy == "least-loaded" ? "least_loaded" : b.strategy] = toJson(b);
  json["baselines"] = baselines;
  return json.dump();
}

}  // namespace

std::vector<SandboxSize> defaultSandboxMix() {
  return {{0.70, 1, 2 * kGiB}, {0.20, 2, 4 * kGiB}, {0.08, 4, 8 * kGiB}, {0.02, 8, 16 * kGiB}};
}

Result<PlacementBenchResult> runPlacementBench(const PlacementBenchOptions& options, std::ostream& out) {
  if (options.nodes <= 0 || options.sandboxes < 0 || options.k < 1) {
    return Error::invalid("--nodes and --k must be >= 1 and --sandboxes >= 0");
  }
  std::vector<SandboxSize> mix = options.mix.empty() ? defaultSandboxMix() : options.mix;
  DSEC_ASSIGN_OR_RETURN(auto means, mixMeans(mix));
  const auto [mean_cpus, mean_memory] = means;
  DSEC_ASSIGN_OR_RETURN(NodeModel model, NodeModel::fromSpec(options.topology));
  PlacementBenchResult result;
  result.node = model.summary();
  const NodeSummary& node = result.node;
  if (node.memory_bytes <= 0) {
    return Error::invalid("topology '" + options.topology + "' gives no memory size (use [numa(memory=...)])");
  }

  // The overcommit premise, derived: a full cell must hold every sandbox's request, so the ratio is at least
  // requested / physical, and the placer needs some headroom because no placement is perfectly even.
  CellDemand demand;
  demand.cell_pus = static_cast<double>(options.nodes) * node.pus;
  demand.cell_memory = static_cast<double>(options.nodes) * static_cast<double>(node.memory_bytes);
  demand.requested_cpus = static_cast<double>(options.sandboxes) * mean_cpus;
  demand.requested_memory = static_cast<double>(options.sandboxes) * mean_memory;
  auto roundUpHalf = [](double x) { return std::max(1.0, std::ceil(x * 2.0) / 2.0); };
  result.cpu_overcommit = options.cpu_overcommit > 0
                              ? options.cpu_overcommit
                              : roundUpHalf(demand.requested_cpus / demand.cell_pus * (1 + options.headroom));
  result.memory_overcommit = options.memory_overcommit > 0
                                 ? options.memory_overcommit
                                 : roundUpHalf(demand.requested_memory / demand.cell_memory * (1 + options.headroom));
  printPremise(out, options, model, mix, mean_cpus, demand, result);

  const std::vector<Sandbox> sandboxes = drawSandboxes(options, mix);
  Ticks ticks;
  result.ours = runStrategy(options, Strategy::kPowerOfK, model, sandboxes, result.cpu_overcommit,
                            result.memory_overcommit, ticks);
  result.ours.strategy += " (k=" + std::to_string(options.k) + ")";
  if (options.compare) {
    for (Strategy s : {Strategy::kRandom, Strategy::kLeastLoaded}) {
      result.baselines.push_back(
          runStrategy(options, s, model, sandboxes, result.cpu_overcommit, result.memory_overcommit, ticks));
    }
  }
  printResults(out, result);
  result.json = resultJson(options, result);
  return result;
}

}  // namespace dsec::placement
