// dsec bench image-start: how fast a sandbox of a large image starts on a node that has none of it, reading the
// image on demand from a shared store reached over a shaped network link, beside copying the layers first (what
// nodes did before on-demand mounts), and with the chunk cache warm or filled by recorded prefetch
// (docs/layer-store.md, docs/benchmarks.md). Each round uses fresh node roots; medians over the rounds.
#include <unistd.h>

#include <iomanip>
#include <iostream>
#include <mutex>

#include "ApiClient.h"
#include "BenchImageStartSetup.h"
#include "BenchSupport.h"
#include "Commands.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/ChunkStore.h"
#include "dsec/fs3/LayerPull.h"
#include "dsec/fs3/Prefetch.h"
#include "dsec/fs3/StoreMaintenance.h"
#include "dsec/launcher/api/HttpStore.h"
#include "dsec/launcher/api/Serve.h"

namespace dsec::cli {
namespace {

constexpr const char* kDefaultCommand =
    "cd /workspace/repo && python3 -c 'import os, sys; print(sys.version.split()[0], len(os.listdir(\".\")))'";

struct BenchNode {
  std::unique_ptr<launcher::EmbeddedNode> node;
  FleetAddress address;
  std::string root;
};

// A node on root (which the caller cleared, or filled with copied layers), reading store_url when not empty.
Result<BenchNode> startNode(const std::string& root, const std::string& store_url) {
  launcher::ServeOptions serve = benchServeOptions(root);
  serve.node.fncall.max_workers = 0;
  serve.node.store_dir = store_url;
  BenchNode n;
  n.root = root;
  DSEC_ASSIGN_OR_RETURN(n.node, launcher::EmbeddedNode::start(serve));
  n.address = FleetAddress{n.node->endpoint(), n.node->token()};
  return n;
}

void stopNode(BenchNode& n) {
  if (n.node) n.node->stop(true);
  n.node.reset();  // its layers are unmounted and its FUSE files gone with it
  (void)removeTree(n.root);
}

// One start: create + the command, timed from the create call to the command's answer; the sandbox is destroyed.
Result<double> timedStart(const BenchNode& n, const std::string& image, const std::string& command) {
  ApiClient client(n.address);
  std::mutex mu;
  std::vector<std::string> ids;
  const double t0 = monotonicSeconds();
  std::string failed =
      createAndExec(client, nlohmann::json{{"image", image}},
                    nlohmann::json{{"cmd", nlohmann::json::array({"/bin/sh", "-c", command})}}, &mu, &ids);
  const double ms = (monotonicSeconds() - t0) * 1000;
  for (const auto& id : ids) (void)client.call(HttpMethod::kDelete, "/v1/sandboxes/" + percentEncode(id));
  if (!failed.empty()) return Error(ErrorCode::kUnavailable, failed);
  return ms;
}

int64_t bytesFetched(const BenchNode& n) {
  ApiClient client(n.address);
  auto info = client.call(HttpMethod::kGet, "/v1/node");
  if (!info.ok()) return -1;
  return info->value("/layer_store/chunk_cache/bytes_fetched"_json_pointer, int64_t{-1});
}

struct Round {
  double cold_ms = 0, warm_ms = 0, prefetched_ms = 0, prolog_prefetch_ms = 0, prolog_start_ms = 0;
  double eager_copy_only_ms = 0, eager_start_ms = 0;
  int64_t cold_bytes = 0, recorded_chunks = 0;
};

Result<Round> runRound(const std::string& work, const std::string& store_dir, const std::string& url,
                       const std::vector<fs3::LayerRef>& image, const std::string& command) {
  Round r;
  const std::string image_text = fs3::imageToString(image);
  fs3::DirectoryStore store(store_dir);
  for (const auto& ref : image) ::unlink(fs3::storeRecordingPath(store.chunkStore(), ref).c_str());
  for (const char* name : {"cold", "prefetched", "prolog", "eager"}) (void)removeTree(work + "/nodes/" + name);
  {  // cold, on demand; then warm on the same node, whose stop sends its recording to the store
    DSEC_ASSIGN_OR_RETURN(BenchNode n, startNode(work + "/nodes/cold", url));
    auto cold = timedStart(n, image_text, command);
    r.cold_bytes = bytesFetched(n);
    auto warm = cold.ok() ? timedStart(n, image_text, command) : cold;
    stopNode(n);
    if (!cold.ok()) return cold.error().wrap("cold start");
    if (!warm.ok()) return warm.error().wrap("warm start");
    r.cold_ms = *cold;
    r.warm_ms = *warm;
  }
  for (const auto& ref : image) {
    auto layer = store.manifest(ref);
    if (!layer.ok()) return layer.error();
    if (auto chunks = fs3::readRecording(store, "", *layer)) r.recorded_chunks += static_cast<int64_t>(chunks->size());
  }
  if (r.recorded_chunks == 0) return Error::internal("the cold node left no prefetch recording in the store");
  {  // a fresh node whose first mount prefetches what was recorded, while the sandbox starts
    DSEC_ASSIGN_OR_RETURN(BenchNode n, startNode(work + "/nodes/prefetched", url));
    auto started = timedStart(n, image_text, command);
    stopNode(n);
    if (!started.ok()) return started.error().wrap("prefetched start");
    r.prefetched_ms = *started;
  }
  {  // a prolog's `dsec layer prefetch IMAGE` first, then the start
    const std::string root = work + "/nodes/prolog";
    DSEC_ASSIGN_OR_RETURN(auto http, launcher::HttpStore::open(url, ""));
    const double t0 = monotonicSeconds();
    {
      fs3::ChunkCache cache(root + "/chunk-cache", 8ll << 30, http);
      DSEC_TRY(cache.init());
      for (const auto& ref : image) {
        DSEC_ASSIGN_OR_RETURN(auto layer, http->manifest(ref));
        if (auto chunks = fs3::readRecording(*http, "", layer)) fs3::prefetchChunks(cache, layer, *chunks, 8);
      }
    }
    r.prolog_prefetch_ms = (monotonicSeconds() - t0) * 1000;
    DSEC_ASSIGN_OR_RETURN(BenchNode n, startNode(root, url));
    auto started = timedStart(n, image_text, command);
    stopNode(n);
    if (!started.ok()) return started.error().wrap("start after prefetch");
    r.prolog_start_ms = *started;
  }
  {  // eager: every layer copied whole over the same link (8 parallel fetches), then the start
    const std::string root = work + "/nodes/eager";
    DSEC_ASSIGN_OR_RETURN(auto http, launcher::HttpStore::open(url, ""));
    fs3::LayerStore local(root);
    const double t0 = monotonicSeconds();
    for (const auto& ref : image) {
      DSEC_ASSIGN_OR_RETURN(auto layer, http->manifest(ref));
      DSEC_TRY(fs3::pullLayer(*http, layer, local, 8));
    }
    r.eager_copy_only_ms = (monotonicSeconds() - t0) * 1000;
    DSEC_ASSIGN_OR_RETURN(BenchNode n, startNode(root, ""));
    auto started = timedStart(n, image_text, command);
    stopNode(n);
    if (!started.ok()) return started.error().wrap("start after the copy");
    r.eager_start_ms = *started;
  }
  return r;
}

double median(const std::vector<Round>& rounds, double Round::*field) {
  std::vector<double> v;
  for (const auto& r : rounds) v.push_back(r.*field);
  return percentile(v, 50);
}

}  // namespace

int benchImageStart(const Invocation& inv) {
  CommonOptions common;
  po::options_description desc("options");
  addCommonOptions(desc, &common, false);
  desc.add_options()("image", po::value<std::string>()->default_value(kImageStartDefaultImage),
                     "the image (built in --root when it is the default and missing)")(
      "work", po::value<std::string>()->default_value("/var/tmp/dsec-bench-image-start"),
      "the bench's store and node roots")("rate", po::value<std::string>()->default_value("1gbit"),
                                          "the store link's bandwidth, each way (tc's syntax)")(
      "latency-ms", po::value<int>()->default_value(1), "added by the store server to every answer")(
      "rounds", po::value<int>()->default_value(3), "rounds (fresh nodes each); medians are reported")(
      "command", po::value<std::string>()->default_value(kDefaultCommand), "the command run after each start")(
      "min-image-mb", po::value<int>()->default_value(500), "refuse a smaller image");
  po::variables_map vm;
  if (!parseCommandLine(inv, inv.args, desc, {}, "[--image IMAGE] [--rate 1gbit] [--latency-ms 1] [--rounds 3]", &vm,
                        &common)) {
    return kExitOk;
  }
  auto image = fs3::parseImageRef(vm["image"].as<std::string>());
  if (!image.ok()) throw UsageError(image.error().message());
  const int rounds = vm["rounds"].as<int>();
  if (rounds < 1 || rounds > 50) throw UsageError("--rounds: 1 to 50");
  const int latency_ms = vm["latency-ms"].as<int>();
  if (latency_ms < 0 || latency_ms > 1000) throw UsageError("--latency-ms: 0 to 1000");
  const std::string rate = vm["rate"].as<std::string>();
  const std::string work = vm["work"].as<std::string>();
  const std::string command = vm["command"].as<std::string>();
  if (::geteuid() != 0)
    return reportError(inv, Error(ErrorCode::kUnsupported, "image-start needs root (a network namespace)"));
  raiseFileLimit();
  if (Status st = ensureBenchImage(common.root, *image); !st.ok()) return reportError(inv, st.error());
  // The image's layers into the bench's store (a push of what is there already writes nothing).
  fs3::LayerStore local(common.root);
  const std::string store_dir = work + "/store";
  fs3::ChunkStore chunk_store(store_dir);
  if (Status st = makeDirs(store_dir, 0755); !st.ok()) return reportError(inv, st.error());
  if (Status st = chunk_store.init(); !st.ok()) return reportError(inv, st.error());
  int64_t image_bytes = 0;
  for (const auto& ref : *image) {
    auto m = local.get(ref);
    if (!m.ok()) return reportError(inv, m.error());
    image_bytes += m->size;
    auto pushed = chunk_store.push(*m, local.imagePath(ref));
    if (!pushed.ok() && pushed.error().code() == ErrorCode::kAlreadyExists) {
      // The bench's own store holds another build of this NAME:VERSION (rebuilt in --root): it goes.
      if (Status st = fs3::removeStoredLayer(chunk_store, ref); !st.ok()) return reportError(inv, st.error());
      pushed = chunk_store.push(*m, local.imagePath(ref));
    }
    if (!pushed.ok()) return reportError(inv, pushed.error());
  }
  const int64_t min_bytes = int64_t{vm["min-image-mb"].as<int>()} << 20;
  if (image_bytes < min_bytes) {
    return reportError(inv, Error::invalid("image " + fs3::imageToString(*image) + " is " + formatBytes(image_bytes) +
                                           ", under --min-image-mb"));
  }
  auto link = StoreLink::create(rate);
  if (!link.ok()) return reportError(inv, link.error());
  auto server = StoreServerProcess::start(**link, store_dir, latency_ms, work + "/store-server.log");
  if (!server.ok()) return reportError(inv, server.error());
  const std::string url = (*server)->url();
  std::cout << "image-start: " << fs3::imageToString(*image) << " (" << formatBytes(image_bytes) << ") from " << url
            << " in another network namespace: tbf " << rate << " each way, +" << latency_ms << " ms per request\n";
  std::vector<Round> done;
  for (int i = 0; i < rounds; ++i) {
    auto r = runRound(work, store_dir, url, *image, command);
    if (!r.ok()) return reportError(inv, r.error());
    std::cout << std::fixed << std::setprecision(1) << "round " << (i + 1) << ": cold " << r->cold_ms << " ms ("
              << formatBytes(r->cold_bytes) << " fetched), warm " << r->warm_ms << " ms, prefetched "
              << r->prefetched_ms << " ms, prolog prefetch " << r->prolog_prefetch_ms << " ms + start "
              << r->prolog_start_ms << " ms, eager copy " << r->eager_copy_only_ms << " ms + start "
              << r->eager_start_ms << " ms\n";
    done.push_back(*r);
  }
  std::vector<double> fetched;
  for (const auto& r : done) fetched.push_back(static_cast<double>(r.cold_bytes));
  const double bytes = percentile(fetched, 50);
  const double cold = median(done, &Round::cold_ms);
  const double eager_only = median(done, &Round::eager_copy_only_ms);
  std::vector<double> eager_total;
  for (const auto& r : done) eager_total.push_back(r.eager_copy_only_ms + r.eager_start_ms);
  const double eager = percentile(eager_total, 50);
  nlohmann::json out{{"bench", "image-start"},
                     {"image", fs3::imageToString(*image)},
                     {"image_bytes", image_bytes},
                     {"store", "http chunk server in a network namespace"},
                     {"rate", rate},
                     {"latency_ms", latency_ms},
                     {"rounds", rounds},
                     {"bytes_fetched", static_cast<int64_t>(bytes)},
                     {"bytes_read_fraction", bytes / static_cast<double>(image_bytes)},
                     {"cold_start_ms", cold},
                     {"eager_copy_ms", eager},
                     {"eager_copy_only_ms", eager_only},
                     {"eager_start_ms", median(done, &Round::eager_start_ms)},
                     {"eager_over_cold", cold > 0 ? eager / cold : 0.0},
                     {"warm_start_ms", median(done, &Round::warm_ms)},
                     {"prefetched_start_ms", median(done, &Round::prefetched_ms)},
                     {"prolog_prefetch_ms", median(done, &Round::prolog_prefetch_ms)},
                     {"prolog_prefetched_start_ms", median(done, &Round::prolog_start_ms)},
                     {"recorded_chunks", done.back().recorded_chunks}};
  std::cout << std::fixed << std::setprecision(1) << "image-start: read " << std::setprecision(1)
            << 100.0 * bytes / static_cast<double>(image_bytes) << "% of the image; cold on demand " << cold
            << " ms vs eager copy " << eager << " ms (" << std::setprecision(2) << (cold > 0 ? eager / cold : 0.0)
            << "x)\n"
            << out.dump() << std::endl;
  (void)removeTree(work + "/nodes");
  return kExitOk;
}

}  // namespace dsec::cli
