#include "dsec/launcher/api/NodeOptionTable.h"

#include <sys/stat.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>

#include "dsec/backends/NetworkPolicy.h"
#include "dsec/common/Endpoint.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/LayerRef.h"
#include "dsec/launcher/api/Credentials.h"

namespace dsec::launcher {
namespace po = boost::program_options;

namespace {

std::string onOff(bool on) { return on ? "on" : "off"; }

// 65536 -> "64K": the default of a size flag as a user would type it.
std::string sizeText(int64_t bytes) {
  const char* suffixes[] = {"", "K", "M", "G", "T"};
  int i = 0;
  while (i < 4 && bytes != 0 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++i;
  }
  return std::to_string(bytes) + suffixes[i];
}

Status flagError(const std::string& flag, const std::string& what) { return Error::invalid("--" + flag + " " + what); }

Result<bool> onOffFlag(const po::variables_map& vm, const std::string& flag) {
  std::string v = vm[flag].as<std::string>();
  if (v != "on" && v != "off") return Error::invalid("--" + flag + " wants on or off, not '" + v + "'");
  return v == "on";
}

Result<int64_t> sizeFlag(const po::variables_map& vm, const std::string& flag) {
  auto bytes = parseByteSize(vm[flag].as<std::string>());
  if (!bytes.ok()) return Error::invalid("--" + flag + ": " + bytes.error().message());
  return *bytes;
}

bool positive(double x) { return std::isfinite(x) && x > 0; }
bool nonNegative(double x) { return std::isfinite(x) && x >= 0; }

Status checkRatios(const std::string& what, double lo, double start, double hi) {
  if (!positive(lo)) return flagError(what + "-ratio-min", "must be > 0");
  if (!positive(start)) return flagError(what + "-ratio-start", "must be > 0");
  if (!positive(hi)) return flagError(what + "-ratio-max", "must be > 0");
  if (lo > hi) return flagError(what + "-ratio-min", "must be <= --" + what + "-ratio-max");
  if (start < lo || start > hi) {
    return flagError(what + "-ratio-start", "must lie between --" + what + "-ratio-min and --" + what + "-ratio-max");
  }
  return okStatus();
}

Status checkListen(const std::string& listen) {
  if (auto address = parseListenAddress(listen); !address.ok()) {
    return Error::invalid("--listen: " + address.error().message());
  }
  return okStatus();
}

Status checkNode(const NodeOptions& n) {
  if (n.root.empty()) return flagError("root", "must not be empty");
  for (const auto& block : n.egress_never) {
    auto rule = backends::parseEgressRule(block);
    if (!rule.ok() || rule->isDomain() || rule->port != 0) {
      return flagError("egress-never", "\"" + block + "\" is not an IPv4 address block (A.B.C.D or A.B.C.D/LEN)");
    }
  }
  if (auto st = validateFleetName(n.fleet_name); !st.ok())
    return Error::invalid("--fleet-name: " + st.error().message());
  if (n.node_name.empty() || n.node_name.size() > 32 ||
      n.node_name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") != std::string::npos ||
      n.node_name[0] == '-') {
    return flagError("node-name", "'" + n.node_name + "': use 1-32 of [a-z0-9-], not starting with '-'");
  }
  if (n.max_sandboxes <= 0) return flagError("max-sandboxes", "must be > 0");
  if (!positive(n.reaper_interval_seconds)) return flagError("reaper-interval", "must be > 0 seconds");
  if (!(n.snapshot_retention_seconds >= 0)) return flagError("snapshot-retention", "must be >= 0 seconds");
  if (fs3::isHttpStore(n.store_dir)) {
    if (auto url = parseEndpoint(n.store_dir); !url.ok()) return flagError("store", url.error().message());
    if (n.chunk_cache_bytes < (16ll << 20)) return flagError("chunk-cache", "must be at least 16M");
  } else if (!n.store_dir.empty()) {
    struct stat st {};
    if (::stat(n.store_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return flagError("store", n.store_dir + ": not a directory this node can read (the cluster's shared store)");
    }
    if (n.chunk_cache_bytes < (16ll << 20)) return flagError("chunk-cache", "must be at least 16M");
  }
  if (n.cgroup_parent.find("..") != std::string::npos || (!n.cgroup_parent.empty() && n.cgroup_parent[0] == '/')) {
    return flagError("cgroup-parent", "must be a relative cgroup path without '..'");
  }
  if (n.fncall.image.empty()) return flagError("fncall-image", "must not be empty");
  if (n.fncall.max_workers < 0) return flagError("fncall-workers", "must be >= 0");
  if (!nonNegative(n.fncall.queue_wait_seconds)) return flagError("fncall-queue-wait", "must be >= 0 seconds");
  const placement::DensityConfig& d = n.density;
  DSEC_TRY(checkRatios("memory", d.memory_ratio_min, d.memory_ratio_start, d.memory_ratio_max));
  DSEC_TRY(checkRatios("cpu", d.cpu_ratio_min, d.cpu_ratio_start, d.cpu_ratio_max));
  if (n.memory_capacity_bytes < 0) return flagError("memory-capacity", "must be >= 0");
  if (n.vm.accel != "auto" && n.vm.accel != "kvm" && n.vm.accel != "tcg") {
    return flagError("vm-accel", "must be auto, kvm or tcg");
  }
  if (n.vm.default_memory_bytes < (128ll << 20)) return flagError("vm-memory", "must be at least 128M");
  if (!positive(n.density_interval_seconds)) return flagError("density-interval", "must be > 0 seconds");
  return okStatus();
}

Status checkHttp(const HttpServerOptions& h, uint64_t output_budget) {
  DSEC_TRY(checkListen(h.listen));
  if (h.max_connections <= 0) return flagError("max-connections", "must be > 0");
  if (h.max_client_connections < 0) return flagError("max-client-connections", "must be >= 0 (0: the default)");
  if (!positive(h.header_timeout_seconds)) return flagError("header-timeout", "must be > 0 seconds");
  if (!positive(h.body_timeout_seconds)) return flagError("body-timeout", "must be > 0 seconds");
  if (!positive(h.body_min_rate)) return flagError("body-min-rate", "must be > 0 bytes/s");
  if (!nonNegative(h.client_queue_seconds)) return flagError("client-queue-wait", "must be >= 0 seconds");
  if (h.idle_timeout_ms <= 0) return flagError("idle-timeout", "must be > 0 seconds");
  if (output_budget != 0 && output_budget < kMinOutputBudget) return flagError("output-budget", "must be at least 1M");
  return okStatus();
}

}  // namespace

std::string defaultNodeRoot() {
  const char* env = std::getenv("DSEC_ROOT");
  return env != nullptr && *env != '\0' ? env : "/var/lib/dsec";
}

NodeOptionTable::NodeOptionTable(ServeOptions* options, NodeTableParts parts) : options_(options), parts_(parts) {
  if (parts_.root && options_->node.root.empty()) options_->node.root = defaultNodeRoot();
  // Inside a Slurm job the job owns the sandboxes, and its epilog destroys them (JobOwnership.h).
  if (const char* store = std::getenv("DSEC_STORE"); store != nullptr && options_->node.store_dir.empty()) {
    options_->node.store_dir = store;
  }
  if (const char* job = std::getenv("SLURM_JOB_ID"); job != nullptr && options_->node.slurm_job.empty()) {
    options_->node.slurm_job = job;
  }
}

void NodeOptionTable::addTo(po::options_description& desc) {
  NodeOptions& n = options_->node;
  HttpServerOptions& h = options_->http;
  placement::DensityConfig& d = n.density;
  auto add = desc.add_options();
  if (parts_.root)
    add("root", po::value<std::string>(&n.root)->default_value(n.root),
        "dsec root: layer store, state, token (env DSEC_ROOT)");
  if (parts_.listen)
    add("listen", po::value<std::string>(&h.listen)->default_value(h.listen),
        "ADDR:PORT to serve the API on (port 0 picks a free one)");
  add("fleet-name", po::value<std::string>(&n.fleet_name)->default_value(n.fleet_name),
      "fleet name: the fleet file ~/.dsec/fleets/NAME.json");
  if (parts_.node_name)
    add("node-name", po::value<std::string>(&n.node_name)->default_value(n.node_name),
        "node name (prefix of sandbox ids; 1-32 of [a-z0-9-])");
  add("max-sandboxes", po::value<int64_t>(&n.max_sandboxes)->default_value(n.max_sandboxes),
      "admission limit of this node; more get 429 capacity");
  add("reaper-interval", po::value<double>(&n.reaper_interval_seconds)->default_value(n.reaper_interval_seconds),
      "seconds between the reaper's timeout and lease checks");
  add("snapshot-dir", po::value<std::string>(&n.snapshot_dir)->default_value(n.snapshot_dir),
      "where snapshots are kept (default: <root>/snapshots; dsec-launch: the fleet's shared <fleet root>/snapshots)");
  add("snapshot-retention",
      po::value<double>(&n.snapshot_retention_seconds)->default_value(n.snapshot_retention_seconds),
      "seconds after which the reaper deletes a snapshot (0: kept until deleted)");
  add("store", po::value<std::string>(&n.store_dir)->default_value(n.store_dir),
      "the cluster's shared layer store, a directory or http://HOST:PORT of `dsec layer serve`: layers this node "
      "lacks are mounted from it on demand (env DSEC_STORE)");
  add("chunk-cache", po::value<std::string>()->default_value(sizeText(n.chunk_cache_bytes)),
      "with --store: bytes of the node's chunk cache (<root>/chunk-cache)");
  add("cgroup-parent", po::value<std::string>(&n.cgroup_parent)->default_value(n.cgroup_parent),
      "parent cgroup of the sandboxes (default: dsec, or dsec-<hash of root> for another root)");
  add("simulate", po::bool_switch(&n.simulate)->default_value(n.simulate),
      "simulated node: admits sandboxes without starting them (no processes; exec and files get 501)");
  add("fncall-image", po::value<std::string>(&n.fncall.image)->default_value(n.fncall.image),
      "default image of POST /v1/call (examples/rollout.py builds debian:12+python:3.11)");
  add("fncall-workers", po::value<int>(&n.fncall.max_workers)->default_value(n.fncall.max_workers),
      "warm fncall workers at most (0 disables fncall)");
  add("fncall-queue-wait", po::value<double>(&n.fncall.queue_wait_seconds)->default_value(n.fncall.queue_wait_seconds),
      "seconds a call waits for a free worker before 429 capacity");
  add("overcommit", po::value<std::string>()->default_value(onOff(d.overcommit)),
      "on: overcommit under the density controller; off: static limits (ratio 1.0, no actions)");
  add("memory-ratio-start", po::value<double>(&d.memory_ratio_start)->default_value(d.memory_ratio_start),
      "density: the memory overcommit ratio a node starts with");
  add("memory-ratio-min", po::value<double>(&d.memory_ratio_min)->default_value(d.memory_ratio_min),
      "density: the lowest memory overcommit ratio");
  add("memory-ratio-max", po::value<double>(&d.memory_ratio_max)->default_value(d.memory_ratio_max),
      "density: the highest memory overcommit ratio");
  add("cpu-ratio-start", po::value<double>(&d.cpu_ratio_start)->default_value(d.cpu_ratio_start),
      "density: the CPU ratio a node starts with (the sandboxes' CPU use may reach ratio x CPUs)");
  add("cpu-ratio-min", po::value<double>(&d.cpu_ratio_min)->default_value(d.cpu_ratio_min),
      "density: the lowest CPU ratio (under CPU pressure)");
  add("cpu-ratio-max", po::value<double>(&d.cpu_ratio_max)->default_value(d.cpu_ratio_max),
      "density: the highest CPU ratio");
  add("memory-capacity", po::value<std::string>(), "memory admission counts against (default: physical memory)");
  add("density-interval", po::value<double>(&n.density_interval_seconds)->default_value(n.density_interval_seconds),
      "seconds between the density controller's ticks");
  add("cpu-qos", po::value<std::string>()->default_value(onOff(n.cpu_qos)),
      "on: latency sandboxes get dedicated cores, batch ones SCHED_IDLE on the rest; off: every sandbox plain");
  add("cpu-exclusive-pool", po::value<std::string>()->default_value(onOff(n.cpu_exclusive_pool)),
      "on: batch sandboxes leave the cores dedicated to latency ones; off: they share them");
  add("user-namespaces", po::value<std::string>()->default_value(onOff(n.user_namespaces)),
      "on: every sandbox's root is an unprivileged host id range of its own; off: an explicit opt-out for kernels "
      "without user namespaces or idmapped mounts (sandbox root is then host root; logged, shown in /v1/node)");
  add("vm", po::value<std::string>()->default_value(onOff(n.vm.enabled)),
      "on: microvm and vm sandboxes where QEMU and the guest kernel are here; off: containers only");
  add("vm-kernel-dir", po::value<std::string>(&n.vm.kernel_dir)->default_value(n.vm.kernel_dir),
      "the guest kernel's directory (vmlinux, modules; default: the one tests/install-deps.sh fetched)");
  add("vm-accel", po::value<std::string>(&n.vm.accel)->default_value(n.vm.accel),
      "auto: KVM where it runs the guest kernel, else TCG (noted in /v1/node); kvm; tcg");
  add("vm-memory", po::value<std::string>()->default_value(sizeText(n.vm.default_memory_bytes)),
      "guest RAM of a microvm/vm create that gives no memory limit");
  add("egress-never", po::value<std::vector<std::string>>(&n.egress_never)->composing(),
      "an IPv4 block (A.B.C.D[/LEN]) no sandbox reaches whatever its egress policy, besides the node itself and "
      "link-local addresses (repeatable): the Slurm controller, other nodes; dsec-launch adds the fleet's gateways");
  add("max-connections", po::value<int>(&h.max_connections)->default_value(h.max_connections),
      "HTTP connections (one thread each) in all; more get 503");
  add("max-client-connections", po::value<int>(&h.max_client_connections)->default_value(h.max_client_connections),
      "connections one client (a local user, or a remote address) may hold before they carry the token; more wait up "
      "to --client-queue-wait, then get 429 (0: min(64, max-connections / 2))");
  add("client-queue-wait", po::value<double>(&h.client_queue_seconds)->default_value(h.client_queue_seconds),
      "seconds a client's connection over its budget waits for a slot before 429");
  add("header-timeout", po::value<double>(&h.header_timeout_seconds)->default_value(h.header_timeout_seconds),
      "seconds a request head (request line and headers) may take to arrive; later: 408 and closed");
  add("body-timeout", po::value<double>(&h.body_timeout_seconds)->default_value(h.body_timeout_seconds),
      "seconds a request body may take on top of what --body-min-rate allows for its size");
  add("body-min-rate", po::value<std::string>()->default_value(sizeText(static_cast<int64_t>(h.body_min_rate))),
      "bytes per second a request body must average after --body-timeout (slower: 408 and closed)");
  add("idle-timeout", po::value<double>()->default_value(h.idle_timeout_ms / 1000.0),
      "seconds a keep-alive connection may stay idle, and a read or write may stall");
  add("output-budget", po::value<std::string>(),
      "buffered exec and call output the node holds at once; over it: 429 (default: memory / 16, 64M..1G)");
  add("run-code-listen", po::value<std::string>(&options_->run_code_listen)->default_value(options_->run_code_listen),
      "ADDR:PORT of a second listener, WITHOUT authentication, serving only POST /run_code (bind it to a private "
      "address; docs/security.md)");
  if (parts_.listen) {  // `dsec serve`; a fleet's E2B listener is its gateway's
    add("e2b-listen", po::value<std::string>(&options_->e2b.listen)->default_value(options_->e2b.listen),
        "ADDR:PORT of an E2B-compatible listener: E2B's SDKs with E2B_API_URL and E2B_SANDBOX_URL set to it and "
        "E2B_API_KEY the node's token (docs/e2b.md)");
    add("e2b-template", po::value<std::vector<std::string>>()->composing(),
        "NAME=IMAGE: the dsec image an E2B template id creates (repeatable)");
    add("e2b-default-image", po::value<std::string>(&options_->e2b.default_image)->default_value(""),
        "the image of E2B's default template 'base' and of templates --e2b-template does not name");
  }
  add("run-code-cpp-image",
      po::value<std::string>(&options_->run_code.cpp_image)->default_value(options_->run_code.cpp_image),
      "the image POST /run_code compiles and runs cpp in (it needs g++)");
}

Status NodeOptionTable::apply(const po::variables_map& vm) {
  NodeOptions& n = options_->node;
  HttpServerOptions& h = options_->http;
  DSEC_ASSIGN_OR_RETURN(n.density.overcommit, onOffFlag(vm, "overcommit"));
  DSEC_ASSIGN_OR_RETURN(n.cpu_qos, onOffFlag(vm, "cpu-qos"));
  DSEC_ASSIGN_OR_RETURN(n.cpu_exclusive_pool, onOffFlag(vm, "cpu-exclusive-pool"));
  DSEC_ASSIGN_OR_RETURN(n.user_namespaces, onOffFlag(vm, "user-namespaces"));
  DSEC_ASSIGN_OR_RETURN(n.vm.enabled, onOffFlag(vm, "vm"));
  DSEC_ASSIGN_OR_RETURN(n.vm.default_memory_bytes, sizeFlag(vm, "vm-memory"));
  DSEC_ASSIGN_OR_RETURN(n.chunk_cache_bytes, sizeFlag(vm, "chunk-cache"));
  if (vm.count("memory-capacity") != 0) {
    DSEC_ASSIGN_OR_RETURN(n.memory_capacity_bytes, sizeFlag(vm, "memory-capacity"));
  }
  DSEC_ASSIGN_OR_RETURN(int64_t rate, sizeFlag(vm, "body-min-rate"));
  h.body_min_rate = static_cast<double>(rate);
  double idle = vm["idle-timeout"].as<double>();
  if (!positive(idle) || idle * 1000 > INT_MAX) return flagError("idle-timeout", "must be > 0 and < 2000000 seconds");
  h.idle_timeout_ms = static_cast<int>(std::lround(std::max(1.0, idle * 1000)));
  if (vm.count("e2b-template") != 0) {
    for (const auto& spec : vm["e2b-template"].as<std::vector<std::string>>()) {
      if (Status st = addE2bTemplate(options_->e2b, spec); !st.ok())
        return flagError("e2b-template", st.error().message());
    }
  }
  if (vm.count("output-budget") != 0) {
    DSEC_ASSIGN_OR_RETURN(int64_t budget, sizeFlag(vm, "output-budget"));
    options_->output_budget_bytes = static_cast<uint64_t>(budget);
  }
  return validateNodeFlags(*options_);
}

Status validateNodeFlags(const ServeOptions& options) {
  DSEC_TRY(checkNode(options.node));
  if (!options.run_code_listen.empty()) {
    if (auto address = parseListenAddress(options.run_code_listen); !address.ok()) {
      return flagError("run-code-listen", address.error().message());
    }
    if (options.run_code_listen == options.http.listen) {
      return flagError("run-code-listen", "must differ from the API's own address " + options.http.listen);
    }
  }
  DSEC_TRY(validateE2bOptions(options.e2b, ""));
  if (!options.e2b.listen.empty() && options.e2b.listen == options.http.listen) {
    return flagError("e2b-listen", "must differ from the API's own address " + options.http.listen);
  }
  if (auto image = fs3::parseImageRef(options.run_code.cpp_image); !image.ok()) {
    return flagError("run-code-cpp-image", image.error().message());
  }
  return checkHttp(options.http, options.output_budget_bytes);
}

}  // namespace dsec::launcher
