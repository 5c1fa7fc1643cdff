// Where a node's sandboxes get their root layers. LayerImageSource is the real one: the node's layer store
// (fs3::LayerStore) and the EROFS mounts over it (fs3::LayerMounter). InMemoryImageSource mounts nothing: the
// images of simulated nodes (whose sandboxes run no processes) and of tests of the node core.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dsec/common/Result.h"
#include "dsec/fs3/LayerMounter.h"
#include "dsec/fs3/LayerStore.h"
#include "dsec/fs3/SharedLayers.h"

namespace dsec::launcher {

struct LayerStatus {
  fs3::LayerManifest manifest;
  bool mounted = false;
  int refs = 0;  // sandboxes (and fncall workers) holding it
};

// The cluster's shared layer store as this node uses it (docs/layer-store.md): GET /v1/node "layer_store".
struct SharedStoreInfo {
  std::string store;
  std::string error;  // why the node cannot use it ("" when it does)
  fs3::ChunkCacheStats cache;
  int64_t cache_capacity_bytes = 0;
  std::vector<fs3::ChunkFailure> failures;  // newest chunk failures (corrupt, or the store stayed away)
  fs3::PrefetchStats prefetch;
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
  // The shared store layers come from when the node's store lacks them; nullopt when the node has none.
  virtual std::optional<SharedStoreInfo> sharedStore() = 0;
};

class LayerImageSource : public ImageSource {
 public:
  explicit LayerImageSource(const std::string& root) : store_(root), mounter_(&store_) {}
  ~LayerImageSource() override;
  // Layers the node's store lacks come from the cluster's shared store, read on demand. A failure (no FUSE, the
  // store unreadable) is returned and stays visible in sharedStore().error. store: how the node reaches it (null:
  // the directory options.store_dir).
  Status useSharedStore(const fs3::SharedLayersOptions& options, std::shared_ptr<fs3::SharedStore> store = nullptr);
  Status check(const std::vector<fs3::LayerRef>& layers) override;
  Result<std::unique_ptr<fs3::ImageMount>> acquire(const std::vector<fs3::LayerRef>& layers) override {
    return mounter_.acquire(layers);
  }
  Status releaseUnused() override { return mounter_.unmountUnused(); }
  Result<std::vector<LayerStatus>> layers() override;
  int64_t mountedLayers() override;
  Status importLayer(const fs3::LayerRef& ref, const std::string& image, const std::string& built_on,
                     const std::string& source) override;
  Status removeLayer(const fs3::LayerRef& ref) override;
  std::optional<SharedStoreInfo> sharedStore() override;

 private:
  fs3::LayerStore store_;
  fs3::LayerMounter mounter_;  // after the store it mounts from
  // Made after the mounter, and torn down before it goes (the destructor unmounts the layers first).
  std::unique_ptr<fs3::SharedLayers> shared_;
  fs3::SharedLayersOptions shared_options_;
  std::string shared_error_;
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
  std::optional<SharedStoreInfo> sharedStore() override { return std::nullopt; }

 private:
  std::mutex mu_;
  std::set<std::string> known_;
};

}  // namespace dsec::launcher
