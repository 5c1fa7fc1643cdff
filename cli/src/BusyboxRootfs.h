// A minimal rootfs from the host's static busybox, for the benchmarks' base layer and the tests.
#pragma once

#include <string>

#include "dsec/common/Result.h"

namespace dsec::cli {

// Writes into dir (created if missing; empty or earlier written by this): bin/busybox plus a relative symlink
// per applet, /etc/passwd, /etc/group, /etc/motd and the usual empty top-level directories. kUnsupported if the
// host has no busybox.
Status writeBusyboxRootfs(const std::string& dir);

}  // namespace dsec::cli
