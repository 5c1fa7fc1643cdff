// Another user of the node gets to /dev/shm first: it makes the directory where the VM backends keep the initramfs
// and image kernels every VM boots (or a symlink in its place) and plants its own initramfs there. The backend must
// refuse that directory rather than boot what it holds.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dsec/backends/vm/Initramfs.h"
#include "dsec/backends/vm/VmBackend.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::testing {
namespace {

constexpr uid_t kOtherUser = 65534;

class VmSharedDirAttack : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = missingRoot(); !why.empty()) GTEST_SKIP() << why;
    if (findProgram("qemu-system-x86_64").empty()) GTEST_SKIP() << "needs qemu-system-x86_64 (qemu-system-x86)";
    if (!backends::vm::findGuestKernelDir().ok()) GTEST_SKIP() << "needs the guest kernel (tests/install-deps.sh)";
  }
  Result<std::unique_ptr<backends::Backend>> make(const std::string& shared_dir) {
    backends::vm::VmBackendOptions o;
    o.kind = backends::BackendKind::kMicrovm;
    o.cgroup_parent = "dsec-test-vm-shared-dir";
    o.shared_dir = shared_dir;
    return backends::vm::makeVmBackend(o);
  }
  TempDir tmp_;
};

TEST_F(VmSharedDirAttack, ADirectoryAnotherUserMadeOrASymlinkIsRefused) {
  // Root's own directory: the backend comes up (so the refusals below are about the directory).
  auto good = make(tmp_.path() + "/own");
  if (!good.ok() && good.error().code() == ErrorCode::kUnsupported) GTEST_SKIP() << good.error().message();
  ASSERT_OK(good);
  good->reset();

  // Another user's directory, with an initramfs of its choosing under every name the backend might look for.
  const std::string squatted = tmp_.path() + "/squatted";
  ASSERT_OK(makeDirs(squatted, 0777));
  ASSERT_EQ(::chown(squatted.c_str(), kOtherUser, kOtherUser), 0);
  ASSERT_OK(writeFile(squatted + "/planted", "not an initramfs"));
  auto refused = make(squatted);
  ASSERT_FALSE(refused.ok()) << "the backend accepted a shared directory owned by uid " << kOtherUser;
  EXPECT_NE(refused.error().message().find("belongs to uid 65534"), std::string::npos) << refused.error().message();
  struct stat st {};
  ASSERT_EQ(::stat(squatted.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, kOtherUser);  // left as it was: not taken over either

  // A symlink in its place, to a directory of root's: refused too (its target could change under the backend).
  ASSERT_OK(makeDirs(tmp_.path() + "/target", 0700));
  ASSERT_EQ(::symlink((tmp_.path() + "/target").c_str(), (tmp_.path() + "/link").c_str()), 0);
  auto via_link = make(tmp_.path() + "/link");
  ASSERT_FALSE(via_link.ok());
  EXPECT_NE(via_link.error().message().find("not a directory"), std::string::npos) << via_link.error().message();
}

}  // namespace
}  // namespace dsec::testing
