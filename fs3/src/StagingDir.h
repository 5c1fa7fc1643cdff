// A build's private directory <root>/layers/.tmp-<random>/ (internal). It is flock()ed while in use, so a
// store starting up (possibly in another process) removes only those whose builder is gone.
#pragma once

#include <string>
#include <utility>

#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"

namespace dsec::fs3 {

class StagingDir {
 public:
  static Result<StagingDir> create(const std::string& layers_dir);
  StagingDir(StagingDir&& other) noexcept : path_(std::exchange(other.path_, {})), lock_(std::move(other.lock_)) {}
  StagingDir& operator=(StagingDir&&) = delete;
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;
  ~StagingDir();  // removes the tree (unmounting anything left below it) unless it was published

  const std::string& path() const { return path_; }
  // Renames the directory to dest (which must not exist): kAlreadyExists if it does. After this the
  // destructor leaves it alone.
  Status publish(const std::string& dest);

 private:
  StagingDir(std::string path, UniqueFd lock) : path_(std::move(path)), lock_(std::move(lock)) {}
  std::string path_;
  UniqueFd lock_;
};

// Removes every <layers_dir>/.tmp-* left by a crashed build or remove (skips those still locked).
Status removeStaleStagingDirs(const std::string& layers_dir);
// Detaches every mount below dir (and at dir itself if include_dir), deepest first (debootstrap mounts /proc
// and /sys in its target and leaves them there if it is killed).
void detachMountsUnder(const std::string& dir, bool include_dir = true);

}  // namespace dsec::fs3
