#include "SharedStoreCommands.h"

#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "Commands.h"
#include "Table.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/ChunkCache.h"
#include "dsec/fs3/ChunkStore.h"
#include "dsec/fs3/LayerPull.h"
#include "dsec/fs3/Prefetch.h"
#include "dsec/fs3/StoreMaintenance.h"
#include "dsec/launcher/api/HttpStore.h"

namespace dsec::cli {
namespace {

std::string ratio(double r) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(2) << r << "x";
  return out.str();
}

}  // namespace

std::string defaultStore() {
  const char* env = std::getenv("DSEC_STORE");  // NOLINT(concurrency-mt-unsafe): read once, single-threaded CLI
  return env != nullptr ? env : "";
}

Status pushLayer(const fs3::LayerStore& local, const fs3::LayerRef& ref, const std::string& store_dir,
                 int64_t chunk_size) {
  DSEC_ASSIGN_OR_RETURN(fs3::LayerManifest manifest, local.get(ref));
  fs3::ChunkStore store(store_dir);
  DSEC_ASSIGN_OR_RETURN(fs3::PushReport report, store.push(manifest, local.imagePath(ref), chunk_size));
  DSEC_ASSIGN_OR_RETURN(fs3::StoreStats stats, store.stats());
  std::cout << "pushed " << ref.toString() << " to " << store.dir() << ": " << report.chunks_new << " of "
            << report.chunks_total << " chunks new (" << formatBytes(report.bytes_new) << " written, chunks of "
            << formatBytes(report.stored.chunk_size) << "); store dedup " << ratio(stats.dedupRatio()) << " ("
            << formatBytes(stats.logical_bytes) << " of layers in " << formatBytes(stats.stored_bytes) << ")\n";
  return okStatus();
}

int layerPush(const Invocation& inv) {
  CommonOptions common;
  po::options_description desc("options");
  addCommonOptions(desc, &common, false);
  desc.add_options()("ref", po::value<std::vector<std::string>>(), "NAME:VERSION of the layers to push")(
      "store", po::value<std::string>()->default_value(defaultStore()),
      "the shared layer store (a directory every node reads; env DSEC_STORE)")(
      "chunk-size", po::value<std::string>()->default_value("128K"), "chunk size (4K to 16M, a multiple of 4K)");
  po::positional_options_description positional;
  positional.add("ref", -1);
  po::variables_map vm;
  if (!parseCommandLine(inv, inv.args, desc, positional, "NAME:VERSION... --store DIR", &vm, &common)) {
    return kExitOk;
  }
  if (vm.count("ref") == 0) throw UsageError("missing NAME:VERSION");
  const std::string store_dir = vm["store"].as<std::string>();
  if (store_dir.empty()) throw UsageError("missing --store (or DSEC_STORE)");
  auto chunk = parseByteSize(vm["chunk-size"].as<std::string>());
  if (!chunk.ok()) throw UsageError("--chunk-size: " + chunk.error().message());
  fs3::LayerStore local(common.root);
  int status = kExitOk;
  for (const auto& text : vm["ref"].as<std::vector<std::string>>()) {
    auto ref = fs3::parseLayerRef(text);
    if (!ref.ok()) throw UsageError(ref.error().message());
    if (Status pushed = pushLayer(local, *ref, store_dir, *chunk); !pushed.ok())
      status = reportError(inv, pushed.error());
  }
  return status;
}

