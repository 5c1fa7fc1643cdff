// Walks a path inside a sandbox as root, creating what is missing, without letting the sandbox's contents steer
// where root writes. Used where the plugin, root and chrooted into the sandbox, makes a place for something:
// --dsec-mount targets (BindMounts.cc) and the job's working directory (TaskJoin.cc).
//
// The walk goes one component at a time from descriptors (openat2, no /proc magic links; ordinary symlinks are
// followed, within the chroot). A missing component is created only when its parent lies on the sandbox's own
// root mount (the overlay, thrown away with the sandbox), never on another mount: the binds are host
// directories, where root would create directories and files in a tree the user named but maybe may not
// write, also through a symlink a task of the step planted meanwhile. Each creation is relative to a
// descriptor whose mount was checked, so nothing can be swapped in between.
//
// System calls only, no allocation: safe in a child forked from multithreaded slurmstepd.
#pragma once

#include <cstdint>

namespace dsec::spank {

enum class SandboxPathStep : int { kOk = 0, kResolve, kOutsideRoot, kMkdir, kCreateFile, kBadPath };

struct SandboxPathResult {
  int fd = -1;         // O_PATH descriptor of the final component (closed by the caller), -1 on failure
  int component = -1;  // 0-based index of the component that failed
  SandboxPathStep step = SandboxPathStep::kOk;
  int err = 0;  // errno of the failure
};

// The mount id of fd (statx STATX_MNT_ID); false with errno set on failure.
bool mountIdOf(int fd, uint64_t* id);

// path: absolute or relative to root_fd ('.' and empty components are skipped, '..' is kBadPath).
// want_dir: the last component is a directory (else a regular file, created empty with mode 0644).
// root_mount: mountIdOf(root_fd), where creating is allowed.
SandboxPathResult openOrCreateInSandbox(int root_fd, uint64_t root_mount, const char* path, bool want_dir);

// What went wrong, for messages ("create the target inside another mount ...").
const char* sandboxPathStepName(SandboxPathStep step);

}  // namespace dsec::spank
