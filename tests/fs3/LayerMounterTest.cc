#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "LayerTestUtil.h"
#include "dsec/common/Fault.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/LayerMounter.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::fs3 {
namespace {

using ::dsec::testing::TempDir;
using namespace ::dsec::fs3::testing;

bool pathExists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

class LayerMounterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DSEC_SKIP_UNLESS_IMAGES();
    ASSERT_OK(store_.init());
    ASSERT_OK(makeSampleTree(tmp_.path() + "/sample"));
    ASSERT_OK(store_.buildFromDir(sample_, tmp_.path() + "/sample", "", ""));
    // Probe once: a kernel without file-backed EROFS skips the mount tests, saying so.
    mounter_ = std::make_unique<LayerMounter>(&store_);
    auto probe = mounter_->acquire({sample_});
    if (!probe.ok() && probe.error().code() == ErrorCode::kUnsupported) GTEST_SKIP() << probe.error().message();
    ASSERT_OK(probe);
  }
  void TearDown() override { mounter_.reset(); }

  // Builds layer ref from a tree made by fill(dir).
  template <typename Fill>
  void buildLayer(const LayerRef& ref, Fill fill) {
    std::string dir = tmp_.path() + "/src-" + ref.name + "-" + ref.version;
    ASSERT_OK(makeDirs(dir));
    fill(dir);
    ASSERT_OK(store_.buildFromDir(ref, dir, "", ""));
  }

  TempDir tmp_;  // first: destroyed last, after every mount is gone
  LayerStore store_{tmp_.path() + "/store"};
  LayerRef sample_{"sample", "1"};
  std::unique_ptr<LayerMounter> mounter_;
};