int layerPrefetch(const Invocation& inv) {
  CommonOptions common;
  po::options_description desc("options");
  addCommonOptions(desc, &common, false);
  desc.add_options()("image", po::value<std::string>(), "the image whose layers to prefetch, e.g. debian:12+ws:1")(
      "store", po::value<std::string>()->default_value(defaultStore()), "the shared layer store (env DSEC_STORE)")(
      "all", po::bool_switch(), "every chunk of the layers, not only what their recordings name")(
      "threads", po::value<int>()->default_value(8), "parallel fetches")(
      "chunk-cache", po::value<std::string>()->default_value("8G"), "the node's chunk cache size (as --chunk-cache)");
  po::positional_options_description positional;
  positional.add("image", 1);
  po::variables_map vm;
  if (!parseCommandLine(inv, inv.args, desc, positional, "IMAGE --store DIR [--all]", &vm, &common)) return kExitOk;
  if (vm.count("image") == 0) throw UsageError("missing IMAGE");
  auto image = fs3::parseImageRef(vm["image"].as<std::string>());
  if (!image.ok()) throw UsageError(image.error().message());
  const std::string store_dir = vm["store"].as<std::string>();
  if (store_dir.empty()) throw UsageError("missing --store (or DSEC_STORE)");
  auto capacity = parseByteSize(vm["chunk-cache"].as<std::string>());
  if (!capacity.ok()) throw UsageError("--chunk-cache: " + capacity.error().message());
  const int threads = vm["threads"].as<int>();
  if (threads < 1 || threads > 256) throw UsageError("--threads: 1 to 256");
  auto opened = launcher::openSharedStore(store_dir);
  if (!opened.ok()) return reportError(inv, opened.error());
  std::shared_ptr<fs3::SharedStore> store = *opened;
  const std::string cache_dir = common.root + "/chunk-cache";
  fs3::ChunkCache cache(cache_dir, *capacity, store);
  if (Status st = cache.init(); !st.ok()) return reportError(inv, st.error());
  int status = kExitOk;
  for (const auto& ref : *image) {
    auto layer = store->manifest(ref);
    if (!layer.ok()) {
      status = reportError(inv, layer.error());
      continue;
    }
    std::vector<size_t> chunks;
    if (vm["all"].as<bool>()) {
      for (size_t i = 0; i < layer->chunks.size(); ++i) chunks.push_back(i);
    } else if (auto recorded = fs3::readRecording(*store, cache_dir, *layer)) {
      chunks = std::move(*recorded);
    } else {
      std::cout << ref.toString() << ": no recording yet (a first start makes one; --all fetches the whole layer)\n";
      continue;
    }
    double start = monotonicSeconds();
    fs3::PrefetchResult r = fs3::prefetchChunks(cache, *layer, chunks, threads);
    std::cout << ref.toString() << ": " << r.fetched << " chunks fetched (" << formatBytes(r.bytes) << "), " << r.cached
              << " already cached, " << r.failed << " failed, in " << std::fixed << std::setprecision(2)
              << (monotonicSeconds() - start) << " s\n";
    if (r.failed > 0) status = kExitFailure;
  }
  return status;
}

int layerPull(const Invocation& inv) {
  CommonOptions common;
  po::options_description desc("options");
  addCommonOptions(desc, &common, false);
  desc.add_options()("image", po::value<std::string>(), "the image whose layers to copy, e.g. debian:12+ws:1")(
      "store", po::value<std::string>()->default_value(defaultStore()),
      "the shared layer store, a directory or http://HOST:PORT (env DSEC_STORE)")(
      "threads", po::value<int>()->default_value(8), "parallel fetches");
  po::positional_options_description positional;
  positional.add("image", 1);
  po::variables_map vm;
  if (!parseCommandLine(inv, inv.args, desc, positional, "IMAGE --store DIR|URL", &vm, &common)) return kExitOk;
  if (vm.count("image") == 0) throw UsageError("missing IMAGE");
  auto image = fs3::parseImageRef(vm["image"].as<std::string>());
  if (!image.ok()) throw UsageError(image.error().message());
  const std::string store_dir = vm["store"].as<std::string>();
  if (store_dir.empty()) throw UsageError("missing --store (or DSEC_STORE)");
  const int threads = vm["threads"].as<int>();
  if (threads < 1 || threads > 256) throw UsageError("--threads: 1 to 256");
  auto opened = launcher::openSharedStore(store_dir);
  if (!opened.ok()) return reportError(inv, opened.error());
  fs3::LayerStore local(common.root);
  int status = kExitOk;
  for (const auto& ref : *image) {
    if (local.exists(ref)) {
      std::cout << ref.toString() << ": already here\n";
      continue;
    }
    auto layer = (*opened)->manifest(ref);
    if (!layer.ok()) {
      status = reportError(inv, layer.error());
      continue;
    }
    double start = monotonicSeconds();
    auto pulled = fs3::pullLayer(**opened, *layer, local, threads);
    if (!pulled.ok()) {
      status = reportError(inv, pulled.error());
      continue;
    }
    std::cout << ref.toString() << ": copied " << formatBytes(pulled->bytes) << " (" << pulled->chunks << " chunks) in "
              << std::fixed << std::setprecision(2) << (monotonicSeconds() - start) << " s\n";
  }
  return status;
}

