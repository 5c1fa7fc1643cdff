#include "StagingDir.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "dsec/common/Directory.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/MountInfo.h"

namespace dsec::fs3 {
namespace {

constexpr const char* kPrefix = ".tmp-";

void fsyncDir(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd) ::fsync(fd.get());
}

std::string parentOf(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos || slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

Result<StagingDir> StagingDir::create(const std::string& layers_dir) {
  for (int attempt = 0; attempt < 8; ++attempt) {
    std::string path = layers_dir + "/" + kPrefix + randomHex(16);
    if (::mkdir(path.c_str(), 0755) != 0) {
      if (errno == EEXIST) continue;
      return Error::sys(errno, "mkdir " + path);
    }
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd) return Error::sys(errno, "open " + path);
    if (::flock(fd.get(), LOCK_EX) != 0) return Error::sys(errno, "flock " + path);
    // A cleaner may have taken the lock between mkdir and flock and removed the dir: then start over.
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) return Error::sys(errno, "fstat " + path);
    if (st.st_nlink == 0) continue;
    return StagingDir(std::move(path), std::move(fd));
  }
  return Error::internal("could not create a staging directory in " + layers_dir);
}

StagingDir::~StagingDir() {
  if (path_.empty()) return;
  // A destructor must not throw (string building and logging can): on failure the directory stays behind and
  // removeStaleStagingDirs() takes it on the next start, as after a crash.
  try {
    detachMountsUnder(path_);
    Status st = removeTree(path_);
    if (!st.ok()) DSEC_LOG(kWarn, "fs3") << "removing staging dir: " << st.error().message();
  } catch (...) {
  }
}

Status StagingDir::publish(const std::string& dest) {
  if (::fsync(lock_.get()) != 0) return Error::sys(errno, "fsync " + path_);  // its entries before its name
  if (::renameat2(AT_FDCWD, path_.c_str(), AT_FDCWD, dest.c_str(), RENAME_NOREPLACE) != 0) {
    int err = errno;
    if (err == EEXIST || err == ENOTEMPTY) return Error(ErrorCode::kAlreadyExists, dest + " already exists", err);
    return Error::sys(err, "rename " + path_ + " to " + dest);
  }
  fsyncDir(parentOf(dest));
  path_.clear();
  lock_.reset();
  return okStatus();
}

Status removeStaleStagingDirs(const std::string& layers_dir) {
  auto entries = listDirectory(layers_dir);
  if (!entries.ok()) return entries.error().code() == ErrorCode::kNotFound ? okStatus() : Status(entries.error());
  std::vector<std::string> stale;
  for (const auto& ent : *entries) {
    if (startsWith(ent.name, kPrefix)) stale.push_back(layers_dir + "/" + ent.name);
  }
  Status result;
  for (const auto& path : stale) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd) continue;                                        // gone already, or not a directory: not ours
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) continue;  // a build in progress (maybe in another process)
    DSEC_LOG(kInfo, "fs3") << "removing stale staging dir " << path;
    detachMountsUnder(path);
    Status st = removeTree(path);
    if (!st.ok() && result.ok()) result = st;
  }
  return result;
}

void detachMountsUnder(const std::string& dir, bool include_dir) {
  auto mounts = mountsUnder(dir);
  if (!mounts.ok() || mounts->empty()) return;
  std::vector<std::string> points;
  for (const auto& m : *mounts) {
    if (include_dir || m.mount_point != dir) points.push_back(m.mount_point);
  }
  std::sort(points.begin(), points.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
  for (const auto& p : points) {
    if (::umount2(p.c_str(), MNT_DETACH) != 0 && errno != EINVAL && errno != ENOENT) {
      DSEC_LOG(kWarn, "fs3") << "umount " << p << ": " << strerror(errno);
    }
  }
}

}  // namespace dsec::fs3
