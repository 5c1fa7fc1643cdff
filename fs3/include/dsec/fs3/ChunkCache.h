// A node's bounded cache of a shared store's chunks (docs/layer-store.md), on the node's own disk: a chunk is
// fetched from its source on first use, checked against its sha256 and kept; past the capacity the least recently
// used chunks go. One fetch per chunk however many readers want it at once. A chunk that fails its hash is never
// used: the read fails with EIO and the failure is counted and reported.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"

namespace dsec::fs3 {

// Where chunks come from. The store's directory in production; tests inject their own.
class ChunkSource {
 public:
  virtual ~ChunkSource() = default;
  // The chunk's bytes as stored (unchecked: the cache checks them). length is what the manifest says it holds.
  virtual Result<std::string> fetch(const std::string& sha256, int64_t length) = 0;
};

// Reads <store>/chunks/<sha[0:2]>/<sha>. A store that is briefly unreachable (ENOENT, EIO, ESTALE, ENOTCONN,
// ETIMEDOUT: a remount, a failover) is retried with backoff up to retry_seconds, then the fetch fails with EIO.
class StoreChunkSource : public ChunkSource {
 public:
  StoreChunkSource(std::string store_dir, double retry_seconds = 10);
  Result<std::string> fetch(const std::string& sha256, int64_t length) override;

 private:
  std::string store_dir_;
  double retry_seconds_;
};

struct ChunkCacheStats {
  int64_t hits = 0;
  int64_t misses = 0;  // fetches from the source
  int64_t bytes_fetched = 0;
  int64_t evictions = 0;
  int64_t corrupt = 0;       // chunks that failed their hash
  int64_t fetch_errors = 0;  // fetches that failed (the store gone past its retries)
  int64_t bytes_cached = 0;
  int64_t chunks_cached = 0;
};

class ChunkCache {
 public:
  // dir: the node's cache directory (made 0700); capacity: bytes of chunks it keeps (at least one chunk is kept
  // while it is being read, whatever the capacity).
  ChunkCache(std::string dir, int64_t capacity_bytes, std::shared_ptr<ChunkSource> source);

  // Creates dir, drops half-written files and indexes the chunks a previous run left (oldest first), trimming to
  // the capacity.
  Status init();

  // An open fd of the chunk's cached file, fetching and checking it first on a miss (*fetched says whether this
  // call fetched it). A chunk file another process of the node put in the directory (`dsec layer prefetch`) is
  // taken as cached. Errors: kSystem with EIO for a corrupt chunk or a store that stayed away.
  Result<UniqueFd> open(const std::string& sha256, int64_t length, bool* fetched = nullptr);
  // Copies bytes [offset, offset + size) of the chunk into out; the count read.
  Result<size_t> read(const std::string& sha256, int64_t length, int64_t offset, char* out, size_t size);
  bool contains(const std::string& sha256) const;

  ChunkCacheStats stats() const;
  // Called (outside the cache's lock) for each chunk that fails its hash or cannot be fetched: sha, what happened.
  void onFailure(std::function<void(const std::string&, const std::string&)> callback) {
    on_failure_ = std::move(callback);
  }

 private:
  struct Entry {
    int64_t bytes = 0;
    std::list<std::string>::iterator lru;  // in lru_: front is the most recently used
  };
  std::string pathOf(const std::string& sha256) const;
  Result<UniqueFd> fetchAndInsert(const std::string& sha256, int64_t length);
  void touchLocked(const std::string& sha256);
  void evictLocked(const std::string& keep);
  void report(const std::string& sha256, const std::string& what);

  std::string dir_;
  int64_t capacity_;
  std::shared_ptr<ChunkSource> source_;
  mutable std::mutex mu_;
  std::condition_variable fetched_;
  std::map<std::string, Entry> entries_;
  std::list<std::string> lru_;
  std::map<std::string, int> in_flight_;  // sha -> readers waiting on one fetch
  int64_t bytes_ = 0;
  ChunkCacheStats stats_;
  std::function<void(const std::string&, const std::string&)> on_failure_;
};

}  // namespace dsec::fs3