int layerGc(const Invocation& inv) {
  CommonOptions common;
  po::options_description desc("options");
  addCommonOptions(desc, &common, false);
  desc.add_options()("store", po::value<std::string>()->default_value(defaultStore()),
                     "the shared layer store (env DSEC_STORE)")(
      "grace", po::value<double>()->default_value(3600),
      "seconds an unreferenced chunk is kept (a push writes its chunks before its manifest)")(
      "dry-run", po::bool_switch(), "count what would go, remove nothing");
  po::variables_map vm;
  if (!parseCommandLine(inv, inv.args, desc, {}, "--store DIR [--grace SECONDS] [--dry-run]", &vm, &common)) {
    return kExitOk;
  }
  const std::string store_dir = vm["store"].as<std::string>();
  if (store_dir.empty()) throw UsageError("missing --store (or DSEC_STORE)");
  const double grace = vm["grace"].as<double>();
  if (!(grace >= 0)) throw UsageError("--grace must be >= 0 seconds");
  const bool dry_run = vm["dry-run"].as<bool>();
  fs3::ChunkStore store(store_dir);
  auto report = fs3::collectGarbage(store, grace, dry_run);
  if (!report.ok()) return reportError(inv, report.error());
  std::cout << (dry_run ? "would remove " : "removed ") << report->chunks_removed << " chunks ("
            << formatBytes(report->bytes_removed) << "); kept " << report->chunks_kept << " referenced and "
            << report->chunks_too_new << " newer than the grace period\n";
  return kExitOk;
}

int layerRmStore(const Invocation& inv, const std::vector<fs3::LayerRef>& refs, const std::string& store_dir) {
  fs3::ChunkStore store(store_dir);
  int status = kExitOk;
  for (const auto& ref : refs) {
    if (Status st = fs3::removeStoredLayer(store, ref); !st.ok()) {
      status = reportError(inv, st.error());
      continue;
    }
    std::cout << "removed " << ref.toString() << " from " << store.dir() << " (its chunks go at the next gc)\n";
  }
  return status;
}

int layerLsStore(const Invocation& inv, const std::string& store_dir, bool json) {
  fs3::ChunkStore store(store_dir);
  auto layers = store.list();
  if (!layers.ok()) return reportError(inv, layers.error());
  auto stats = store.stats();
  if (!stats.ok()) return reportError(inv, stats.error());
  if (json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& l : *layers) {
      nlohmann::json j = l.layer.toJson();
      j["chunk_size"] = l.chunk_size;
      j["chunks"] = l.chunks.size();
      out.push_back(j);
    }
    std::cout << nlohmann::json{{"store", store.dir()},
                                {"layers", out},
                                {"logical_bytes", stats->logical_bytes},
                                {"stored_bytes", stats->stored_bytes},
                                {"chunks", stats->chunks},
                                {"dedup_ratio", stats->dedupRatio()}}
                     .dump(2)
              << "\n";
    return kExitOk;
  }
  Table table({"NAME:VERSION", "SIZE", "CHUNKS", "CREATED", "BUILT_ON"});
  for (const auto& l : *layers) {
    table.add({l.layer.ref.toString(), formatBytes(l.layer.size), std::to_string(l.chunks.size()), l.layer.created,
               l.layer.built_on.empty() ? "-" : l.layer.built_on});
  }
  table.print(std::cout);
  std::cout << "store " << store.dir() << ": " << formatBytes(stats->logical_bytes) << " of layers in " << stats->chunks
            << " distinct chunks, " << formatBytes(stats->stored_bytes) << " (dedup " << ratio(stats->dedupRatio())
            << ")\n";
  return kExitOk;
}

}  // namespace dsec::cli
