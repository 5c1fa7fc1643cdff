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

Status InMemoryImageSource::check(const std::vector<fs3::LayerRef>& layers) {
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
