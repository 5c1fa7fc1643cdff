#include "SandboxFiles.h"

#include <fcntl.h>
#include <linux/capability.h>
#include <linux/openat2.h>
#include <sys/fsuid.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <optional>

#include "dsec/common/Directory.h"

namespace dsec::backends {
namespace {

constexpr uint64_t kResolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;

int openIn(int root_fd, const std::string& path, uint64_t flags, uint64_t mode = 0) {
  open_how how{};
  how.flags = flags | O_CLOEXEC;
  how.mode = mode;
  how.resolve = kResolve;
  for (;;) {
    int fd = static_cast<int>(syscall(SYS_openat2, root_fd, path.c_str(), &how, sizeof how));
    if (fd < 0 && errno == EAGAIN) continue;  // a concurrent rename raced the lookup: retry
    return fd;
  }
}

Error pathError(int err, const std::string& what, const std::string& path) {
  if (err == ENOENT) return Error(ErrorCode::kNotFound, what + " " + path + ": no such file or directory", err);
  if (err == EXDEV) return Error(ErrorCode::kInvalidArgument, what + " " + path + ": crosses a mount point", err);
  if (err == ENOTDIR || err == EISDIR || err == ELOOP || err == ENAMETOOLONG) {
    return Error(ErrorCode::kInvalidArgument, Error::sys(err, what + " " + path).message(), err);
  }
  return Error::sys(err, what + " " + path);
}

// Splits a normalized path into its parent and last component ("/a/b" -> "/a", "b").
std::pair<std::string, std::string> splitLast(const std::string& path) {
  size_t slash = path.rfind('/');
  std::string parent = slash == 0 ? "/" : path.substr(0, slash);
  return {parent, path.substr(slash + 1)};
}

const char* typeName(mode_t mode) {
  if (S_ISREG(mode)) return "file";
  if (S_ISDIR(mode)) return "dir";
  if (S_ISLNK(mode)) return "symlink";
  return "other";
}

FileStat toFileStat(const std::string& name, const struct stat& st) {
  FileStat f;
  f.name = name;
  f.type = typeName(st.st_mode);
  f.size = st.st_size;
  f.mode = st.st_mode & 07777;
  f.mtime = st.st_mtim.tv_sec;
  return f;
}

// Opens (creating as needed) the directory at a normalized path, one component at a time: mkdirat on a
// single name relative to a safely resolved parent never follows a symlink. What it creates belongs to owner.
Result<UniqueFd> openOrMakeDir(int root_fd, const std::string& path, std::optional<uint32_t> owner) {
  int fd = openIn(root_fd, path, O_PATH | O_DIRECTORY);
  if (fd >= 0) return UniqueFd(fd);
  if (errno != ENOENT) return pathError(errno, "open directory", path);
  auto [parent, name] = splitLast(path);
  DSEC_ASSIGN_OR_RETURN(UniqueFd parent_fd, openOrMakeDir(root_fd, parent, owner));
  int made;
  {
    ActingOwner as_owner(owner);
    made = mkdirat(parent_fd.get(), name.c_str(), 0755);
  }
  if (made < 0 && errno != EEXIST) return pathError(errno, "create directory", path);
  fd = openIn(root_fd, path, O_PATH | O_DIRECTORY);
  if (fd < 0) return pathError(errno, "open directory", path);
  return UniqueFd(fd);
}

// Opens a regular file with O_NONBLOCK (a FIFO planted inside must not hang the agent), checks that it is
// regular, then clears O_NONBLOCK.
Result<UniqueFd> openRegular(int root_fd, const std::string& path, uint64_t flags, uint64_t mode) {
  int fd = openIn(root_fd, path, flags | O_NONBLOCK | O_NOCTTY, mode);
  if (fd < 0) return pathError(errno, "open", path);
  UniqueFd owned(fd);
  struct stat st;
  if (fstat(fd, &st) < 0) return Error::sys(errno, "stat " + path);
  if (S_ISDIR(st.st_mode)) return Error(ErrorCode::kInvalidArgument, path + " is a directory", EISDIR);
  if (!S_ISREG(st.st_mode)) return Error(ErrorCode::kInvalidArgument, path + " is not a regular file");
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) return Error::sys(errno, "fcntl " + path);
  return owned;
}

// Removes everything below dir_fd, staying on one file system (dev) and never following symlinks.
Status removeContents(int dir_fd, dev_t dev, const std::string& path) {
  DSEC_ASSIGN_OR_RETURN(auto entries, listDirectoryAt(dir_fd, path));
  for (const auto& [name, is_dir] : entries) {
    std::string child = path == "/" ? "/" + name : path + "/" + name;
    if (is_dir) {
      int fd = openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (fd >= 0) {
        UniqueFd sub(fd);
        struct stat st;
        if (fstat(fd, &st) < 0) return Error::sys(errno, "stat " + child);
        if (st.st_dev != dev) return Error::invalid("refusing to remove across a mount point: " + child);
        DSEC_TRY(removeContents(fd, dev, child));
        if (unlinkat(dir_fd, name.c_str(), AT_REMOVEDIR) < 0 && errno != ENOENT) {
          return Error::sys(errno, "rmdir " + child);
        }
        continue;
      }
      if (errno != ENOTDIR && errno != ELOOP) return Error::sys(errno, "open " + child);
    }
    if (unlinkat(dir_fd, name.c_str(), 0) < 0 && errno != ENOENT) return Error::sys(errno, "unlink " + child);
  }
  return okStatus();
}

}  // namespace

