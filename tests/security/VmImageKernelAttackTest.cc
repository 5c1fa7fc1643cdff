// A vm sandbox boots the kernel and modules its image carries, and the node copies them out of the image as root.
// An image can be hostile (a snapshot layer is what a sandbox wrote): its symlinks and modules.dep must not make the
// node read a host file into the guest, hang on a FIFO, or take unbounded memory.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dsec/backends/vm/ImageKernel.h"
#include "dsec/common/Directory.h"
#include "dsec/common/Strings.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::testing {
namespace {

using backends::vm::findImageKernel;
using backends::vm::prepareImageKernelDir;

constexpr const char* kRelease = "6.1.0-1-amd64";
constexpr const char* kSecret = "HOST-SECRET-never-in-a-guest";

void put(const std::string& path, const std::string& text) {
  ASSERT_OK(makeDirs(path.substr(0, path.rfind('/'))));
  ASSERT_OK(writeFile(path, text));
}

void link(const std::string& target, const std::string& path) {
  ASSERT_OK(makeDirs(path.substr(0, path.rfind('/'))));
  ASSERT_EQ(::symlink(target.c_str(), path.c_str()), 0) << path;
}

// Every file under dir (recursively), concatenated.
std::string everything(const std::string& dir) {
  std::string all;
  auto entries = listDirectory(dir);
  if (!entries.ok()) return all;
  for (const auto& e : *entries) {
    std::string path = dir + "/" + e.name;
    if (e.is_dir) {
      all += everything(path);
    } else if (auto text = readFile(path); text.ok()) {
      all += *text;
    }
  }
  return all;
}

class VmImageKernelAttack : public ::testing::Test {
 protected:
  void SetUp() override {
    // A host directory that looks like a kernel's: were the image's links followed on the host, the node would
    // copy it into a guest's boot files.
    secret_dir_ = host_.path() + "/secret";
    put(secret_dir_ + "/vmlinuz-" + kRelease, kSecret);
    for (const char* m : {"virtio_pci", "virtio_blk", "virtio_console", "erofs", "overlay"}) {
      put(secret_dir_ + "/" + m + ".ko", kSecret);
    }
    image_ = host_.path() + "/image";
    mods_ = image_ + "/lib/modules/" + kRelease;
    put(mods_ + "/modules.dep",
        "kernel/virtio_pci.ko:\nkernel/virtio_blk.ko:\nkernel/virtio_console.ko:\nkernel/erofs.ko:\n"
        "kernel/overlay.ko:\n");
  }

  // The kernel dir the node would boot from this image, or its error.
  Result<std::string> prepare() {
    UniqueFd root(::open(image_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    auto k = findImageKernel(root.get());
    if (!k.ok()) return k.error();
    if (!k->has_value()) return Error::notFound("no kernel");
    return prepareImageKernelDir(root.get(), **k, cache_.path());
  }

  TempDir host_;
  TempDir cache_;
  std::string secret_dir_, image_, mods_;
};

TEST_F(VmImageKernelAttack, AbsoluteDirectorySymlinksToTheHostResolveInsideTheImage) {
  link(secret_dir_, image_ + "/boot");
  link(secret_dir_, mods_ + "/kernel");
  auto dir = prepare();
  // Inside the image those links lead nowhere: a clear error, and nothing of the host's copied.
  ASSERT_FALSE(dir.ok());
  EXPECT_EQ(everything(cache_.path()).find(kSecret), std::string::npos);
}

TEST_F(VmImageKernelAttack, DotDotSymlinksAndModulesDepPathsStayInsideTheImage) {
  const std::string up = "../../../../../../../../../../../../../..";
  link(up + secret_dir_, image_ + "/boot");
  link(up + secret_dir_, mods_ + "/kernel");
  auto links = prepare();
  ASSERT_FALSE(links.ok());
  EXPECT_EQ(everything(cache_.path()).find(kSecret), std::string::npos);

  // A real kernel, but modules.dep naming files outside the modules dir.
  ASSERT_EQ(::unlink((image_ + "/boot").c_str()), 0);
  ASSERT_EQ(::unlink((mods_ + "/kernel").c_str()), 0);
  put(image_ + "/boot/vmlinuz-" + kRelease, "KERNEL");
  put(mods_ + "/modules.dep", "kernel/virtio_pci.ko: " + up + secret_dir_ + "/virtio_blk.ko\n" +
                                  "kernel/virtio_blk.ko:\nkernel/virtio_console.ko:\nkernel/erofs.ko:\n"
                                  "kernel/overlay.ko:\n");
  for (const char* m : {"virtio_pci", "virtio_blk", "virtio_console", "erofs", "overlay"}) {
    put(mods_ + "/kernel/" + m + ".ko", "MODULE");
  }
  auto dep = prepare();
  ASSERT_FALSE(dep.ok());
  EXPECT_NE(dep.error().message().find("bad"), std::string::npos) << dep.error().message();
  EXPECT_EQ(everything(cache_.path()).find(kSecret), std::string::npos);
}

TEST_F(VmImageKernelAttack, AFifoKernelOrAHugeModuleFailsWithoutHangingOrReadingIt) {
  ASSERT_OK(makeDirs(image_ + "/boot"));
  ASSERT_EQ(::mkfifo((image_ + "/boot/vmlinuz-" + kRelease).c_str(), 0644), 0);
  for (const char* m : {"virtio_pci", "virtio_blk", "virtio_console", "erofs", "overlay"}) {
    put(mods_ + "/kernel/" + m + ".ko", "MODULE");
  }
  auto fifo = prepare();  // returns: a FIFO is not read
  ASSERT_FALSE(fifo.ok());
  EXPECT_NE(fifo.error().message().find("not a regular file"), std::string::npos) << fifo.error().message();

  ASSERT_EQ(::unlink((image_ + "/boot/vmlinuz-" + kRelease).c_str()), 0);
  put(image_ + "/boot/vmlinuz-" + kRelease, "KERNEL");
  ASSERT_EQ(::truncate((mods_ + "/kernel/virtio_blk.ko").c_str(), 65ll << 20), 0);  // sparse: no disk used
  auto huge = prepare();
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.error().message().find("larger than"), std::string::npos) << huge.error().message();
}

}  // namespace
}  // namespace dsec::testing
