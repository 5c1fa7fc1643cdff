// dsec bench qos: how much a latency-sensitive sandbox's request loop slows down while best-effort sandboxes
// saturate every CPU with stress-ng, without and with CPU QoS (docs/qos.md). Per round:
//   idle         the loop (dsec-qos-probe) alone on the node;
//   unprotected  a node with QoS off: the loop's sandbox and the stress sandboxes are all plain;
//   shared_pool  QoS on, but batch sandboxes may still run on the latency sandbox's core (SCHED_IDLE, cpu.idle
//                and a low weight only);
//   protected    QoS on as shipped: the latency sandbox has a dedicated core the batch pool leaves.
// Slowdowns are of the mean request latency against the idle loop of the same round. The image (busybox, the
// host's stress-ng with the libraries ldd lists, and dsec-qos-probe) is built into the layer store here.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <thread>

#include "BenchSupport.h"
#include "BusyboxRootfs.h"
#include "Progress.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/LayerStore.h"

namespace dsec::cli {
namespace {

using nlohmann::json;

struct QosBenchOptions {
  int rounds = 3;
  int requests = 1000;
  int period_us = 5000;
  long work = 300000;
  int stress_sandboxes = 4;
  int stress_workers = 0;  // per sandbox; 0 = the node's CPU count
};

// Copies a host file into the layer tree at the same path (following symlinks: the content is what counts).
Status copyIntoTree(const std::string& tree, const std::string& host_path, int mode) {
  DSEC_ASSIGN_OR_RETURN(std::string data, readFile(host_path));
  std::string dest = tree + host_path;
  DSEC_TRY(makeDirs(dest.substr(0, dest.rfind('/')), 0755));
  DSEC_TRY(writeFile(dest, data));
  if (::chmod(dest.c_str(), static_cast<mode_t>(mode)) != 0) return Error::sys(errno, "chmod " + dest);
  return okStatus();
}

// The libraries `ldd` lists for a program (absolute paths, the loader included).
Result<std::vector<std::string>> sharedLibraries(const std::string& program) {
  DSEC_ASSIGN_OR_RETURN(std::string out, runCommandChecked({"ldd", program}));
  std::vector<std::string> libs;
  for (const auto& line : split(out, '\n')) {
    for (const auto& word : split(trim(line), ' ')) {
      if (startsWith(word, "/")) libs.push_back(word);
    }
  }
  return libs;
}

// bench-qos:<hash>: busybox + stress-ng + its libraries + dsec-qos-probe. The version follows the probe and
// stress-ng binaries, so a rebuilt probe gets a new layer.
Result<std::string> ensureQosImage(const std::string& root) {
  // Next to dsec in a build tree, in libexec/dsec once installed (cmake/DsecInstall.cmake).
  const std::string beside = selfExeDir() + "/dsec-qos-probe";
  const std::string installed = selfExeDir() + "/../libexec/dsec/dsec-qos-probe";
  std::string probe = access(beside.c_str(), X_OK) == 0 ? beside : installed;
  std::string stress = findProgram("stress-ng");
  if (access(probe.c_str(), X_OK) != 0) {
    return Error::notFound("dsec-qos-probe not found next to dsec (" + beside + ") nor in " + installed);
  }
  if (stress.empty()) return Error::notFound("stress-ng not found on PATH (apt-get install stress-ng)");
  DSEC_ASSIGN_OR_RETURN(std::string probe_bytes, readFile(probe));
  DSEC_ASSIGN_OR_RETURN(std::string stress_bytes, readFile(stress));
  uint64_t h = 1469598103934665603ULL;
  for (const std::string* s : {&probe_bytes, &stress_bytes}) {
    for (unsigned char c : *s) h = (h ^ c) * 1099511628211ULL;
  }
  char version[20];
  std::snprintf(version, sizeof version, "%08x", static_cast<unsigned>(h ^ (h >> 32)));
  fs3::LayerStore store(root);
  DSEC_TRY(store.init());
  DSEC_ASSIGN_OR_RETURN(auto ref, fs3::parseLayerRef(std::string("bench-qos:") + version));
  if (store.exists(ref)) return ref.toString();
  std::string dir = store.root() + "/layers/.build-" + randomHex(12);
  struct Cleanup {
    std::string path;
    ~Cleanup() { (void)removeTree(path); }
  } cleanup{dir};
  std::string tree = dir + "/rootfs";
  DSEC_TRY(makeDirs(tree, 0755));
  DSEC_TRY(writeBusyboxRootfs(tree));
  DSEC_TRY(copyIntoTree(tree, stress, 0755));
  DSEC_ASSIGN_OR_RETURN(auto libs, sharedLibraries(stress));
  for (const auto& lib : libs) DSEC_TRY(copyIntoTree(tree, lib, 0755));
  DSEC_TRY(makeDirs(tree + "/usr/bin", 0755));
  DSEC_TRY(writeFile(tree + "/usr/bin/dsec-qos-probe", probe_bytes));
  if (::chmod((tree + "/usr/bin/dsec-qos-probe").c_str(), 0755) != 0) return Error::sys(errno, "chmod probe");
  auto built = store.buildFromDir(ref, tree, "", "bench-qos: busybox + " + stress + " + dsec-qos-probe");
  if (!built.ok() && built.error().code() != ErrorCode::kAlreadyExists) return built.error();
  return ref.toString();
}

class QosRound {
 public:
  QosRound(const std::string& root, const std::string& image, const QosBenchOptions& options)
      : root_(root), image_(image), options_(options) {}

