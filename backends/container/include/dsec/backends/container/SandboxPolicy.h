// What every process of a container sandbox is held to, for code that puts processes into a sandbox from outside
// the backend (the SPANK plugin's tasks): the capability set and the seccomp filter.
#pragma once

#include <linux/filter.h>

#include <cstdint>
#include <vector>

#include "dsec/common/Result.h"

namespace dsec::backends {

// The capability set of sandbox processes (Docker's default minus CAP_MKNOD), as a bit mask.
uint64_t defaultSandboxCaps();
// The sandbox seccomp filter as a BPF program.
Result<std::vector<sock_filter>> buildSandboxSeccompFilter();

}  // namespace dsec::backends
