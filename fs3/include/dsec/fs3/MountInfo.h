// Reads the mount table of this process (/proc/self/mountinfo): which layer mounts exist, for reuse after an
// agent restart and for cleaning stale ones; tests use it to count mounts.
#pragma once

#include <string>
#include <vector>

#include "dsec/common/Result.h"

namespace dsec::fs3 {

struct MountEntry {
  std::string mount_point;  // unescaped (mountinfo writes ' ' as \040 etc.)
  std::string fs_type;
  std::string source;
  std::string options;  // per-mount options, e.g. "ro,nosuid,nodev,relatime"
};

Result<std::vector<MountEntry>> readMountInfo(const std::string& path = "/proc/self/mountinfo");
// Mount points at or below dir (dir itself included), in mountinfo order.
Result<std::vector<MountEntry>> mountsUnder(const std::string& dir);

}  // namespace dsec::fs3
