// Mounts each layer once per node (file-backed EROFS, read-only) at <root>/mnt/NAME/VERSION and shares the
// mount among every sandbox that uses it. Reference-counted: the last release unmounts it.
// <root>/mnt is made a private bind mount of itself, so layer mounts (and unmounts) never propagate into
// sandbox mount namespaces created from the host's; a sandbox's overlay keeps its own private clones of the
// lower mounts, so unmounting a layer here never breaks a running sandbox.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dsec/common/Result.h"
#include "dsec/fs3/LayerRef.h"
#include "dsec/fs3/LayerStore.h"

namespace dsec::fs3 {

class LayerMounter;
class SharedLayers;

// Holds one reference on each layer of an image; releasing (destruction) drops them.
class ImageMount {
 public:
  ImageMount(LayerMounter* mounter, std::vector<LayerRef> layers, std::vector<std::string> dirs)
      : mounter_(mounter), layers_(std::move(layers)), dirs_(std::move(dirs)) {}
  ImageMount(const ImageMount&) = delete;
  ImageMount& operator=(const ImageMount&) = delete;
  ~ImageMount();
  const std::vector<LayerRef>& layers() const { return layers_; }
  // Mount points, bottom first (overlay wants them top first in lowerdir=).
  const std::vector<std::string>& dirs() const { return dirs_; }
  // The layers' EROFS files, bottom first (machine backends attach them as disks); empty without a mounter.
  std::vector<std::string> files() const;

 private:
  LayerMounter* mounter_;
  std::vector<LayerRef> layers_;
  std::vector<std::string> dirs_;
};

// Thread-safe. Must outlive every ImageMount it hands out.
class LayerMounter {
 public:
  explicit LayerMounter(LayerStore* store);
  ~LayerMounter();  // unmounts whatever is still mounted (leaked references are logged)

  // Mounts (or reuses) every layer of the image and takes a reference on each. kNotFound naming a missing
  // layer; kUnsupported if the kernel cannot mount EROFS from files; kInvalidArgument for an empty image or
  // a layer listed twice. On failure, references taken so far are dropped (and mounts made, unmounted).
  // When every layer is mounted already this is a map lookup under a mutex: no system calls.
  Result<std::unique_ptr<ImageMount>> acquire(const std::vector<LayerRef>& layers);
  int refCount(const LayerRef& ref) const;
  // Layers the node's store lacks are mounted from the cluster's shared store, on demand (nullptr: none). The
  // shared layers must outlive every mount made from them.
  void setSharedLayers(SharedLayers* shared);
  // In the node's store, or in the shared one.
  bool available(const LayerRef& ref) const;
  // The file a mounted layer's EROFS comes from (its image in the node's store, or its on-demand file).
  std::string fileOf(const LayerRef& ref) const;
  bool isMounted(const LayerRef& ref) const;
  std::string mountPoint(const LayerRef& ref) const;
  // Unmounts stale layer mounts left under <root>/mnt by an earlier process that are not referenced now
  // (after an agent restart, call once adopted sandboxes have re-acquired their images).
  Status unmountUnused();

 private:
  friend class ImageMount;
  void release(const std::vector<LayerRef>& layers);
  // The rest run with mu_ held.
  Status ensureMountRoot();
  Status mountLayer(const LayerRef& ref, const std::string& image, bool on_demand);
  Status mountShared(const LayerRef& ref);
  Status unmountLayer(const LayerRef& ref);
  void dropRef(const LayerRef& ref);

  LayerStore* store_;
  std::string mount_root_;  // <root>/mnt
  mutable std::mutex mu_;
  bool mount_root_ready_ = false;
  std::map<LayerRef, int> refs_;           // only layers with a reference (> 0) are in here
  std::map<LayerRef, std::string> files_;  // what each mounted layer's EROFS was mounted from
  SharedLayers* shared_ = nullptr;
};

}  // namespace dsec::fs3
