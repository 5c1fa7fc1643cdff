// Slow (~25 s, needs the network to the host's Debian mirror): its own binary with a long timeout.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>

#include "LayerTestUtil.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/LayerMounter.h"
#include "dsec/fs3/LayerStore.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::fs3 {
namespace {

using ::dsec::testing::TempDir;

TEST(LayerStoreDebootstrap, BuildsBookwormBase) {
  DSEC_SKIP_UNLESS_IMAGES();
  if (findProgram("debootstrap").empty()) GTEST_SKIP() << "debootstrap not installed (apt-get install debootstrap)";
  TempDir tmp;
  LayerStore store(tmp.path() + "/store");
  ASSERT_OK(store.init());
  LayerRef ref{"debian", "12"};
  double start = monotonicSeconds();
  auto m = store.buildDebootstrap(ref, "bookworm");
  if (!m.ok() && m.error().message().find("Failed getting release file") != std::string::npos) {
    GTEST_SKIP() << "the Debian mirror is unreachable: " << m.error().message();
  }
  ASSERT_OK(m);
  std::cerr << "debootstrap layer built in " << monotonicSeconds() - start << " s, " << formatBytes(m->size) << "\n";
  EXPECT_EQ(m->source, "debootstrap:bookworm");
  EXPECT_EQ(m->built_on, "");
  EXPECT_GT(m->size, 100 << 20);
  EXPECT_EQ(m->sha256, ::dsec::fs3::testing::sha256sumOf(store.imagePath(ref)));
  // Only the layer's two files are published; the debootstrap tree is gone.
  struct stat st {};
  EXPECT_NE(::lstat((store.layerDir(ref) + "/rootfs").c_str(), &st), 0);
  std::vector<std::string> names;
  if (DIR* d = ::opendir((tmp.path() + "/store/layers").c_str())) {
    while (struct dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{".", "..", "debian"})) << "no staging dir is left";
  ASSERT_ERROR(store.buildDebootstrap(ref, "bookworm"), ErrorCode::kAlreadyExists);

  LayerMounter mounter(&store);
  auto image = mounter.acquire({ref});
  if (!image.ok() && image.error().code() == ErrorCode::kUnsupported) GTEST_SKIP() << image.error().message();
  ASSERT_OK(image);
  std::string root = (*image)->dirs()[0];
  ASSERT_EQ(::stat((root + "/usr/bin/apt").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  auto sources = readFile(root + "/etc/apt/sources.list");
  ASSERT_OK(sources);
  EXPECT_NE(sources->find("bookworm main"), std::string::npos) << *sources;
  auto resolv = readFile(root + "/etc/resolv.conf");
  ASSERT_OK(resolv);
  EXPECT_EQ(*resolv, "") << "the build host's resolver is not baked into the layer";
  auto hostname = readFile(root + "/etc/hostname");
  ASSERT_OK(hostname);
  EXPECT_EQ(*hostname, "localhost\n");
  // No staging dirs left behind.
  auto list = store.list();
  ASSERT_OK(list);
  EXPECT_EQ(list->size(), 1u);
}

}  // namespace
}  // namespace dsec::fs3
