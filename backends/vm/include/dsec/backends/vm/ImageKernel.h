// A vm sandbox boots the image's own kernel when the image has one, and hands PID 1 to the image's init
// (docs/vm-backends.md). This finds both in a read-only view of the image's layers and makes what QEMU boots: the
// kernel and a kernel dir of the guest modules dsec's agent needs, taken from the image's /lib/modules.
// Every path is resolved inside the image (openat2 RESOLVE_IN_ROOT): an image's symlink cannot lead to a file of
// the host, and a snapshot layer is what a hostile sandbox wrote.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"

namespace dsec::backends::vm {

struct ImageKernel {
  std::string release;      // "6.1.0-50-cloud-amd64"
  std::string kernel_path;  // in the image, relative: "vmlinuz" (Debian's symlink) or "boot/vmlinuz-<release>"
  std::string modules_dir;  // "lib/modules/<release>" or "usr/lib/modules/<release>"
  std::string init;         // "/sbin/init" when the image has an executable one, else ""
};

// The image's layers (bottom first) as one read-only tree: a layer's own directory, or an overlay of them mounted
// detached (no mount point: it goes with the fd). kInvalidArgument for a path overlay cannot take.
Result<UniqueFd> openImageView(const std::vector<std::string>& lower_dirs);

// The image's kernel: /vmlinuz's (or /boot/vmlinuz's) target, else the newest /boot/vmlinuz-<release>. nullopt
// when the image has none. An image that has a kernel but no modules.dep for it is an error naming what to run.
Result<std::optional<ImageKernel>> findImageKernel(int image_root_fd);

// The modules the agent needs from that kernel (virtio over PCI, block, console, balloon; erofs, overlay) with
// their dependencies, dependencies first, as paths relative to modules_dir (as modules.dep writes them). Built-in
// ones are left out; a required one that is neither is an error.
Result<std::vector<std::string>> imageKernelModules(int image_root_fd, const ImageKernel& kernel);

// Copies the kernel and those modules out of the image into <cache_root>/kernel-<hash of their bytes>, in the layout
// of dsec's own guest kernel dir (vmlinuz, modules/, modules.order, VERSION), unless that dir is there already.
// Shared by every sandbox and node of the host (written aside and renamed into place). Returns the dir.
Result<std::string> prepareImageKernelDir(int image_root_fd, const ImageKernel& kernel, const std::string& cache_root);

}  // namespace dsec::backends::vm
