#include "dsec/fs3/LayerMounter.h"

#include <linux/magic.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>

#include "dsec/common/Fault.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/MountInfo.h"
#include "dsec/fs3/SharedLayers.h"

namespace dsec::fs3 {
namespace {

constexpr unsigned long kLayerMountFlags = MS_RDONLY | MS_NODEV | MS_NOSUID;

std::string parentOf(const std::string& path) { return path.substr(0, path.rfind('/')); }

// Unmounts dir (lazily if something still uses it); ok if nothing was mounted there.
Status unmountDir(const std::string& dir) {
  if (::umount2(dir.c_str(), UMOUNT_NOFOLLOW) == 0) return okStatus();
  int err = errno;
  if (err == EINVAL || err == ENOENT) return okStatus();  // not a mount point (any more)
  if (err == EBUSY && ::umount2(dir.c_str(), MNT_DETACH | UMOUNT_NOFOLLOW) == 0) return okStatus();
  return Error::sys(errno, "umount " + dir);
}

// Removes a layer's mount point and its NAME dir if that became empty.
void removeMountDirs(const std::string& dir) {
  ::rmdir(dir.c_str());
  ::rmdir(parentOf(dir).c_str());
}

}  // namespace

std::vector<std::string> ImageMount::files() const {
  std::vector<std::string> out;
  if (mounter_ == nullptr) return out;
  for (const auto& ref : layers_) out.push_back(mounter_->fileOf(ref));
  return out;
}

ImageMount::~ImageMount() {
  if (mounter_ != nullptr) mounter_->release(layers_);
}

LayerMounter::LayerMounter(LayerStore* store) : store_(store), mount_root_(store->root() + "/mnt") {}

LayerMounter::~LayerMounter() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [ref, count] : refs_) {
    DSEC_LOG(kWarn, "fs3") << "layer " << ref.toString() << " still has " << count
                           << " reference(s) when the mounter goes away; unmounting it";
    Status st = unmountLayer(ref);
    if (!st.ok()) DSEC_LOG(kWarn, "fs3") << st.error().message();
  }
  refs_.clear();
  if (!mount_root_ready_) return;
  // Drop the private bind of <root>/mnt if nothing (e.g. another process's layers) is mounted below it.
  auto mounts = mountsUnder(mount_root_);
  if (mounts.ok() &&
      std::all_of(mounts->begin(), mounts->end(), [&](const MountEntry& m) { return m.mount_point == mount_root_; })) {
    for (size_t i = 0; i < mounts->size(); ++i) ::umount2(mount_root_.c_str(), MNT_DETACH | UMOUNT_NOFOLLOW);
  }
}

std::string LayerMounter::mountPoint(const LayerRef& ref) const { return store_->mountDir(ref); }

int LayerMounter::refCount(const LayerRef& ref) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = refs_.find(ref);
  return it == refs_.end() ? 0 : it->second;
}

bool LayerMounter::isMounted(const LayerRef& ref) const { return refCount(ref) > 0; }

std::string LayerMounter::fileOf(const LayerRef& ref) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = files_.find(ref);
  return it != files_.end() ? it->second : store_->imagePath(ref);
}

void LayerMounter::setSharedLayers(SharedLayers* shared) {
  std::lock_guard<std::mutex> lock(mu_);
  shared_ = shared;
}

bool LayerMounter::available(const LayerRef& ref) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (refs_.count(ref) != 0) return true;  // mounted: every create of a busy image stops here
  }
  if (store_->exists(ref)) return true;
  std::lock_guard<std::mutex> lock(mu_);
  return shared_ != nullptr && shared_->has(ref);
}

Status LayerMounter::mountShared(const LayerRef& ref) {
  DSEC_ASSIGN_OR_RETURN(std::string file, shared_->fileFor(ref));
  return mountLayer(ref, file, true);
}

Result<std::unique_ptr<ImageMount>> LayerMounter::acquire(const std::vector<LayerRef>& layers) {
  if (layers.empty()) return Error::invalid("image has no layers");
  std::vector<std::string> dirs;
  dirs.reserve(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (layers[j] == layers[i]) {
        return Error::invalid("image " + imageToString(layers) + " lists layer " + layers[i].toString() + " twice");
      }
    }
    dirs.push_back(mountPoint(layers[i]));
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerRef& ref = layers[i];
    auto it = refs_.find(ref);
    if (it != refs_.end()) {
      ++it->second;
      continue;
    }
    // The node's own copy if it has one, else the shared store's, read on demand.
    Status st = store_->exists(ref) ? mountLayer(ref, store_->imagePath(ref), false)
                : shared_ != nullptr && shared_->has(ref)
                    ? mountShared(ref)
                    : Error::notFound("layer " + ref.toString() + " of image " + imageToString(layers) + " not found");
    if (!st.ok()) {
      for (size_t j = 0; j < i; ++j) dropRef(layers[j]);
      return st.error();
    }
    refs_.emplace(ref, 1);
  }
  return std::make_unique<ImageMount>(this, layers, std::move(dirs));
}

void LayerMounter::release(const std::vector<LayerRef>& layers) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& ref : layers) dropRef(ref);
}

