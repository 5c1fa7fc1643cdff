// Copies a sandbox's writable upper out of it for a snapshot (ContainerSandbox::snapshot). The upper is written by
// the sandbox's root, which is hostile: the copy walks it through fds only (openat with O_NOFOLLOW, never a path
// the sandbox could redirect), never follows a symlink (they are copied as links), bounds bytes, entries and
// depth, and keeps only what a layer may hold: directories, regular files, symlinks, fifos and overlay whiteouts
// (char 0/0). Any other device node is refused; sockets are skipped (nothing listens on them in a copy). Of the
// xattrs only the overlay's opaque mark (user.overlay.opaque "y") and the user's own user.* xattrs are kept, so
// nothing the sandbox wrote can steer an overlay that stacks the layer (redirects, metacopy, origins).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "dsec/common/Result.h"

namespace dsec::backends {

struct UpperCopyLimits {
  int64_t max_bytes = 8LL << 30;  // regular files' sizes and symlink targets, summed
  int64_t max_entries = 1000000;  // directory entries of every kind
  int max_depth = 256;            // directories below the upper
};

struct UpperCopyStats {
  int64_t bytes = 0;
  int64_t entries = 0;
};

// Copies the tree below upper_fd (a directory fd) into dest, a new directory (created 0700; its parent must
// exist). id_base: the host id of the sandbox's root when it has a user namespace; owners are shifted down by it
// (the layer's ids are the sandbox's own) and an owner outside its 65536 ids is refused. A limit that is exceeded
// or a refused entry fails with kInvalidArgument naming the path; dest is then left for the
// caller to remove.
Result<UpperCopyStats> copyUpper(int upper_fd, const std::string& dest, std::optional<uint32_t> id_base,
                                 const UpperCopyLimits& limits);

}  // namespace dsec::backends