Result<std::string> normalizeSandboxPath(const std::string& path) {
  if (path.empty()) return Error::invalid("empty path");
  if (path.find('\0') != std::string::npos) return Error::invalid("path contains a NUL byte");
  if (path[0] != '/') return Error::invalid("path must be absolute: " + path);
  std::string out;
  size_t i = 0;
  while (i < path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string::npos) j = path.size();
    std::string_view comp(path.data() + i, j - i);
    if (comp == "..") return Error::invalid("path must not contain '..': " + path);
    if (!comp.empty() && comp != ".") {
      out += '/';
      out += comp;
    }
    i = j + 1;
  }
  if (out.empty()) out = "/";
  if (out.size() > 4000) return Error::invalid("path too long");
  return out;
}

Result<UniqueFd> sandboxOpenForRead(int root_fd, const std::string& raw) {
  DSEC_ASSIGN_OR_RETURN(std::string path, normalizeSandboxPath(raw));
  return openRegular(root_fd, path, O_RDONLY, 0);
}

Result<UniqueFd> sandboxOpenForWrite(int root_fd, const std::string& raw, uint32_t mode,
                                     std::optional<uint32_t> owner) {
  DSEC_ASSIGN_OR_RETURN(std::string path, normalizeSandboxPath(raw));
  if (path == "/") return Error::invalid("cannot write to /");
  if (mode > 07777) return Error::invalid("bad file mode");
  auto [parent, name] = splitLast(path);
  DSEC_ASSIGN_OR_RETURN(UniqueFd parent_fd, openOrMakeDir(root_fd, parent, owner));
  (void)parent_fd;
  Result<UniqueFd> opened = Error::internal("not opened");
  {
    ActingOwner as_owner(owner);
    opened = openRegular(root_fd, path, O_WRONLY | O_CREAT, mode);
  }
  DSEC_ASSIGN_OR_RETURN(UniqueFd fd, std::move(opened));
  // Truncate only once it is known to be a regular file (O_TRUNC on a planted FIFO/device is not ours to do).
  if (ftruncate(fd.get(), 0) < 0) return Error::sys(errno, "truncate " + path);
  return fd;
}

Result<FileStat> sandboxStat(int root_fd, const std::string& raw) {
  DSEC_ASSIGN_OR_RETURN(std::string path, normalizeSandboxPath(raw));
  int fd = openIn(root_fd, path, O_PATH | O_NOFOLLOW);
  if (fd < 0) return pathError(errno, "stat", path);
  UniqueFd owned(fd);
  struct stat st;
  if (fstatat(fd, "", &st, AT_EMPTY_PATH) < 0) return Error::sys(errno, "stat " + path);
  return toFileStat(path == "/" ? "/" : splitLast(path).second, st);
}

Result<std::vector<FileStat>> sandboxListDir(int root_fd, const std::string& raw) {
  DSEC_ASSIGN_OR_RETURN(std::string path, normalizeSandboxPath(raw));
  int fd = openIn(root_fd, path, O_RDONLY | O_DIRECTORY);
  if (fd < 0) return pathError(errno, "list", path);
  UniqueFd dir(fd);
  DSEC_ASSIGN_OR_RETURN(auto entries, listDirectoryAt(dir.get(), path));
  std::vector<FileStat> out;
  for (const auto& e : entries) {
    struct stat st;
    if (fstatat(dir.get(), e.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0) continue;  // removed meanwhile
    out.push_back(toFileStat(e.name, st));
  }
  return out;
}

Status sandboxRemove(int root_fd, const std::string& raw, bool recursive) {
  DSEC_ASSIGN_OR_RETURN(std::string path, normalizeSandboxPath(raw));
  if (path == "/") return Error::invalid("refusing to remove /");
  auto [parent, name] = splitLast(path);
  int pfd = openIn(root_fd, parent, O_PATH | O_DIRECTORY);
  if (pfd < 0) return pathError(errno, "remove", path);
  UniqueFd parent_fd(pfd);
  struct stat st;
  if (fstatat(pfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0) return pathError(errno, "remove", path);
  if (!S_ISDIR(st.st_mode)) {
    if (unlinkat(pfd, name.c_str(), 0) < 0) return pathError(errno, "remove", path);
    return okStatus();
  }
  if (recursive) {
    struct stat parent_st;
    if (fstat(pfd, &parent_st) < 0) return Error::sys(errno, "stat " + parent);
    if (st.st_dev != parent_st.st_dev) return Error::invalid("refusing to remove a mount point: " + path);
    int dfd = openat(pfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0) return pathError(errno, "remove", path);
    UniqueFd dir_fd(dfd);
    DSEC_TRY(removeContents(dfd, st.st_dev, path));
  }
  if (unlinkat(pfd, name.c_str(), AT_REMOVEDIR) < 0) {
    if (errno == ENOTEMPTY || errno == EEXIST) {
      return Error(ErrorCode::kConflict, "directory not empty: " + path + " (use recursive)", errno);
    }
    return pathError(errno, "remove", path);
  }
  return okStatus();
}

}  // namespace dsec::backends
