// The node's layer store: immutable EROFS images with manifests under <root>/layers/NAME/VERSION/.
//   layer.erofs     the image (mkfs.erofs of a directory tree; overlay whiteouts and xattrs kept)
//   manifest.json   {"name","version","sha256","size","created","built_on","source"}
// A NAME:VERSION, once built, is never rebuilt or changed (kAlreadyExists); removing it is explicit.
// Builds happen in <root>/layers/.tmp-*/ and are renamed into place, so a layer directory, once visible, is
// complete; the store's layers are mounted by LayerMounter at <root>/mnt/NAME/VERSION.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dsec/common/Result.h"
#include "dsec/fs3/LayerRef.h"

namespace dsec::fs3 {

struct LayerManifest {
  LayerRef ref;
  std::string sha256;    // of layer.erofs
  int64_t size = 0;      // bytes of layer.erofs
  std::string created;   // RFC 3339 UTC
  std::string built_on;  // image it was built on ("" for a base layer)
  std::string source;    // how: "dir:/path", "debootstrap:bookworm", "run:<cmd>"

  // {"name","version","sha256","size","created","built_on","source"}: manifest.json, `layer ls --json`, the API.
  nlohmann::json toJson() const;
};

class StagingDir;

class LayerStore {
 public:
  // root e.g. /var/lib/dsec (made absolute); layers live in root/layers. Cheap: no system calls.
  explicit LayerStore(std::string root);

  // Creates root and root/layers (0755) if missing, checks they are directories, and removes staging dirs
  // left by builds that crashed (not those of builds still running, even in another process). Call once at
  // start; the other methods work without it.
  Status init();

  const std::string& root() const { return root_; }

  // What a build is doing, for a progress display: step() as each stage starts (debootstrap, copying, packing the
  // image, publishing), detail() for a stage's own progress lines (debootstrap's "Retrieving ...").
  struct BuildProgress {
    std::function<void(const std::string& step)> step;
    std::function<void(std::string_view detail)> detail;
  };
  void setBuildProgress(BuildProgress progress) { progress_ = std::move(progress); }
  std::string layerDir(const LayerRef& ref) const;
  std::string imagePath(const LayerRef& ref) const;  // .../layer.erofs
  std::string mountDir(const LayerRef& ref) const;   // <root>/mnt/NAME/VERSION (where LayerMounter mounts it)

  // Builds NAME:VERSION from a directory tree with mkfs.erofs (atomically: a half-built layer is never
  // visible, and a failure leaves nothing). kAlreadyExists if the layer exists; kInvalidArgument if dir is
  // not a directory.
  Result<LayerManifest> buildFromDir(const LayerRef& ref, const std::string& dir, const std::string& built_on,
                                     const std::string& source);
  // NAME:VERSION from an EROFS image made elsewhere (a container snapshot's upper.erofs): copied into the store and
  // published like a build (atomically; kAlreadyExists if the layer exists). image is only read.
  Result<LayerManifest> importImage(const LayerRef& ref, const std::string& image, const std::string& built_on,
                                    const std::string& source);
  // NAME:VERSION (m.ref) with manifest m, its image written by write_image into an empty file (sized m.size)
  // of a private staging dir, then published atomically. The writer vouches for m.sha256: it checked what it
  // wrote (a pull checks every chunk against its hash). kAlreadyExists if the layer exists.
  Result<LayerManifest> installImage(const LayerManifest& m, const std::function<Status(int fd)>& write_image);
  // The tree a build will capture, and an empty private scratch directory next to it (removed afterwards).
  using PrepareTree = std::function<Status(const std::string& tree, const std::string& scratch_dir)>;
  // As buildFromDir, but from a copy of dir (cp -a: ownership, modes, times, xattrs, hard links, special files)
  // in the build's staging directory, which `prepare` changes first (e.g. scrubGitRepositories). dir is only
  // read; the copy costs its size on the store's disk until the image is made.
  Result<LayerManifest> buildFromCopyOfDir(const LayerRef& ref, const std::string& dir, const std::string& source,
                                           const PrepareTree& prepare);
  // debootstrap --variant=minbase SUITE into a temp dir (mirror from the host's apt sources unless given),
  // then as buildFromDir with source "debootstrap:SUITE". The temp tree is always removed.
  Result<LayerManifest> buildDebootstrap(const LayerRef& ref, const std::string& suite, const std::string& mirror = "");

  Result<LayerManifest> get(const LayerRef& ref) const;  // kNotFound with the name if missing
  bool exists(const LayerRef& ref) const;
  // Every layer, sorted by name then version.
  Result<std::vector<LayerManifest>> list() const;
  // Deletes the layer (atomically: renamed away first). kNotFound if missing; kConflict while it is mounted
  // at mountDir() (the node agent should also check LayerMounter::refCount before calling).
  Status remove(const LayerRef& ref);
  // Checks every layer of an image exists; kNotFound naming the first missing one.
  Status checkImage(const std::vector<LayerRef>& layers) const;

 private:
  std::string layersDir() const { return root_ + "/layers"; }
  // Packs tree into the staging dir's image (tree "": the image is there already) and publishes it.
  Result<LayerManifest> publish(const LayerRef& ref, StagingDir& staging, const std::string& tree,
                                const std::string& built_on, const std::string& source);
  // Renames a finished staging dir to the layer's dir (kAlreadyExists, named, if another got there first).
  Status moveIntoPlace(const LayerRef& ref, StagingDir& staging);

  void reportStep(const std::string& step) const {
    if (progress_.step) progress_.step(step);
  }

  std::string root_;
  BuildProgress progress_;
};

}  // namespace dsec::fs3
