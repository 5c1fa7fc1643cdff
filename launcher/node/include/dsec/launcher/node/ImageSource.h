// Where a node's sandboxes get their root layers. LayerImageSource is the real one: the node's layer store
// (fs3::LayerStore) and the EROFS mounts over it (fs3::LayerMounter). InMemoryImageSource mounts nothing: the
// images of simulated nodes (whose sandboxes run no processes) and of tests of the node core.
#pragma once

#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "dsec/common/Result.h"
#include "dsec/fs3/LayerMounter.h"
#include "dsec/fs3/LayerStore.h"

namespace dsec::launcher {

struct LayerStatus {
  fs3::LayerManifest manifest;
  bool mounted = false;
  int refs = 0;  // sandboxes (and fncall workers) holding it
};

class ImageSource {
 public:
  virtual ~ImageSource() = default;
  // kNotFound naming the first missing layer; cheap, called before anything is booked for a create.
  virtual Status check(const std::vector<fs3::LayerRef>& layers) = 0;
  // The image's layer directories (bottom first), held until the handle is dropped.
  virtual Result<std::unique_ptr<fs3::ImageMount>> acquire(const std::vector<fs3::LayerRef>& layers) = 0;
  // After a restart, once adopted sandboxes hold their images again: drops what nobody holds.
  virtual Status releaseUnused() = 0;
  virtual Result<std::vector<LayerStatus>> layers() = 0;
  virtual int64_t mountedLayers() = 0;
  // A layer from an EROFS image made elsewhere (a container snapshot); kAlreadyExists if it is there.
  virtual Status importLayer(const fs3::LayerRef& ref, const std::string& image, const std::string& built_on,
                             const std::string& source) = 0;
  // Removes a layer: kConflict while a sandbox holds it, kNotFound if missing.
  virtual Status removeLayer(const fs3::LayerRef& ref) = 0;
};

class LayerImageSource : public ImageSource {
 public:
  explicit LayerImageSource(const std::string& root) : store_(root), mounter_(&store_) {}
  Status check(const std::vector<fs3::LayerRef>& layers) override { return store_.checkImage(layers); }
  Result<std::unique_ptr<fs3::ImageMount>> acquire(const std::vector<fs3::LayerRef>& layers) override {
    return mounter_.acquire(layers);
  }
  Status releaseUnused() override { return mounter_.unmountUnused(); }
  Result<std::vector<LayerStatus>> layers() override;
  int64_t mountedLayers() override;
  Status importLayer(const fs3::LayerRef& ref, const std::string& image, const std::string& built_on,
                     const std::string& source) override;
  Status removeLayer(const fs3::LayerRef& ref) override;

 private:
  fs3::LayerStore store_;
  fs3::LayerMounter mounter_;  // after the store it mounts from
};

class InMemoryImageSource : public ImageSource {
 public:
  // Every image exists unless `known_layers` ("name:version") is given; then only those do.
  explicit InMemoryImageSource(std::set<std::string> known_layers = {}) : known_(std::move(known_layers)) {}
  Status check(const std::vector<fs3::LayerRef>& layers) override;
  Result<std::unique_ptr<fs3::ImageMount>> acquire(const std::vector<fs3::LayerRef>& layers) override;
  Status releaseUnused() override { return okStatus(); }
  Result<std::vector<LayerStatus>> layers() override { return std::vector<LayerStatus>{}; }
  int64_t mountedLayers() override { return 0; }
  Status importLayer(const fs3::LayerRef& ref, const std::string& image, const std::string& built_on,
                     const std::string& source) override;
  Status removeLayer(const fs3::LayerRef& ref) override;

 private:
  std::mutex mu_;
  std::set<std::string> known_;
};

}  // namespace dsec::launcher
