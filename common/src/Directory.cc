// Directory listing (Directory.h).
#include "dsec/common/Directory.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "dsec/common/Fd.h"

namespace dsec {
namespace {

struct DirCloser {
  void operator()(DIR* dir) const { ::closedir(dir); }
};

Result<std::vector<DirEntry>> readAll(DIR* raw, const std::string& path) {
  std::unique_ptr<DIR, DirCloser> dir(raw);
  std::vector<DirEntry> entries;
  for (;;) {
    errno = 0;
    struct dirent* ent = ::readdir(dir.get());
    if (ent == nullptr) break;
    if (std::strcmp(ent->d_name, ".") == 0 || std::strcmp(ent->d_name, "..") == 0) continue;
    bool is_dir = ent->d_type == DT_DIR;
    if (ent->d_type == DT_UNKNOWN) {
      struct stat st {};
      is_dir = ::fstatat(::dirfd(dir.get()), ent->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
    }
    entries.push_back({ent->d_name, is_dir});
  }
  if (errno != 0) return Error::sys(errno, "readdir " + path);
  return entries;
}

}  // namespace

Result<std::vector<DirEntry>> listDirectory(const std::string& path) {
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return Error::sys(errno, "opendir " + path);
  return readAll(dir, path);
}

Result<std::vector<DirEntry>> listDirectoryAt(int dirfd, const std::string& path) {
  UniqueFd dup(::openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));  // its own offset, unlike dup(2)
  if (!dup) return Error::sys(errno, "opendir " + path);
  DIR* dir = ::fdopendir(dup.get());
  if (dir == nullptr) return Error::sys(errno, "opendir " + path);
  dup.release();
  return readAll(dir, path);
}

}  // namespace dsec
