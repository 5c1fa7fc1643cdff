#include "dsec/launcher/node/ImageSource.h"

namespace dsec::launcher {

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
