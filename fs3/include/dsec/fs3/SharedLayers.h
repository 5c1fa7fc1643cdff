// A node's view of the cluster's shared layer store (docs/layer-store.md): the store's manifests, the node's chunk
// cache, and the FUSE files the layer mounter mounts EROFS from. A layer the node's own store lacks is mounted from
// here, on demand, without copying it.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dsec/common/Result.h"
#include "dsec/fs3/ChunkCache.h"
#include "dsec/fs3/ChunkStore.h"
#include "dsec/fs3/LazyLayerFs.h"

namespace dsec::fs3 {

struct SharedLayersOptions {
  std::string store_dir;  // the shared store (--store)
  std::string cache_dir;  // the node's chunk cache, e.g. <root>/chunk-cache
  int64_t cache_bytes = 8ll << 30;
  std::string mountpoint;  // the FUSE files, e.g. <root>/lazy
  double store_retry_seconds = 10;
};

// A chunk that failed (corrupt, or the store stayed away), for the node's events.
struct ChunkFailure {
  std::string chunk;
  std::string what;
  double unix_time = 0;
};

class SharedLayers {
 public:
  // Checks the store is a directory, prepares the cache and mounts the FUSE file system.
  static Result<std::unique_ptr<SharedLayers>> open(const SharedLayersOptions& options);

  const ChunkStore& store() const { return store_; }
  bool has(const LayerRef& ref) const { return store_.exists(ref); }
  // The layer's manifest (checked) and its FUSE file, ready to mount.
  Result<std::string> fileFor(const LayerRef& ref);
  ChunkCacheStats cacheStats() const { return cache_->stats(); }
  // The newest failures (at most 64), oldest first.
  std::vector<ChunkFailure> recentFailures();
  LazyLayerFs& fs() { return *fs_; }

 private:
  explicit SharedLayers(const SharedLayersOptions& options) : store_(options.store_dir) {}
  // Declared first, destroyed last: the FUSE threads (fs_) report failures into them until fs_ is gone.
  std::mutex mu_;
  std::vector<ChunkFailure> failures_;
  ChunkStore store_;
  std::shared_ptr<ChunkCache> cache_;
  std::unique_ptr<LazyLayerFs> fs_;
};

}  // namespace dsec::fs3
