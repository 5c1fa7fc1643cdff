// Keeping the shared layer store tidy (docs/layer-store.md): nodes leave leases naming the layers they use, and the
// store's layers are removed and its unreferenced chunks collected only when no live lease stands in the way.
//
//   <store>/leases/<host>.<pid>.json   {"host", "pid", "layers": ["name:version", ...]}, rewritten every few
//                                      seconds while the node runs; a lease older than kLeaseFreshSeconds is dead
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "dsec/common/Result.h"
#include "dsec/fs3/ChunkStore.h"

namespace dsec::fs3 {

inline constexpr double kLeaseFreshSeconds = 60;

// Writes (or refreshes) this process's lease naming `layers`; removeLease drops it.
Status writeLease(const ChunkStore& store, const std::set<LayerRef>& layers);
void removeLease(const ChunkStore& store);

// This process's lease name, "<host>.<pid>".
std::string ownLeaseName();
// The lease `name` (1-200 of [A-Za-z0-9._-], not starting with '.') of host, naming layers: what a chunk server
// writes for a node that reaches the store over HTTP. kInvalidArgument for a bad name.
Status writeLeaseAs(const ChunkStore& store, const std::string& name, const std::string& host,
                    const std::set<LayerRef>& layers);
Status removeLeaseAs(const ChunkStore& store, const std::string& name);

struct LiveLease {
  std::string file;
  std::string host;
  std::vector<LayerRef> layers;
};
// Leases refreshed within kLeaseFreshSeconds.
Result<std::vector<LiveLease>> liveLeases(const ChunkStore& store);

// Removes a layer's manifest (and its prefetch recording); its chunks stay until gc. kConflict naming the host while
// a live lease uses it; kNotFound when the store has no such layer.
Status removeStoredLayer(const ChunkStore& store, const LayerRef& ref);

struct GcReport {
  int64_t chunks_kept = 0;
  int64_t chunks_removed = 0;
  int64_t bytes_removed = 0;
  int64_t chunks_too_new = 0;  // unreferenced but younger than the grace period (a push may be writing them)
};
// Deletes chunks no manifest names and older than grace_seconds (dry_run: counts only). Refused (kConflict) while a
// live lease names a layer the store no longer has, and (kSystem, EIO) while any manifest is unreadable: its chunks
// cannot be told apart from garbage.
Result<GcReport> collectGarbage(const ChunkStore& store, double grace_seconds, bool dry_run);

}  // namespace dsec::fs3