void LayerMounter::dropRef(const LayerRef& ref) {
  auto it = refs_.find(ref);
  if (it == refs_.end()) {
    DSEC_LOG(kError, "fs3") << "release of layer " << ref.toString() << " that holds no reference";
    return;
  }
  if (--it->second > 0) return;
  refs_.erase(it);
  Status st = unmountLayer(ref);
  if (!st.ok()) DSEC_LOG(kWarn, "fs3") << "unmounting layer " << ref.toString() << ": " << st.error().message();
}

Status LayerMounter::ensureMountRoot() {
  if (mount_root_ready_) return okStatus();
  DSEC_TRY(makeDirs(mount_root_, 0755));
  DSEC_ASSIGN_OR_RETURN(auto mounts, mountsUnder(mount_root_));
  bool bound =
      std::any_of(mounts.begin(), mounts.end(), [&](const MountEntry& m) { return m.mount_point == mount_root_; });
  if (!bound) {
    if (::mount(mount_root_.c_str(), mount_root_.c_str(), nullptr, MS_BIND, nullptr) != 0) {
      return Error::sys(errno, "bind mount " + mount_root_);
    }
  }
  // Also when it was bound already (by an earlier agent): making it private again is harmless.
  if (::mount(nullptr, mount_root_.c_str(), nullptr, MS_PRIVATE, nullptr) != 0) {
    int err = errno;
    if (!bound) ::umount2(mount_root_.c_str(), MNT_DETACH);
    return Error::sys(err, "make " + mount_root_ + " a private mount");
  }
  mount_root_ready_ = true;
  return okStatus();
}

Status LayerMounter::mountLayer(const LayerRef& ref, const std::string& image, bool on_demand) {
  std::string dir = mountPoint(ref);
  DSEC_TRY(ensureMountRoot());
  DSEC_TRY(makeDirs(dir, 0755));
  // Mounted already (left by an agent that restarted)? Then a different device shows at the mount point.
  struct stat here {};
  struct stat parent {};
  if (::stat(dir.c_str(), &here) == 0 && ::stat(parentOf(dir).c_str(), &parent) == 0 && here.st_dev != parent.st_dev) {
    struct statfs fs {};
    if (::statfs(dir.c_str(), &fs) == 0 && fs.f_type == EROFS_SUPER_MAGIC_V1 && !on_demand) {
      DSEC_LOG(kInfo, "fs3") << "reusing existing mount of layer " << ref.toString() << " at " << dir;
      files_[ref] = image;
      return okStatus();
    }
    if (!on_demand || fs.f_type != EROFS_SUPER_MAGIC_V1) {
      return Error(ErrorCode::kConflict, "something other than EROFS is mounted at " + dir);
    }
    // An on-demand layer left by an earlier agent reads through that agent's FUSE files, gone with it: mount anew.
    DSEC_TRY(unmountDir(dir));
    DSEC_TRY(makeDirs(dir, 0755));
  }
  Status fault = checkFault("fs3.mount_layer");
  if (!fault.ok()) {
    removeMountDirs(dir);
    return fault;
  }
  if (::mount(image.c_str(), dir.c_str(), "erofs", kLayerMountFlags, nullptr) != 0) {
    int err = errno;
    removeMountDirs(dir);
    if (err == ENODEV || err == ENOTBLK) {
      return Error(ErrorCode::kUnsupported,
                   "mounting layer " + ref.toString() +
                       ": this kernel cannot mount EROFS images from regular files "
                       "(CONFIG_EROFS_FS_BACKED_BY_FILE): " +
                       Error::sys(err, "mount").message(),
                   err);
    }
    return Error::sys(err, "mounting layer " + ref.toString() + ": mount -t erofs " + image + " " + dir);
  }
  files_[ref] = image;
  return okStatus();
}

Status LayerMounter::unmountLayer(const LayerRef& ref) {
  files_.erase(ref);
  std::string dir = mountPoint(ref);
  DSEC_TRY(unmountDir(dir));
  removeMountDirs(dir);
  return okStatus();
}

Status LayerMounter::unmountUnused() {
  std::lock_guard<std::mutex> lock(mu_);
  DSEC_ASSIGN_OR_RETURN(auto mounts, mountsUnder(mount_root_));
  std::vector<std::string> stale;
  for (const auto& m : mounts) {
    if (m.mount_point == mount_root_) continue;
    // <root>/mnt/NAME/VERSION of a layer we hold stays; anything else under <root>/mnt goes.
    std::string rel = m.mount_point.substr(mount_root_.size() + 1);
    auto slash = rel.find('/');
    if (slash != std::string::npos) {
      LayerRef ref{rel.substr(0, slash), rel.substr(slash + 1)};
      if (refs_.count(ref) != 0) continue;
    }
    stale.push_back(m.mount_point);
  }
  std::sort(stale.begin(), stale.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
  Status result;
  for (const auto& dir : stale) {
    DSEC_LOG(kInfo, "fs3") << "unmounting unused layer mount " << dir;
    Status st = unmountDir(dir);
    if (st.ok()) {
      removeMountDirs(dir);
    } else if (result.ok()) {
      result = st;
    }
  }
  return result;
}

}  // namespace dsec::fs3
