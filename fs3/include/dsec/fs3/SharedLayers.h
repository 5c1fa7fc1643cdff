// A node's view of the cluster's shared layer store (docs/layer-store.md): the store's manifests, the node's chunk
// cache, and the FUSE files the layer mounter mounts EROFS from. A layer the node's own store lacks is mounted from
// here, on demand, without copying it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "dsec/common/Result.h"
#include "dsec/fs3/ChunkCache.h"
#include "dsec/fs3/ChunkStore.h"
#include "dsec/fs3/LazyLayerFs.h"
#include "dsec/fs3/SharedStore.h"

namespace dsec::fs3 {

struct SharedLayersOptions {
  std::string store_dir;  // the shared store (--store) when it is a directory and no SharedStore is given
  std::string cache_dir;  // the node's chunk cache, e.g. <root>/chunk-cache
  int64_t cache_bytes = 8ll << 30;
  std::string mountpoint;  // the FUSE files, e.g. <root>/lazy
  double store_retry_seconds = 10;
  // Recorded prefetch: a layer without a recording is recorded from its first mount until its reads have been quiet
  // for record_settle_seconds; a layer with one is prefetched with prefetch_threads parallel fetches at mount.
  double record_settle_seconds = 10;
  int prefetch_threads = 8;
};

// What recorded prefetch did on this node.
struct PrefetchStats {
  int64_t recordings_written = 0;
  int64_t prefetches = 0;  // mounts that started a prefetch
  int64_t chunks_prefetched = 0;
  int64_t bytes_prefetched = 0;
};

// A chunk that failed (corrupt, or the store stayed away), for the node's events.
struct ChunkFailure {
  std::string chunk;
  std::string what;
  double unix_time = 0;
};

class SharedLayers {
 public:
  ~SharedLayers();  // stops the recorder and prefetches (a recording in progress is written first)
  // Prepares the cache and mounts the FUSE file system over `store`; without one, over the directory store_dir
  // (checked to be a directory).
  static Result<std::unique_ptr<SharedLayers>> open(const SharedLayersOptions& options,
                                                    std::shared_ptr<SharedStore> store = nullptr);

  // Whether the store names the layer: attached here already, or its manifest is there (checked when it is
  // mounted, not here: this runs before every create).
  bool has(const LayerRef& ref);
  // The layer's manifest (checked) and its FUSE file, ready to mount.
  Result<std::string> fileFor(const LayerRef& ref);
  ChunkCacheStats cacheStats() const { return cache_->stats(); }
  // The newest failures (at most 64), oldest first.
  std::vector<ChunkFailure> recentFailures();
  PrefetchStats prefetchStats();
  LazyLayerFs& fs() { return *fs_; }
  // Writes the recordings of layers still being recorded whose reads have settled (the recorder thread calls it).
  void recordSettled(bool force);

 private:
  struct Recording {
    StoredLayer layer;
    size_t last_count = 0;
    double last_change = 0;
  };
  SharedLayers(const SharedLayersOptions& options, std::shared_ptr<SharedStore> store)
      : options_(options), store_(std::move(store)) {}
  void startPrefetch(const StoredLayer& layer, std::vector<size_t> chunks);
  void renewLease(const std::set<LayerRef>& in_use);  // the store's lease naming the layers this node uses

  SharedLayersOptions options_;
  // Declared before fs_, destroyed after it: the FUSE threads (fs_) report failures into them until fs_ is gone.
  std::mutex mu_;
  std::vector<ChunkFailure> failures_;
  std::map<LayerRef, Recording> recording_;  // layers whose first mount is being recorded
  std::set<LayerRef> attached_;
  PrefetchStats prefetch_stats_;
  std::condition_variable wake_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> lease_warned_{false};
  std::shared_ptr<SharedStore> store_;
  std::shared_ptr<ChunkCache> cache_;
  std::unique_ptr<LazyLayerFs> fs_;
  std::thread recorder_;
  std::vector<std::thread> prefetchers_;
};

}  // namespace dsec::fs3
