#include "dsec/fs3/SharedLayers.h"

#include <sys/stat.h>

#include <ctime>

namespace dsec::fs3 {
namespace {
constexpr size_t kMaxFailuresKept = 64;
}  // namespace

Result<std::unique_ptr<SharedLayers>> SharedLayers::open(const SharedLayersOptions& options) {
  if (options.store_dir.empty()) return Error::invalid("no shared layer store given");
  std::unique_ptr<SharedLayers> shared(new SharedLayers(options));
  struct stat st {};
  if (::stat(shared->store_.dir().c_str(), &st) != 0) return Error::sys(errno, "layer store " + shared->store_.dir());
  if (!S_ISDIR(st.st_mode)) return Error::invalid("layer store " + shared->store_.dir() + " is not a directory");
  shared->cache_ = std::make_shared<ChunkCache>(
      options.cache_dir, options.cache_bytes,
      std::make_shared<StoreChunkSource>(shared->store_.dir(), options.store_retry_seconds));
  DSEC_TRY(shared->cache_->init());
  SharedLayers* raw = shared.get();
  shared->cache_->onFailure([raw](const std::string& chunk, const std::string& what) {
    std::lock_guard lock(raw->mu_);
    if (raw->failures_.size() >= kMaxFailuresKept) raw->failures_.erase(raw->failures_.begin());
    raw->failures_.push_back({chunk, what, static_cast<double>(::time(nullptr))});
  });
  DSEC_ASSIGN_OR_RETURN(shared->fs_, LazyLayerFs::mount(options.mountpoint, shared->cache_));
  return shared;
}

Result<std::string> SharedLayers::fileFor(const LayerRef& ref) {
  DSEC_ASSIGN_OR_RETURN(StoredLayer layer, store_.get(ref));
  return fs_->attach(layer);
}

std::vector<ChunkFailure> SharedLayers::recentFailures() {
  std::lock_guard lock(mu_);
  return failures_;
}

}  // namespace dsec::fs3
