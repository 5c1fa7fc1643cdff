// How a node reaches the cluster's shared layer store (docs/layer-store.md): a directory of the cluster's file
// system (DirectoryStore, below) or a chunk server over HTTP (the launcher's HttpStore). The node's chunk cache,
// FUSE files and recorded prefetch (SharedLayers) sit above it and work the same on either.
#pragma once

#include <memory>
#include <set>
#include <string>

#include "dsec/common/Result.h"
#include "dsec/fs3/ChunkCache.h"
#include "dsec/fs3/ChunkStore.h"

namespace dsec::fs3 {

class SharedStore : public ChunkSource {
 public:
  // What names the store in messages: its directory or its URL.
  virtual std::string location() const = 0;
  // The layer's manifest, checked (parseStoredLayer): kNotFound when the store has no such layer.
  virtual Result<StoredLayer> manifest(const LayerRef& ref) = 0;
  // Whether the store names the layer; cheap enough for every create (not checked: manifest() checks).
  virtual bool has(const LayerRef& ref) = 0;
  // The layer's prefetch recording as stored (Prefetch.h checks it); kNotFound when there is none.
  virtual Result<std::string> recording(const LayerRef& ref) = 0;
  // Stores a recording for every node; an error when this node may not (then it keeps the recording itself).
  virtual Status putRecording(const LayerRef& ref, const std::string& text) = 0;
  // This node's lease naming the layers it uses (StoreMaintenance.h), so a gc of the store sees them; an error
  // when the store keeps no lease of this node. dropLease removes it.
  virtual Status renewLease(const std::set<LayerRef>& in_use) = 0;
  virtual void dropLease() = 0;
};

// A store on a file system every node mounts (3FS, Lustre, GPFS, NFS).
class DirectoryStore : public SharedStore {
 public:
  explicit DirectoryStore(const std::string& dir, double retry_seconds = 10)
      : store_(dir), chunks_(store_.dir(), retry_seconds) {}
  const ChunkStore& chunkStore() const { return store_; }

  Result<std::string> fetch(const std::string& sha256, int64_t length) override {
    return chunks_.fetch(sha256, length);
  }
  std::string location() const override { return store_.dir(); }
  Result<StoredLayer> manifest(const LayerRef& ref) override { return store_.get(ref); }
  bool has(const LayerRef& ref) override;
  Result<std::string> recording(const LayerRef& ref) override;
  Status putRecording(const LayerRef& ref, const std::string& text) override;
  Status renewLease(const std::set<LayerRef>& in_use) override;
  void dropLease() override;

 private:
  ChunkStore store_;
  StoreChunkSource chunks_;
};

// A `--store` value: "http://HOST:PORT" names a chunk server, anything else a directory.
inline bool isHttpStore(const std::string& location) { return location.rfind("http://", 0) == 0; }

}  // namespace dsec::fs3