TEST_F(LayerMounterTest, SharesOneReadOnlyMountAndUnmountsAfterTheLastRelease) {
  std::string dir = mounter_->mountPoint(sample_);
  EXPECT_EQ(dir, tmp_.path() + "/store/mnt/sample/1");
  EXPECT_EQ(mounter_->refCount(sample_), 0) << "the probe in SetUp was released";
  EXPECT_FALSE(mounter_->isMounted(sample_));
  EXPECT_EQ(countMountsAt(dir), 0);

  auto a = mounter_->acquire({sample_});
  ASSERT_OK(a);
  auto b = mounter_->acquire({sample_});
  ASSERT_OK(b);
  EXPECT_EQ(mounter_->refCount(sample_), 2);
  EXPECT_TRUE(mounter_->isMounted(sample_));
  EXPECT_EQ(countMountsAt(dir), 1) << "one mount per layer per node";
  EXPECT_EQ((*a)->dirs(), std::vector<std::string>{dir});
  EXPECT_EQ((*b)->layers(), std::vector<LayerRef>{sample_});

  auto mounts = mountsUnder(dir);
  ASSERT_OK(mounts);
  ASSERT_EQ(mounts->size(), 1u);
  EXPECT_EQ((*mounts)[0].fs_type, "erofs");
  EXPECT_EQ((*mounts)[0].source, store_.imagePath(sample_)) << "file-backed, no loop device";
  for (const char* opt : {"ro", "nosuid", "nodev"}) {
    EXPECT_NE(("," + (*mounts)[0].options + ",").find(std::string(",") + opt + ","), std::string::npos)
        << (*mounts)[0].options;
  }

  // Everything the tree had survives mkfs + mount.
  auto hello = readFile(dir + "/hello.txt");
  ASSERT_OK(hello);
  EXPECT_EQ(*hello, "hello\n");
  auto sub = readFile(dir + "/sub/file.txt");
  ASSERT_OK(sub);
  EXPECT_EQ(*sub, "in sub\n");
  char target[64] = {};
  ASSERT_GT(::readlink((dir + "/link").c_str(), target, sizeof(target) - 1), 0);
  EXPECT_STREQ(target, "hello.txt");
  struct stat st {};
  ASSERT_EQ(::lstat((dir + "/gone").c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_EQ(st.st_rdev, makedev(0, 0));
  char value[8] = {};
  ASSERT_EQ(::getxattr((dir + "/opaque").c_str(), "trusted.overlay.opaque", value, sizeof(value)), 1);
  EXPECT_EQ(value[0], 'y');
  ASSERT_EQ(::stat((dir + "/secret.sh").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0750u);
  EXPECT_EQ(st.st_uid, 1234u);
  EXPECT_EQ(st.st_gid, 5678u);
  ASSERT_EQ(::stat((dir + "/hello.txt").c_str(), &st), 0);
  EXPECT_EQ(st.st_mtime, kSampleMtime) << "mtimes are kept (Python's .pyc checks depend on them)";

  // Read-only: neither new files nor changes.
  int fd = ::open((dir + "/new.txt").c_str(), O_WRONLY | O_CREAT, 0644);
  EXPECT_EQ(fd, -1);
  EXPECT_EQ(errno, EROFS);
  fd = ::open((dir + "/hello.txt").c_str(), O_WRONLY);
  EXPECT_EQ(fd, -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_NE(::chmod((dir + "/hello.txt").c_str(), 0777), 0);

  a->reset();
  EXPECT_EQ(mounter_->refCount(sample_), 1);
  EXPECT_EQ(countMountsAt(dir), 1);
  b->reset();
  EXPECT_EQ(mounter_->refCount(sample_), 0);
  EXPECT_EQ(countMountsAt(dir), 0);
  EXPECT_FALSE(pathExists(dir)) << "the mount dir goes with the mount";
}

TEST_F(LayerMounterTest, MissingLayerIsNotFoundAndLeavesNoReferences) {
  auto r = mounter_->acquire({sample_, {"missing", "3"}});
  ASSERT_ERROR(r, ErrorCode::kNotFound);
  EXPECT_NE(r.error().message().find("missing:3"), std::string::npos) << r.error().message();
  EXPECT_EQ(mounter_->refCount(sample_), 0);
  EXPECT_EQ(countMountsAt(mounter_->mountPoint(sample_)), 0) << "the mount made for the first layer is undone";
  // With the layer already held by someone else, a failed acquire gives back only its own reference.
  auto held = mounter_->acquire({sample_});
  ASSERT_OK(held);
  ASSERT_ERROR(mounter_->acquire({sample_, {"missing", "3"}}), ErrorCode::kNotFound);
  EXPECT_EQ(mounter_->refCount(sample_), 1);
  EXPECT_EQ(countMountsAt(mounter_->mountPoint(sample_)), 1);
  ASSERT_ERROR(mounter_->acquire({}), ErrorCode::kInvalidArgument);
  ASSERT_ERROR(mounter_->acquire({sample_, sample_}), ErrorCode::kInvalidArgument);
  EXPECT_EQ(mounter_->refCount(sample_), 1);
}

TEST_F(LayerMounterTest, FailedMountGivesBackEveryReferenceOfTheImage) {
  LayerRef other{"other", "1"};
  buildLayer(other, [](const std::string& d) { ASSERT_OK(writeSample(d + "/x", "x")); });
  auto held = mounter_->acquire({sample_});
  ASSERT_OK(held);
  armFault("fs3.mount_layer");
  auto r = mounter_->acquire({sample_, other});
  armFault("");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("fs3.mount_layer"), std::string::npos) << r.error().message();
  EXPECT_EQ(mounter_->refCount(sample_), 1);
  EXPECT_EQ(mounter_->refCount(other), 0);
  EXPECT_EQ(countMountsAt(mounter_->mountPoint(other)), 0);
  EXPECT_FALSE(pathExists(mounter_->mountPoint(other)));
  EXPECT_FALSE(pathExists(tmp_.path() + "/store/mnt/other"));
  // Cold (nothing mounted yet) it fails cleanly as well, and works once the fault is gone.
  held->reset();
  armFault("fs3.mount_layer");
  ASSERT_FALSE(mounter_->acquire({sample_, other}).ok());
  armFault("");
  EXPECT_EQ(countMountsAt(mounter_->mountPoint(sample_)), 0);
  ASSERT_OK(mounter_->acquire({sample_, other}));
}

TEST_F(LayerMounterTest, UnmountUnusedCleansStaleMountsAndKeepsHeldOnes) {
  LayerRef other{"other", "1"};
  buildLayer(other, [](const std::string& d) { ASSERT_OK(writeSample(d + "/x", "x")); });
  // A mount left by an agent that was killed: same place, nobody holds it.
  std::string stale = mounter_->mountPoint(sample_);
  ASSERT_OK(makeDirs(stale));
  ASSERT_EQ(::mount(store_.imagePath(sample_).c_str(), stale.c_str(), "erofs", MS_RDONLY, nullptr), 0);
  ASSERT_EQ(countMountsAt(stale), 1);
  auto held = mounter_->acquire({other});
  ASSERT_OK(held);
  ASSERT_OK(mounter_->unmountUnused());
  EXPECT_EQ(countMountsAt(stale), 0);
  EXPECT_FALSE(pathExists(stale));
  EXPECT_EQ(countMountsAt(mounter_->mountPoint(other)), 1) << "a held layer stays";
  EXPECT_EQ(mounter_->refCount(other), 1);
}

TEST_F(LayerMounterTest, ReusesAMountLeftByAnEarlierAgent) {
  std::string dir = mounter_->mountPoint(sample_);
  ASSERT_OK(makeDirs(dir));
  ASSERT_EQ(::mount(store_.imagePath(sample_).c_str(), dir.c_str(), "erofs", MS_RDONLY, nullptr), 0);
  auto a = mounter_->acquire({sample_});
  ASSERT_OK(a);
  EXPECT_EQ(countMountsAt(dir), 1) << "not mounted twice";
  EXPECT_EQ(mounter_->refCount(sample_), 1);
  auto hello = readFile(dir + "/hello.txt");
  ASSERT_OK(hello);
  a->reset();
  EXPECT_EQ(countMountsAt(dir), 0);
}

TEST_F(LayerMounterTest, StoreRefusesToRemoveAMountedLayer) {
  auto a = mounter_->acquire({sample_});
  ASSERT_OK(a);
  ASSERT_ERROR(store_.remove(sample_), ErrorCode::kConflict);
  EXPECT_TRUE(store_.exists(sample_));
  a->reset();
  ASSERT_OK(store_.remove(sample_));
  ASSERT_ERROR(mounter_->acquire({sample_}), ErrorCode::kNotFound);
}

TEST_F(LayerMounterTest, OverlayOfTwoLayersHonoursWhiteoutsAndOpaqueDirs) {
  LayerRef base{"base", "1"};
  LayerRef top{"top", "1"};
  buildLayer(base, [](const std::string& d) {
    ASSERT_OK(makeDirs(d + "/etc"));
    ASSERT_OK(writeSample(d + "/etc/foo", "foo\n"));
    ASSERT_OK(writeSample(d + "/etc/keep", "keep\n"));
    ASSERT_OK(makeDirs(d + "/dir"));
    ASSERT_OK(writeSample(d + "/dir/x", "x\n"));
  });
  buildLayer(top, [](const std::string& d) {
    ASSERT_OK(makeDirs(d + "/etc"));
    ASSERT_OK(makeWhiteout(d + "/etc/foo"));
    ASSERT_OK(makeOpaqueDir(d + "/dir"));
    ASSERT_OK(writeSample(d + "/dir/y", "y\n"));
  });
  auto image = mounter_->acquire({base, top});
  ASSERT_OK(image);
  const auto& dirs = (*image)->dirs();
  ASSERT_EQ(dirs.size(), 2u);
  std::string merged = tmp_.path() + "/merged";
  ASSERT_OK(makeDirs(merged));
  std::string opts = "lowerdir=" + dirs[1] + ":" + dirs[0];  // top first
  ASSERT_EQ(::mount("overlay", merged.c_str(), "overlay", MS_RDONLY, opts.c_str()), 0) << strerror(errno);
  EXPECT_FALSE(pathExists(merged + "/etc/foo")) << "the whiteout in the top layer hides the lower file";
  EXPECT_TRUE(pathExists(merged + "/etc/keep"));
  EXPECT_FALSE(pathExists(merged + "/dir/x")) << "the opaque dir hides the lower dir's entries";
  EXPECT_TRUE(pathExists(merged + "/dir/y"));
  ASSERT_EQ(::umount2(merged.c_str(), 0), 0);
  image->reset();
  EXPECT_EQ(countMountsAt(mounter_->mountPoint(base)), 0);
  EXPECT_EQ(countMountsAt(mounter_->mountPoint(top)), 0);
}

TEST_F(LayerMounterTest, ConcurrentAcquireAndReleaseKeepOneMount) {
  std::string dir = mounter_->mountPoint(sample_);
  auto keep = mounter_->acquire({sample_});  // held throughout: every other acquire takes the fast path
  ASSERT_OK(keep);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  double start = monotonicSeconds();
  for (int t = 0; t < 32; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        auto m = mounter_->acquire({sample_});
        if (!m.ok()) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  double per_acquire_us = (monotonicSeconds() - start) * 1e6 / (32 * 2000);
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(mounter_->refCount(sample_), 1);
  EXPECT_EQ(countMountsAt(dir), 1);
  EXPECT_LT(per_acquire_us, 200) << "the fast path is a map lookup";
  keep->reset();
  EXPECT_EQ(countMountsAt(dir), 0);

  // And from cold, with threads racing to mount and unmount: never two mounts, nothing left.
  threads.clear();
  std::atomic<int> max_mounts{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        auto m = mounter_->acquire({sample_});
        if (!m.ok()) ++failures;
        int n = countMountsAt(dir);
        int cur = max_mounts.load();
        while (n > cur && !max_mounts.compare_exchange_weak(cur, n)) {
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(max_mounts.load(), 1);
  EXPECT_EQ(mounter_->refCount(sample_), 0);
  EXPECT_EQ(countMountsAt(dir), 0);
}

TEST_F(LayerMounterTest, MountRootIsAPrivateMountRemovedWithTheMounter) {
  auto a = mounter_->acquire({sample_});
  ASSERT_OK(a);
  std::string mnt = tmp_.path() + "/store/mnt";
  EXPECT_EQ(countMountsAt(mnt), 1);
  a->reset();
  mounter_.reset();
  EXPECT_EQ(countMountsAt(mnt), 0);
}

}  // namespace
}  // namespace dsec::fs3
