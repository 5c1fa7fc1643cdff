// The guest's initramfs: dsec-guest-agent as /init, the kernel modules the guest kernel does not build in and
// their load order. Written once per node (the host side caches it) from the installed guest kernel.
#pragma once

#include <string>

#include "dsec/common/Result.h"

namespace dsec::backends::vm {

// The installed guest kernel (backends/vm/guest/fetch-guest-kernel.sh): DSEC_GUEST_KERNEL_DIR, else
// /usr/local/lib/dsec/guest-kernel. kNotFound, naming the script, when it has no vmlinux.
Result<std::string> findGuestKernelDir();
// dsec-guest-agent: next to the running executable, in ../libexec/dsec from it, else in the build tree.
Result<std::string> findGuestAgent();

// "<name>.ko", or one compressed as the kernel can load it itself (.ko.xz, .ko.zst, .ko.gz).
bool isModuleFileName(const std::string& name);

// Writes a newc cpio archive to out_path (replaced atomically): /init (the agent), /dev/console,
// /lib/modules/<name>.ko for each line of kernel_dir/modules.order and /lib/modules/modules.order.
Status writeInitramfs(const std::string& out_path, const std::string& agent_path, const std::string& kernel_dir);

}  // namespace dsec::backends::vm
