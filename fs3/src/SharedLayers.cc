#include "dsec/fs3/SharedLayers.h"

#include <sys/stat.h>

#include <chrono>
#include <ctime>

#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/Prefetch.h"
#include "dsec/fs3/StoreMaintenance.h"

namespace dsec::fs3 {
namespace {
constexpr size_t kMaxFailuresKept = 64;
constexpr double kLeaseRenewSeconds = 10;  // well inside kLeaseFreshSeconds
}  // namespace

Result<std::unique_ptr<SharedLayers>> SharedLayers::open(const SharedLayersOptions& options,
                                                         std::shared_ptr<SharedStore> store) {
  if (store == nullptr) {
    if (options.store_dir.empty()) return Error::invalid("no shared layer store given");
    struct stat st {};
    auto dir = std::make_shared<DirectoryStore>(options.store_dir, options.store_retry_seconds);
    if (::stat(dir->location().c_str(), &st) != 0) return Error::sys(errno, "layer store " + dir->location());
    if (!S_ISDIR(st.st_mode)) return Error::invalid("layer store " + dir->location() + " is not a directory");
    store = std::move(dir);
  }
  std::unique_ptr<SharedLayers> shared(new SharedLayers(options, store));
  shared->cache_ = std::make_shared<ChunkCache>(options.cache_dir, options.cache_bytes, store);
  DSEC_TRY(shared->cache_->init());
  SharedLayers* raw = shared.get();
  shared->cache_->onFailure([raw](const std::string& chunk, const std::string& what) {
    std::lock_guard lock(raw->mu_);
    if (raw->failures_.size() >= kMaxFailuresKept) raw->failures_.erase(raw->failures_.begin());
    raw->failures_.push_back({chunk, what, static_cast<double>(::time(nullptr))});
  });
  DSEC_ASSIGN_OR_RETURN(shared->fs_, LazyLayerFs::mount(options.mountpoint, shared->cache_));
  shared->recorder_ = std::thread([raw] {
    double lease_written = 0;
    std::unique_lock lock(raw->mu_);
    while (!raw->stopping_.load()) {
      raw->wake_.wait_for(lock, std::chrono::milliseconds(200));
      const bool renew = monotonicSeconds() - lease_written >= kLeaseRenewSeconds;
      std::set<LayerRef> in_use = raw->attached_;
      lock.unlock();
      raw->recordSettled(false);
      if (renew) {
        raw->renewLease(in_use);
        lease_written = monotonicSeconds();
      }
      lock.lock();
    }
  });
  return shared;
}

SharedLayers::~SharedLayers() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (recorder_.joinable()) recorder_.join();
  for (auto& t : prefetchers_) t.join();
  if (fs_) recordSettled(true);
  store_->dropLease();
}

void SharedLayers::renewLease(const std::set<LayerRef>& in_use) {
  if (in_use.empty()) return;
  // A node that may only read the store leaves no lease: `dsec layer gc` cannot see its layers (docs/layer-store.md).
  if (Status st = store_->renewLease(in_use); !st.ok() && !lease_warned_) {
    lease_warned_ = true;
    // A store that keeps no leases (over HTTP) is as documented; one that refuses this node's write is worth a warning.
    const std::string what =
        "no lease in the shared store (" + st.error().message() + "): gc there cannot see the layers this node uses";
    if (st.error().code() == ErrorCode::kUnsupported) {
      DSEC_LOG(kInfo, "fs3") << what;
    } else {
      DSEC_LOG(kWarn, "fs3") << what;
    }
  }
}

bool SharedLayers::has(const LayerRef& ref) {
  {
    std::lock_guard lock(mu_);
    if (attached_.count(ref) != 0) return true;
  }
  return store_->has(ref);
}

Result<std::string> SharedLayers::fileFor(const LayerRef& ref) {
  DSEC_ASSIGN_OR_RETURN(StoredLayer layer, store_->manifest(ref));
  DSEC_ASSIGN_OR_RETURN(std::string file, fs_->attach(layer));
  std::unique_lock lock(mu_);
  if (!attached_.insert(ref).second) return file;
  {
    std::set<LayerRef> in_use = attached_;
    lock.unlock();
    renewLease(in_use);  // before the mount uses it, so a gc elsewhere sees it
    lock.lock();
  }
  // The first mount of the layer on this node: prefetch what a recording names, else record this start.
  if (auto chunks = readRecording(*store_, options_.cache_dir, layer)) {
    startPrefetch(layer, std::move(*chunks));
  } else {
    recording_[ref] = Recording{layer, 0, monotonicSeconds()};
  }
  return file;
}

void SharedLayers::startPrefetch(const StoredLayer& layer, std::vector<size_t> chunks) {
  ++prefetch_stats_.prefetches;
  prefetchers_.emplace_back([this, layer, chunks = std::move(chunks)] {
    double start = monotonicSeconds();
    PrefetchResult r = prefetchChunks(*cache_, layer, chunks, options_.prefetch_threads, &stopping_);
    DSEC_LOG(kInfo, "fs3") << "prefetched " << layer.layer.ref.toString() << ": " << r.fetched << " chunks ("
                           << formatBytes(r.bytes) << ") fetched, " << r.cached << " cached, " << r.failed
                           << " failed, in " << (monotonicSeconds() - start) << " s";
    std::lock_guard lock(mu_);
    prefetch_stats_.chunks_prefetched += r.fetched;
    prefetch_stats_.bytes_prefetched += r.bytes;
  });
}

void SharedLayers::recordSettled(bool force) {
  std::vector<Recording> ready;
  {
    std::lock_guard lock(mu_);
    double now = monotonicSeconds();
    for (auto it = recording_.begin(); it != recording_.end();) {
      size_t count = fs_->touchedChunks(it->first).size();
      if (count != it->second.last_count) {
        it->second.last_count = count;
        it->second.last_change = now;
      }
      bool settled = now - it->second.last_change >= options_.record_settle_seconds;
      if (count > 0 && (settled || force)) {
        ready.push_back(it->second);
        it = recording_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& r : ready) {
    auto written = writeRecording(*store_, options_.cache_dir, r.layer, fs_->touchedChunks(r.layer.layer.ref));
    if (!written.ok()) {
      DSEC_LOG(kWarn, "fs3") << "prefetch recording of " << r.layer.layer.ref.toString() << ": "
                             << written.error().message();
      continue;
    }
    DSEC_LOG(kInfo, "fs3") << "recorded the first start of " << r.layer.layer.ref.toString() << " ("
                           << fs_->touchedChunks(r.layer.layer.ref).size() << " chunks) in " << *written;
    std::lock_guard lock(mu_);
    ++prefetch_stats_.recordings_written;
  }
}

PrefetchStats SharedLayers::prefetchStats() {
  std::lock_guard lock(mu_);
  return prefetch_stats_;
}

std::vector<ChunkFailure> SharedLayers::recentFailures() {
  std::lock_guard lock(mu_);
  return failures_;
}

}  // namespace dsec::fs3
