// Layers of the shared store as read-only files a node can mount without copying them (docs/layer-store.md): a
// FUSE file system (libfuse3) whose files <mountpoint>/<name>@<version>.erofs are the layers' EROFS images, read
// chunk by chunk through the node's ChunkCache. The file-backed EROFS mount sits on top of such a file, so the
// kernel's page cache and every sandbox of the node share what was read. Which chunks each layer's reads touched
// is recorded (the prefetch of later mounts replays it).
#pragma once

#include <cstdint>
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

struct fuse_session;

namespace dsec::fs3 {

class LazyLayerFs {
 public:
  // Mounts the file system at mountpoint (created if missing; must be empty) and serves it from threads of its own
  // until destruction. kUnsupported when FUSE is not available (no /dev/fuse, no fuse module).
  static Result<std::unique_ptr<LazyLayerFs>> mount(const std::string& mountpoint, std::shared_ptr<ChunkCache> cache);
  ~LazyLayerFs();  // unmounts (detached if a layer is still mounted over a file) and stops serving
  LazyLayerFs(const LazyLayerFs&) = delete;
  LazyLayerFs& operator=(const LazyLayerFs&) = delete;

  // Makes the layer's file appear (idempotent) and returns its path.
  Result<std::string> attach(const StoredLayer& layer);
  // The file's path once attached ("" otherwise).
  std::string filePath(const LayerRef& ref) const;
  // Chunk indices the layer's reads have touched since it was attached (in first-touch order).
  std::vector<size_t> touchedChunks(const LayerRef& ref) const;
  const std::string& mountpoint() const { return mountpoint_; }
  ChunkCache& cache() { return *cache_; }

  // For the FUSE callbacks (LazyLayerFs.cc); not part of the interface.
  struct File {
    uint64_t ino = 0;
    std::string name;  // "<name>@<version>.erofs"
    StoredLayer layer;
    std::vector<size_t> touched;
    std::vector<bool> seen;
  };
  std::shared_ptr<File> fileByIno(uint64_t ino) const;
  std::shared_ptr<File> fileByName(const std::string& name) const;
  std::vector<std::shared_ptr<File>> files() const;
  void recordTouch(File& file, size_t chunk);
  Result<size_t> readAt(File& file, int64_t offset, char* out, size_t size);

 private:
  LazyLayerFs(std::string mountpoint, std::shared_ptr<ChunkCache> cache);

  std::string mountpoint_;
  std::shared_ptr<ChunkCache> cache_;
  fuse_session* session_ = nullptr;
  std::vector<std::thread> workers_;
  mutable std::mutex mu_;
  std::map<uint64_t, std::shared_ptr<File>> by_ino_;
  std::map<std::string, std::shared_ptr<File>> by_name_;
  uint64_t next_ino_ = 2;  // 1 is the root
};

// "<name>@<version>.erofs"
std::string lazyFileName(const LayerRef& ref);

}  // namespace dsec::fs3
