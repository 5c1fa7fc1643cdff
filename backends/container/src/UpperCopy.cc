#include "UpperCopy.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <string_view>
#include <vector>

#include "dsec/common/Fd.h"

namespace dsec::backends {
namespace {

constexpr uint32_t kIdsPerSandbox = 65536;  // a sandbox's host id range (UserNamespace.h)
constexpr std::string_view kOpaqueXattr = "user.overlay.opaque";
constexpr std::string_view kOverlayPrefix = "user.overlay.";
constexpr std::string_view kUserPrefix = "user.";

struct DirCloser {
  void operator()(DIR* d) const { closedir(d); }
};

class Copier {
 public:
  Copier(std::optional<uint32_t> id_base, const UpperCopyLimits& limits) : id_base_(id_base), limits_(limits) {}

  Status copyDir(int src_dir, int dst_dir, const std::string& rel, int depth) {
    if (depth > limits_.max_depth) {
      return Error(ErrorCode::kInvalidArgument,
                   "the upper is nested deeper than " + std::to_string(limits_.max_depth) + " directories at /" + rel);
    }
    int fd = ::openat(src_dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return Error::sys(errno, "open /" + rel + " in the upper");
    std::unique_ptr<DIR, DirCloser> dir(::fdopendir(fd));
    if (!dir) {
      int err = errno;
      ::close(fd);
      return Error::sys(err, "read /" + rel + " in the upper");
    }
    while (true) {
      errno = 0;
      dirent* e = ::readdir(dir.get());
      if (e == nullptr) {
        if (errno != 0) return Error::sys(errno, "read /" + rel + " in the upper");
        break;
      }
      std::string_view name = e->d_name;
      if (name == "." || name == "..") continue;
      DSEC_TRY(copyEntry(::dirfd(dir.get()), dst_dir, e->d_name,
                         rel.empty() ? std::string(name) : rel + "/" + e->d_name, depth));
    }
    return okStatus();
  }

  UpperCopyStats stats() const { return stats_; }

 private:
  Status count(int64_t bytes, const std::string& rel) {
    if (++stats_.entries > limits_.max_entries) {
      return Error(ErrorCode::kInvalidArgument,
                   "the upper holds more than " + std::to_string(limits_.max_entries) + " files (at /" + rel + ")");
    }
    stats_.bytes += bytes;
    if (stats_.bytes > limits_.max_bytes) {
      return Error(ErrorCode::kInvalidArgument,
                   "the upper holds more than " + std::to_string(limits_.max_bytes) + " bytes (at /" + rel + ")");
    }
    return okStatus();
  }

  Result<uint32_t> shiftId(uint32_t id, const std::string& rel) const {
    if (!id_base_) return id;
    if (id < *id_base_ || id - *id_base_ >= kIdsPerSandbox) {
      return Error(ErrorCode::kInvalidArgument, "/" + rel + " in the upper has an owner outside the sandbox's ids");
    }
    return id - *id_base_;
  }

  Status setOwner(int dst_dir, const char* name, int fd, const struct stat& st, const std::string& rel) {
    DSEC_ASSIGN_OR_RETURN(uint32_t uid, shiftId(st.st_uid, rel));
    DSEC_ASSIGN_OR_RETURN(uint32_t gid, shiftId(st.st_gid, rel));
    int rc = fd >= 0 ? ::fchown(fd, uid, gid) : ::fchownat(dst_dir, name, uid, gid, AT_SYMLINK_NOFOLLOW);
    if (rc != 0) return Error::sys(errno, "chown /" + rel + " in the copy");
    return okStatus();
  }

  // The mode (after chown, which clears set-id bits) and the times.
  static Status setModeAndTimes(int fd, const struct stat& st, const std::string& rel) {
    if (::fchmod(fd, st.st_mode & 07777) != 0) return Error::sys(errno, "chmod /" + rel + " in the copy");
    const timespec times[2] = {st.st_atim, st.st_mtim};
    if (::futimens(fd, times) != 0) return Error::sys(errno, "set times of /" + rel + " in the copy");
    return okStatus();
  }

  // user.overlay.opaque "y" and the user's own user.* xattrs; nothing else.
  static Status copyXattrs(int src, int dst, const std::string& rel) {
    std::vector<char> names(size_t{64} << 10);
    ssize_t n = ::flistxattr(src, names.data(), names.size());
    if (n < 0 && (errno == ENOTSUP || errno == EOPNOTSUPP)) return okStatus();
    if (n < 0) return Error::sys(errno, "list xattrs of /" + rel + " in the upper");
    std::vector<char> value(size_t{64} << 10);
    for (ssize_t off = 0; off < n;) {
      std::string name(names.data() + off);
      off += static_cast<ssize_t>(name.size()) + 1;
      const bool opaque = name == kOpaqueXattr;
      if (!opaque && (name.rfind(kOverlayPrefix, 0) == 0 || name.rfind(kUserPrefix, 0) != 0)) continue;
      ssize_t len = ::fgetxattr(src, name.c_str(), value.data(), value.size());
      if (len < 0 && errno == ENODATA) continue;
      if (len < 0) return Error::sys(errno, "read xattr " + name + " of /" + rel + " in the upper");
      if (opaque && (len != 1 || value[0] != 'y')) continue;
      if (::fsetxattr(dst, name.c_str(), value.data(), static_cast<size_t>(len), 0) != 0) {
        return Error::sys(errno, "set xattr " + name + " of /" + rel + " in the copy");
      }
    }
    return okStatus();
  }

  Status copyEntry(int src_dir, int dst_dir, const char* name, const std::string& rel, int depth) {
    struct stat st {};
    if (::fstatat(src_dir, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return Error::sys(errno, "stat /" + rel);
    switch (st.st_mode & S_IFMT) {
      case S_IFDIR:
        return copyDirEntry(src_dir, dst_dir, name, rel, depth, st);
      case S_IFREG:
        return copyFile(src_dir, dst_dir, name, rel, st);
      case S_IFLNK:
        return copySymlink(src_dir, dst_dir, name, rel, st);
      case S_IFCHR:
        if (st.st_rdev != makedev(0, 0)) break;
        [[fallthrough]];  // an overlay whiteout
      case S_IFIFO: {
        DSEC_TRY(count(0, rel));
        if (::mknodat(dst_dir, name, st.st_mode & (S_IFMT | 0777), st.st_rdev) != 0) {
          return Error::sys(errno, "make /" + rel + " in the copy");
        }
        DSEC_TRY(setOwner(dst_dir, name, -1, st, rel));
        const timespec times[2] = {st.st_atim, st.st_mtim};
        (void)::utimensat(dst_dir, name, times, AT_SYMLINK_NOFOLLOW);
        return okStatus();
      }
      case S_IFSOCK:
        return okStatus();  // a socket is nothing without its listener
      default:
        break;
    }
    return Error(ErrorCode::kInvalidArgument,
                 "/" + rel + " in the upper is a device node (only overlay whiteouts are carried)");
  }

  Status copyDirEntry(int src_dir, int dst_dir, const char* name, const std::string& rel, int depth,
                      const struct stat& st) {
    DSEC_TRY(count(0, rel));
    UniqueFd src(::openat(src_dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!src) return Error::sys(errno, "open /" + rel + " in the upper");
    if (::mkdirat(dst_dir, name, 0700) != 0) return Error::sys(errno, "mkdir /" + rel + " in the copy");
    UniqueFd dst(::openat(dst_dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!dst) return Error::sys(errno, "open /" + rel + " in the copy");
    DSEC_TRY(copyDir(src.get(), dst.get(), rel, depth + 1));
    DSEC_TRY(copyXattrs(src.get(), dst.get(), rel));
    DSEC_TRY(setOwner(dst_dir, name, dst.get(), st, rel));
    return setModeAndTimes(dst.get(), st, rel);
  }

  Status copyFile(int src_dir, int dst_dir, const char* name, const std::string& rel, const struct stat& st) {
    DSEC_TRY(count(st.st_size, rel));
    UniqueFd src(::openat(src_dir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
    if (!src) return Error::sys(errno, "open /" + rel + " in the upper");
    struct stat now {};
    if (::fstat(src.get(), &now) != 0) return Error::sys(errno, "stat /" + rel + " in the upper");
    if (!S_ISREG(now.st_mode) || now.st_ino != st.st_ino || now.st_dev != st.st_dev) {
      return Error(ErrorCode::kConflict, "/" + rel + " in the upper changed while it was copied");
    }
    UniqueFd dst(::openat(dst_dir, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!dst) return Error::sys(errno, "create /" + rel + " in the copy");
    // At most the size counted: a file that grew since (only the node writes while the sandbox is frozen) is cut.
    for (off_t left = st.st_size; left > 0;) {
      ssize_t n = ::sendfile(dst.get(), src.get(), nullptr, static_cast<size_t>(std::min<off_t>(left, 1 << 30)));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Error::sys(errno, "copy /" + rel + " out of the upper");
      if (n == 0) break;
      left -= n;
    }
    DSEC_TRY(copyXattrs(src.get(), dst.get(), rel));
    DSEC_TRY(setOwner(dst_dir, name, dst.get(), st, rel));
    return setModeAndTimes(dst.get(), st, rel);
  }

  Status copySymlink(int src_dir, int dst_dir, const char* name, const std::string& rel, const struct stat& st) {
    std::vector<char> target(PATH_MAX + 1);
    ssize_t n = ::readlinkat(src_dir, name, target.data(), target.size());
    if (n < 0) return Error::sys(errno, "read link /" + rel + " in the upper");
    if (static_cast<size_t>(n) >= target.size()) {
      return Error(ErrorCode::kInvalidArgument, "/" + rel + " in the upper is a symlink longer than PATH_MAX");
    }
    DSEC_TRY(count(n, rel));
    target[static_cast<size_t>(n)] = '\0';
    if (::symlinkat(target.data(), dst_dir, name) != 0) return Error::sys(errno, "make link /" + rel + " in the copy");
    DSEC_TRY(setOwner(dst_dir, name, -1, st, rel));
    const timespec times[2] = {st.st_atim, st.st_mtim};
    (void)::utimensat(dst_dir, name, times, AT_SYMLINK_NOFOLLOW);
    return okStatus();
  }

  std::optional<uint32_t> id_base_;
  UpperCopyLimits limits_;
  UpperCopyStats stats_;
};

}  // namespace

Result<UpperCopyStats> copyUpper(int upper_fd, const std::string& dest, std::optional<uint32_t> id_base,
                                 const UpperCopyLimits& limits) {
  struct stat st {};
  if (::fstat(upper_fd, &st) != 0) return Error::sys(errno, "stat the upper");
  if (!S_ISDIR(st.st_mode)) return Error::invalid("the upper is not a directory");
  if (::mkdir(dest.c_str(), 0700) != 0) return Error::sys(errno, "mkdir " + dest);
  UniqueFd dst(::open(dest.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dst) return Error::sys(errno, "open " + dest);
  UniqueFd src(::openat(upper_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!src) return Error::sys(errno, "open the upper");
  Copier copier(id_base, limits);
  DSEC_TRY(copier.copyDir(src.get(), dst.get(), "", 0));
  // The root keeps the upper's mode and times; it belongs to root (the overlay made it).
  if (::fchmod(dst.get(), st.st_mode & 0777) != 0) return Error::sys(errno, "chmod " + dest);
  return copier.stats();
}

}  // namespace dsec::backends