  // One configuration on a fresh embedded node: the loop's sandbox, optionally with stress sandboxes around it.
  Result<json> measure(bool qos, bool exclusive_pool, bool stress) {
    launcher::ServeOptions serve = benchServeOptions(root_, "qos");
    serve.node.cpu_qos = qos;
    serve.node.cpu_exclusive_pool = exclusive_pool;
    DSEC_ASSIGN_OR_RETURN(auto node, launcher::EmbeddedNode::start(serve));
    ApiClient client(FleetAddress{node->endpoint(), node->token()});
    Result<json> result = run(client, qos, stress);
    node->stop(true);  // destroys every sandbox of the round
    return result;
  }

 private:
  Result<json> run(ApiClient& client, bool qos, bool stress) {
    const long cpus = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
    json latency_body{{"image", image_}, {"cpus", 1}, {"memory", "64M"}};
    if (qos) latency_body["qos"] = "latency";
    DSEC_ASSIGN_OR_RETURN(json latency, client.call(HttpMethod::kPost, "/v1/sandboxes", latency_body));
    std::string latency_id = latency.value("id", "");
    if (stress) {
      int workers = options_.stress_workers > 0 ? options_.stress_workers : static_cast<int>(cpus);
      for (int i = 0; i < options_.stress_sandboxes; ++i) {
        json body{{"image", image_}, {"cpus", cpus}, {"memory", "256M"}};
        if (qos) body["qos"] = "batch";
        DSEC_ASSIGN_OR_RETURN(json sb, client.call(HttpMethod::kPost, "/v1/sandboxes", body));
        std::string cmd =
            "setsid stress-ng --cpu " + std::to_string(workers) + " --timeout 3600s </dev/null >/dev/null 2>&1 &";
        DSEC_ASSIGN_OR_RETURN(
            json ran, client.call(HttpMethod::kPost, "/v1/sandboxes/" + percentEncode(sb.value("id", "")) + "/exec",
                                  json{{"cmd", cmd}}));
        if (ran.value("exit_code", -1) != 0) return Error::internal("starting stress-ng: " + ran.dump());
      }
      std::this_thread::sleep_for(std::chrono::seconds(1));  // let the stressors spin up
    }
    json probe_cmd =
        json::array({"/usr/bin/dsec-qos-probe", "--requests", std::to_string(options_.requests), "--period-us",
                     std::to_string(options_.period_us), "--work", std::to_string(options_.work)});
    double budget = options_.requests * (options_.period_us / 1e6) * 20 + 60;
    DSEC_ASSIGN_OR_RETURN(json ran,
                          client.call(HttpMethod::kPost, "/v1/sandboxes/" + percentEncode(latency_id) + "/exec",
                                      json{{"cmd", probe_cmd}, {"timeout", budget}}));
    if (ran.value("exit_code", -1) != 0) return Error::internal("probe failed: " + ran.dump());
    json figures = json::parse(ran.value("stdout", ""), nullptr, false);
    if (figures.is_discarded()) return Error::internal("probe printed no JSON: " + ran.value("stdout", ""));
    DSEC_ASSIGN_OR_RETURN(json info, client.call(HttpMethod::kGet, "/v1/sandboxes/" + percentEncode(latency_id)));
    figures["qos"] = info.value("qos", json(nullptr));
    figures["cpuset"] = info.value("cpuset", json(nullptr));
    return figures;
  }

