// Recorded prefetch (docs/layer-store.md): the chunks the first start of a layer touched, in first-touch order, kept
// next to its manifest in the shared store (or, where this node cannot write the store, in the node's own cache
// dir); later mounts fetch them in parallel, in the background, before the sandbox asks.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dsec/common/Result.h"
#include "dsec/fs3/ChunkCache.h"
#include "dsec/fs3/ChunkStore.h"
#include "dsec/fs3/SharedStore.h"

namespace dsec::fs3 {

// <store>/layers/NAME/VERSION/prefetch.json (a directory store), and the node's fallback
// <local_dir>/<name>@<version>.erofs.prefetch.json.
std::string storeRecordingPath(const ChunkStore& store, const LayerRef& ref);
std::string localRecordingPath(const std::string& local_dir, const LayerRef& ref);

// The layer's recording: the store's, else the node's own; nullopt when there is none. A recording that does not
// belong to this layer's bytes (another sha256), or fails its checksum or shape, counts as none (and is logged).
std::optional<std::vector<size_t>> readRecording(SharedStore& store, const std::string& local_dir,
                                                 const StoredLayer& layer);
// A recording's text checked against the layer (its checksum, format, layer sha256, chunk indices): its chunks, or
// kInvalidArgument saying what is wrong. What a chunk server checks before it stores a node's recording.
Result<std::vector<size_t>> parseRecording(const std::string& text, const StoredLayer& layer);

// Writes the recording into the store, or into local_dir when the store refuses the write. Returns where it went.
Result<std::string> writeRecording(SharedStore& store, const std::string& local_dir, const StoredLayer& layer,
                                   const std::vector<size_t>& chunks);

struct PrefetchResult {
  int64_t fetched = 0;  // chunks fetched from the store now
  int64_t cached = 0;   // chunks the cache had already
  int64_t failed = 0;   // chunks that could not be fetched (each reported by the cache)
  int64_t bytes = 0;    // bytes fetched
};

// Brings the given chunks of the layer into the cache with `threads` parallel fetches; stops early when *stop
// turns true.
PrefetchResult prefetchChunks(ChunkCache& cache, const StoredLayer& layer, const std::vector<size_t>& chunks,
                              int threads, const std::atomic<bool>* stop = nullptr);

}  // namespace dsec::fs3
