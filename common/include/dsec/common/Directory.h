// Reading directories: the one place that holds a DIR*, so no caller leaks one on an early return or forgets
// to check readdir's error.
#pragma once

#include <string>
#include <vector>

#include "dsec/common/Result.h"

namespace dsec {

struct DirEntry {
  std::string name;
  bool is_dir = false;  // without following symlinks (fstatat when the file system gives no d_type)
};

// The entries of `path` other than "." and "..", in directory order. A missing directory is kNotFound; other
// failures (open, read) carry errno and the path.
Result<std::vector<DirEntry>> listDirectory(const std::string& path);
// The same for an open directory (a dup is read, so `dirfd` and its offset are untouched); `path` only names
// it in errors. For callers that must not re-resolve a path (inside a sandbox's tree).
Result<std::vector<DirEntry>> listDirectoryAt(int dirfd, const std::string& path);

}  // namespace dsec