  std::string root_, image_;
  QosBenchOptions options_;
};

double slowdownPct(const json& loaded, const json& idle, const char* key = "mean_us") {
  double base = idle.value(key, 0.0);
  if (base <= 0) return 0;
  return std::round((loaded.value(key, 0.0) / base - 1) * 1000) / 10;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

int benchQos(const Invocation& inv) {
  CommonOptions common;
  po::options_description desc("options");
  addCommonOptions(desc, &common, false);
  QosBenchOptions o;
  desc.add_options()("rounds", po::value<int>(&o.rounds)->default_value(o.rounds), "measurements of each setting")(
      "requests", po::value<int>(&o.requests)->default_value(o.requests), "requests per loop")(
      "period-us", po::value<int>(&o.period_us)->default_value(o.period_us), "time between request arrivals")(
      "work", po::value<long>(&o.work)->default_value(o.work), "iterations of the work item (~1 ms at 300000)")(
      "stress-sandboxes", po::value<int>(&o.stress_sandboxes)->default_value(o.stress_sandboxes),
      "best-effort sandboxes running stress-ng")("stress-workers", po::value<int>(&o.stress_workers)->default_value(0),
                                                 "stress-ng --cpu workers per sandbox (0: the node's CPUs)");
  po::variables_map vm;
  if (!parseCommandLine(inv, inv.args, desc, {}, "[--rounds 3] [--requests 1000]", &vm, &common)) return kExitOk;
  if (o.rounds <= 0 || o.requests <= 0 || o.period_us <= 0 || o.work <= 0 || o.stress_sandboxes <= 0) {
    throw UsageError("--rounds, --requests, --period-us, --work and --stress-sandboxes must be > 0");
  }
  raiseFileLimit();
  auto image = ensureQosImage(common.root);
  if (!image.ok()) return reportError(inv, image.error());
  std::string load_before = loadAverages();
  std::printf("bench qos: %d rounds, %d requests every %d us (work %ld), %d stress sandboxes; image %s; load %s\n",
              o.rounds, o.requests, o.period_us, o.work, o.stress_sandboxes, image->c_str(), load_before.c_str());
  std::fflush(stdout);

  QosRound round(common.root, *image, o);
  Progress progress("bench qos");
  json rounds = json::array();
  std::vector<double> unprotected, shared_pool, protected_, unprotected_p50, protected_p50;
  for (int r = 0; r < o.rounds; ++r) {
    json row;
    const std::pair<const char*, std::array<bool, 3>> settings[] = {{"idle", {false, false, false}},
                                                                    {"unprotected", {false, false, true}},
                                                                    {"shared_pool", {true, false, true}},
                                                                    {"protected", {true, true, true}}};
    for (const auto& [name, s] : settings) {
      progress.step("round " + std::to_string(r + 1) + " of " + std::to_string(o.rounds) + ": " + name);
      auto figures = round.measure(s[0], s[1], s[2]);
      if (!figures.ok()) return reportError(inv, figures.error().wrap(std::string("round ") + name));
      row[name] = *figures;
      progress.hold();  // the round's line goes to stdout, on the same terminal
      std::printf("  round %d %-12s p50 %8.1f us  mean %8.1f us  p99 %8.1f us  (qos %s, cpuset %s)  load %s\n", r + 1,
                  name, figures->value("p50_us", 0.0), figures->value("mean_us", 0.0), figures->value("p99_us", 0.0),
                  figures->value("qos", json("-")).dump().c_str(), figures->value("cpuset", json("-")).dump().c_str(),
                  loadAverages().c_str());
      std::fflush(stdout);
    }
    row["unprotected_slowdown_pct"] = slowdownPct(row["unprotected"], row["idle"]);
    row["shared_pool_slowdown_pct"] = slowdownPct(row["shared_pool"], row["idle"]);
    row["protected_slowdown_pct"] = slowdownPct(row["protected"], row["idle"]);
    // The median request too: robust against a neighbour on a shared machine stalling a few requests.
    row["unprotected_p50_slowdown_pct"] = slowdownPct(row["unprotected"], row["idle"], "p50_us");
    row["shared_pool_p50_slowdown_pct"] = slowdownPct(row["shared_pool"], row["idle"], "p50_us");
    row["protected_p50_slowdown_pct"] = slowdownPct(row["protected"], row["idle"], "p50_us");
    unprotected_p50.push_back(row["unprotected_p50_slowdown_pct"]);
    protected_p50.push_back(row["protected_p50_slowdown_pct"]);
    unprotected.push_back(row["unprotected_slowdown_pct"]);
    shared_pool.push_back(row["shared_pool_slowdown_pct"]);
    protected_.push_back(row["protected_slowdown_pct"]);
    rounds.push_back(row);
  }
  progress.finish();
  auto spread = [](const std::vector<double>& v) {
    return json{{"min", *std::min_element(v.begin(), v.end())}, {"max", *std::max_element(v.begin(), v.end())}};
  };
  json summary{
      {"unprotected_slowdown_pct", median(unprotected)},
      {"protected_slowdown_pct", median(protected_)},
      {"shared_pool_slowdown_pct", median(shared_pool)},
      {"unprotected_p50_slowdown_pct", median(unprotected_p50)},
      {"protected_p50_slowdown_pct", median(protected_p50)},
      {"spread",
       {{"unprotected", spread(unprotected)}, {"protected", spread(protected_)}, {"shared_pool", spread(shared_pool)}}},
      {"load_average_before", load_before},
      {"load_average_after", loadAverages()},
      {"rounds", rounds}};
  std::fflush(stdout);
  std::cout << summary.dump() << std::endl;
  return kExitOk;
}

}  // namespace dsec::cli
