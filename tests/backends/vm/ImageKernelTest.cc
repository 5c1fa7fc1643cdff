// Finding an image's own kernel, its modules and its init (a vm sandbox boots them), on directory trees laid out as
// Debian's kernel packages lay them out; and the read-only overlay view of several layers.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include "dsec/backends/vm/ImageKernel.h"
#include "dsec/common/Strings.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::testing {
namespace {

using backends::vm::findImageKernel;
using backends::vm::ImageKernel;
using backends::vm::imageKernelModules;
using backends::vm::openImageView;
using backends::vm::prepareImageKernelDir;

constexpr const char* kRelease = "6.1.0-50-cloud-amd64";

void put(const std::string& path, const std::string& text, mode_t mode = 0644) {
  ASSERT_OK(makeDirs(path.substr(0, path.rfind('/'))));
  ASSERT_OK(writeFile(path, text));
  ASSERT_EQ(::chmod(path.c_str(), mode), 0);
}

void link(const std::string& target, const std::string& path) {
  ASSERT_OK(makeDirs(path.substr(0, path.rfind('/'))));
  ASSERT_EQ(::symlink(target.c_str(), path.c_str()), 0) << path;
}

// A merged-/usr Debian root with a kernel package installed: /vmlinuz -> boot/vmlinuz-R, /lib -> usr/lib,
// /sbin/init -> /lib/systemd/systemd, modules.dep with virtio_pci's dependencies and a compressed module.
void debianTree(const std::string& root, const std::string& release = kRelease) {
  link("usr/lib", root + "/lib");
  link("usr/sbin", root + "/sbin");
  put(root + "/usr/lib/systemd/systemd", "init", 0755);
  link("/lib/systemd/systemd", root + "/usr/sbin/init");
  put(root + "/boot/vmlinuz-" + release, "KERNEL " + release);
  link("boot/vmlinuz-" + release, root + "/vmlinuz");
  std::string mods = root + "/usr/lib/modules/" + release;
  put(mods + "/modules.dep",
      "kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_pci_modern_dev.ko "
      "kernel/drivers/virtio/virtio_ring.ko kernel/drivers/virtio/virtio.ko\n"
      "kernel/drivers/virtio/virtio_pci_modern_dev.ko: kernel/drivers/virtio/virtio.ko\n"
      "kernel/drivers/virtio/virtio_ring.ko:\n"
      "kernel/drivers/virtio/virtio.ko:\n"
      "kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio_ring.ko kernel/drivers/virtio/virtio.ko\n"
      "kernel/drivers/char/virtio_console.ko.xz: kernel/drivers/virtio/virtio_ring.ko "
      "kernel/drivers/virtio/virtio.ko\n"
      "kernel/fs/erofs/erofs.ko: kernel/lib/libcrc32c.ko\n"
      "kernel/lib/libcrc32c.ko:\n"
      "kernel/drivers/net/dummy.ko:\n");
  put(mods + "/modules.builtin", "kernel/fs/overlayfs/overlay.ko\n");
  for (const char* m :
       {"drivers/virtio/virtio_pci.ko", "drivers/virtio/virtio_pci_modern_dev.ko", "drivers/virtio/virtio_ring.ko",
        "drivers/virtio/virtio.ko", "drivers/block/virtio_blk.ko", "drivers/char/virtio_console.ko.xz",
        "fs/erofs/erofs.ko", "lib/libcrc32c.ko", "drivers/net/dummy.ko"}) {
    put(mods + "/kernel/" + m, std::string("MODULE ") + m);
  }
}

UniqueFd openRoot(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  EXPECT_TRUE(fd) << dir;
  return fd;
}

TEST(ImageKernelTest, FindsDebiansKernelModulesAndSystemdThroughTheImagesOwnSymlinks) {
  TempDir dir;
  debianTree(dir.path());
  UniqueFd root = openRoot(dir.path());
  auto found = findImageKernel(root.get());
  ASSERT_OK(found);
  ASSERT_TRUE(found->has_value());
  const ImageKernel& k = **found;
  EXPECT_EQ(k.release, kRelease);
  EXPECT_EQ(k.kernel_path, std::string("boot/vmlinuz-") + kRelease);
  EXPECT_EQ(k.modules_dir, std::string("lib/modules/") + kRelease);  // through /lib -> usr/lib
  EXPECT_EQ(k.init, "/sbin/init");                                   // /sbin/init -> /lib/systemd/systemd

  auto modules = imageKernelModules(root.get(), k);
  ASSERT_OK(modules);
  const std::vector<std::string>& m = *modules;
  auto at = [&](const std::string& name) {
    return std::find_if(m.begin(), m.end(), [&](const std::string& p) { return p.ends_with("/" + name); }) - m.begin();
  };
  // Dependencies first; built-in overlay and modules nobody needs (dummy) are not there; the balloon is optional.
  EXPECT_LT(at("virtio.ko"), at("virtio_pci_modern_dev.ko"));
  EXPECT_LT(at("virtio_pci_modern_dev.ko"), at("virtio_pci.ko"));
  EXPECT_LT(at("virtio_ring.ko"), at("virtio_blk.ko"));
  EXPECT_LT(at("libcrc32c.ko"), at("erofs.ko"));
  EXPECT_LT(at("virtio_console.ko.xz"), static_cast<long>(m.size()));
  EXPECT_EQ(at("dummy.ko"), static_cast<long>(m.size()));
  EXPECT_EQ(at("overlay.ko"), static_cast<long>(m.size()));
  EXPECT_EQ(m.size(), 8u);
}

TEST(ImageKernelTest, KernelDirHoldsTheKernelAndModulesInLoadOrderAndIsSharedByContent) {
  TempDir dir;
  TempDir cache;
  debianTree(dir.path() + "/img");
  UniqueFd root = openRoot(dir.path() + "/img");
  auto k = findImageKernel(root.get());
  ASSERT_OK(k);
  ASSERT_TRUE(k->has_value());
  auto kdir = prepareImageKernelDir(root.get(), **k, cache.path());
  ASSERT_OK(kdir);
  EXPECT_EQ(*readFile(*kdir + "/vmlinuz"), std::string("KERNEL ") + kRelease);
  auto order = readFile(*kdir + "/modules.order");
  ASSERT_OK(order);
  std::vector<std::string> names;
  for (const auto& line : split(*order, '\n')) {
    if (!line.empty()) names.push_back(line);
  }
  ASSERT_EQ(names.size(), 8u);
  EXPECT_EQ(*readFile(*kdir + "/modules/virtio_console.ko.xz"), "MODULE drivers/char/virtio_console.ko.xz");
  // The same bytes: the same dir. A changed kernel: another.
  auto again = prepareImageKernelDir(root.get(), **k, cache.path());
  ASSERT_OK(again);
  EXPECT_EQ(*again, *kdir);
  put(dir.path() + "/img/boot/vmlinuz-" + kRelease, "KERNEL rebuilt");
  auto rebuilt = prepareImageKernelDir(root.get(), **k, cache.path());
  ASSERT_OK(rebuilt);
  EXPECT_NE(*rebuilt, *kdir);
  EXPECT_EQ(*readFile(*rebuilt + "/vmlinuz"), "KERNEL rebuilt");
}

TEST(ImageKernelTest, WithoutTheSymlinkTheNewestBootKernelIsTaken) {
  TempDir dir;
  debianTree(dir.path(), "6.1.0-9-amd64");
  debianTree(dir.path() + "/second", "6.1.0-10-amd64");  // only for its files
  ASSERT_EQ(::unlink((dir.path() + "/vmlinuz").c_str()), 0);
  ASSERT_EQ(::rename((dir.path() + "/second/boot/vmlinuz-6.1.0-10-amd64").c_str(),
                     (dir.path() + "/boot/vmlinuz-6.1.0-10-amd64").c_str()),
            0);
  ASSERT_EQ(::rename((dir.path() + "/second/usr/lib/modules/6.1.0-10-amd64").c_str(),
                     (dir.path() + "/usr/lib/modules/6.1.0-10-amd64").c_str()),
            0);
  put(dir.path() + "/boot/config-6.1.0-99-amd64", "not a kernel");
  UniqueFd root = openRoot(dir.path());
  auto found = findImageKernel(root.get());
  ASSERT_OK(found);
  ASSERT_TRUE(found->has_value());
  EXPECT_EQ((*found)->release, "6.1.0-10-amd64");  // version order: 10 > 9
}

TEST(ImageKernelTest, NoKernelIsNoneAndAKernelWithoutModulesIsAClearError) {
  TempDir dir;
  ASSERT_OK(makeDirs(dir.path() + "/bin"));
  UniqueFd root = openRoot(dir.path());
  auto none = findImageKernel(root.get());
  ASSERT_OK(none);
  EXPECT_FALSE(none->has_value());

  put(dir.path() + "/boot/vmlinuz-6.1.0-1-amd64", "KERNEL");
  auto no_modules = findImageKernel(root.get());
  ASSERT_FALSE(no_modules.ok());
  EXPECT_NE(no_modules.error().message().find("no /lib/modules/6.1.0-1-amd64"), std::string::npos)
      << no_modules.error().message();

  ASSERT_OK(makeDirs(dir.path() + "/lib/modules/6.1.0-1-amd64"));
  auto no_dep = findImageKernel(root.get());
  ASSERT_FALSE(no_dep.ok());
  EXPECT_NE(no_dep.error().message().find("depmod 6.1.0-1-amd64"), std::string::npos) << no_dep.error().message();

  put(dir.path() + "/lib/modules/6.1.0-1-amd64/modules.dep", "kernel/drivers/virtio/virtio_pci.ko:\n");
  auto found = findImageKernel(root.get());
  ASSERT_OK(found);
  ASSERT_TRUE(found->has_value());
  EXPECT_EQ((*found)->init, "");  // no /sbin/init: the agent stays PID 1
  auto modules = imageKernelModules(root.get(), **found);
  ASSERT_FALSE(modules.ok());
  EXPECT_NE(modules.error().message().find("no virtio_blk module"), std::string::npos) << modules.error().message();
}

TEST(ImageKernelTest, TheViewOfSeveralLayersIsTheirOverlayTopFirstAndReadOnly) {
  if (std::string why = missingRoot(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir;
  put(dir.path() + "/base/boot/vmlinuz-6.1.0-1-amd64", "OLD");
  put(dir.path() + "/base/lib/modules/6.1.0-1-amd64/modules.dep", "");
  put(dir.path() + "/top/boot/vmlinuz-6.1.0-2-amd64", "NEW");
  put(dir.path() + "/top/lib/modules/6.1.0-2-amd64/modules.dep", "");
  auto view = openImageView({dir.path() + "/base", dir.path() + "/top"});
  ASSERT_OK(view);
  auto found = findImageKernel(view->get());
  ASSERT_OK(found);
  ASSERT_TRUE(found->has_value());
  EXPECT_EQ((*found)->release, "6.1.0-2-amd64");  // both kernels are seen; the newer one wins
  UniqueFd in(::openat(view->get(), "boot/vmlinuz-6.1.0-1-amd64", O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(in);
  char buf[8] = {};
  ASSERT_EQ(::read(in.get(), buf, sizeof buf), 3);
  EXPECT_EQ(std::string(buf), "OLD");
  EXPECT_LT(::openat(view->get(), "boot/new", O_CREAT | O_WRONLY | O_CLOEXEC, 0644), 0);
  EXPECT_EQ(errno, EROFS);
  EXPECT_FALSE(openImageView({dir.path() + "/a:b", dir.path() + "/top"}).ok());
}

}  // namespace
}  // namespace dsec::testing
