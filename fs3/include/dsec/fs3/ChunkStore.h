// The cluster's shared layer store (docs/layer-store.md): a directory on a file system every node reads (3FS,
// Lustre, GPFS, NFS) holding layers as content-addressed chunks plus a manifest per layer. Nodes read only the
// chunks a sandbox touches (LazyLayerFs); identical chunks of any layers and versions are stored once.
//
//   <store>/chunks/<sha[0:2]>/<sha256>            a chunk's bytes (every chunk is chunk_size, the last shorter)
//   <store>/layers/<NAME>/<VERSION>/manifest.json the layer: its chunks in order, sizes, its image's sha256, and the
//                                                 manifest's own checksum
//
// A chunk is written aside and renamed into place; the manifest last, so a manifest a node can read names chunks
// that are all there. Nothing in the store is trusted when read: manifests are checked against their checksum and
// their shape, chunks against their hash (ChunkCache).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dsec/common/Result.h"
#include "dsec/fs3/LayerRef.h"
#include "dsec/fs3/LayerStore.h"

namespace dsec::fs3 {

// 128 KiB: small enough that a sandbox's scattered first reads (a start touches a few hundred files of an image)
// fetch a small fraction of it, large enough that a 1 GiB layer is 8192 chunks (a manifest of ~600 KiB) and that a
// cluster file system serves each fetch at its streaming rate rather than its per-request latency.
inline constexpr int64_t kDefaultChunkSize = 128ll << 10;
inline constexpr int64_t kMinChunkSize = 4ll << 10;
inline constexpr int64_t kMaxChunkSize = 16ll << 20;

struct StoredLayer {
  LayerManifest layer;  // name, version, sha256 and size of the whole image, built_on, source, created
  int64_t chunk_size = kDefaultChunkSize;
  std::vector<std::string> chunks;  // sha256 (lowercase hex) of each chunk, in order

  int64_t chunkLength(size_t index) const;  // bytes of chunk `index` (the last may be short)
  nlohmann::json toJson() const;            // with "checksum" (sha256 of the rest, as dumped)
};

// What a push did: how much it found already stored.
struct PushReport {
  StoredLayer stored;
  int64_t chunks_total = 0;
  int64_t chunks_new = 0;
  int64_t bytes_new = 0;  // bytes of the chunks it had to write
};

// The store's size: logical (every layer's bytes) over physical (its distinct chunks' bytes) is the dedup ratio.
struct StoreStats {
  int64_t layers = 0;
  int64_t logical_bytes = 0;
  int64_t stored_bytes = 0;
  int64_t chunks = 0;
  double dedupRatio() const {
    return stored_bytes > 0 ? static_cast<double>(logical_bytes) / static_cast<double>(stored_bytes) : 1.0;
  }
};

class ChunkStore {
 public:
  explicit ChunkStore(std::string dir);  // made absolute; cheap
  const std::string& dir() const { return dir_; }

  // Creates dir/chunks and dir/layers if missing (the store's directory itself must exist: it is the cluster's).
  Status init() const;

  // Publishes a layer of the node's layer store: cuts image into chunks, writes the ones the store lacks, then the
  // manifest. kAlreadyExists if the store has NAME:VERSION with another image (the same image: done, nothing new).
  Result<PushReport> push(const LayerManifest& layer, const std::string& image_path,
                          int64_t chunk_size = kDefaultChunkSize) const;

  // The layer's manifest, checked: its checksum, its shape (chunk count for its size, hashes) and its name.
  // kNotFound when the store has no such layer; kSystem with EIO for a manifest that fails a check.
  Result<StoredLayer> get(const LayerRef& ref) const;
  bool exists(const LayerRef& ref) const;
  // Every layer whose manifest passes, sorted by name then version.
  Result<std::vector<StoredLayer>> list() const;
  Result<StoreStats> stats() const;

  std::string chunkPath(const std::string& sha256) const;
  std::string manifestPath(const LayerRef& ref) const;

 private:
  std::string dir_;
};

// Parses and checks a manifest's text (what names it in errors).
Result<StoredLayer> parseStoredLayer(const std::string& text, const std::string& what);

// Lowercase hex sha256 of bytes.
std::string sha256Hex(std::string_view bytes);
// 64 lowercase hex digits: what a chunk's name (and so its file name) must be.
bool isSha256Hex(std::string_view s);

}  // namespace dsec::fs3
