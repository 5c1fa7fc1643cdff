#include "dsec/launcher/node/ImageSource.h"

#include "dsec/common/Logging.h"

namespace dsec::launcher {

LayerImageSource::~LayerImageSource() {
  // Layers mounted from the shared store's FUSE files go before the FUSE file system does.
  (void)mounter_.unmountUnused();
  mounter_.setSharedLayers(nullptr);
  shared_.reset();
}

Status LayerImageSource::useSharedStore(const fs3::SharedLayersOptions& options,
                                        std::shared_ptr<fs3::SharedStore> store) {
  shared_options_ = options;
  auto shared = fs3::SharedLayers::open(options, std::move(store));
  if (!shared.ok()) {
    shared_error_ = shared.error().message();
    DSEC_LOG(kError, "fs3") << "shared layer store " << options.store_dir << " unusable: " << shared_error_;
    return shared.error();
  }
  shared_ = std::move(shared).value();
  mounter_.setSharedLayers(shared_.get());
  DSEC_LOG(kInfo, "fs3") << "layers missing here come from the shared store " << options.store_dir
                         << " on demand (chunk cache " << options.cache_dir << ")";
  return okStatus();
}

Status LayerImageSource::check(const std::vector<fs3::LayerRef>& layers) {
  if (layers.empty()) return Error::invalid("image has no layers");
  for (const auto& l : layers) {
    DSEC_TRY(fs3::validateLayerRef(l));
    if (!mounter_.available(l)) {
      return Error::notFound("layer " + l.toString() + " of image " + fs3::imageToString(layers) + " not found" +
                             (shared_ ? " here or in the shared store " + shared_options_.store_dir : "") +
                             " (build it with `dsec layer build " + l.toString() + " ...`)");
    }
  }
  return okStatus();
}

std::optional<SharedStoreInfo> LayerImageSource::sharedStore() {
  if (shared_options_.store_dir.empty()) return std::nullopt;
  SharedStoreInfo info;
  info.store = shared_options_.store_dir;
  info.error = shared_error_;
  info.cache_capacity_bytes = shared_options_.cache_bytes;
  if (shared_) {
    info.cache = shared_->cacheStats();
    info.failures = shared_->recentFailures();
    info.prefetch = shared_->prefetchStats();
  }
  return info;
}

Result<std::vector<LayerStatus>> LayerImageSource::layers() {
  DSEC_ASSIGN_OR_RETURN(auto manifests, store_.list());
  std::vector<LayerStatus> out;
  for (auto& m : manifests) {
    bool mounted = mounter_.isMounted(m.ref);
    int refs = mounter_.refCount(m.ref);
    out.push_back({std::move(m), mounted, refs});
  }
  return out;
}

int64_t LayerImageSource::mountedLayers() {
  int64_t mounts = 0;
  if (auto manifests = store_.list(); manifests.ok()) {
    for (const auto& m : *manifests) mounts += mounter_.isMounted(m.ref) ? 1 : 0;
  }
  return mounts;
}

Status LayerImageSource::importLayer(const fs3::LayerRef& ref, const std::string& image, const std::string& built_on,
                                     const std::string& source) {
  auto made = store_.importImage(ref, image, built_on, source);
  if (!made.ok()) return made.error();
  return okStatus();
}

Status LayerImageSource::removeLayer(const fs3::LayerRef& ref) {
  if (mounter_.refCount(ref) > 0) {
    return Error(ErrorCode::kConflict, "layer " + ref.toString() + " is in use by sandboxes of this node");
  }
  return store_.remove(ref);
}

Status InMemoryImageSource::importLayer(const fs3::LayerRef& ref, const std::string& /*image*/,
                                        const std::string& /*built_on*/, const std::string& /*source*/) {
  std::lock_guard lock(mu_);
  if (known_.empty()) return okStatus();  // every image exists
  if (!known_.insert(ref.toString()).second) {
    return Error(ErrorCode::kAlreadyExists, "layer " + ref.toString() + " exists");
  }
  return okStatus();
}

Status InMemoryImageSource::removeLayer(const fs3::LayerRef& ref) {
  std::lock_guard lock(mu_);
  if (!known_.empty() && known_.erase(ref.toString()) == 0) {
    return Error::notFound("layer " + ref.toString() + " not found");
  }
  return okStatus();
}

Status InMemoryImageSource::check(const std::vector<fs3::LayerRef>& layers) {
  std::lock_guard lock(mu_);
  if (known_.empty()) return okStatus();
  for (const auto& ref : layers) {
    if (!known_.count(ref.toString())) return Error::notFound("layer " + ref.toString() + " not found");
  }
  return okStatus();
}

Result<std::unique_ptr<fs3::ImageMount>> InMemoryImageSource::acquire(const std::vector<fs3::LayerRef>& layers) {
  // No mounter: the handle holds nothing and has no directories (callers check() first, as for the real one).
  return std::make_unique<fs3::ImageMount>(nullptr, layers, std::vector<std::string>{});
}

}  // namespace dsec::launcher
