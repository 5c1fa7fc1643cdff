// On-demand layers through the real FUSE file system: a layer pushed to a shared store is mounted (file-backed
// EROFS over the FUSE file) without being copied, reads are verified, a corrupt chunk is an I/O error, and the
// chunks a start touched are recorded.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <random>
#include <thread>

#include "LayerTestUtil.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/ChunkStore.h"
#include "dsec/fs3/LayerStore.h"
#include "dsec/fs3/LazyLayerFs.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::fs3 {
namespace {

using ::dsec::testing::TempDir;
using namespace ::dsec::fs3::testing;

class LazyLayerFsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DSEC_SKIP_UNLESS_IMAGES();
    if (::access("/dev/fuse", R_OK | W_OK) != 0) GTEST_SKIP() << "no /dev/fuse (FUSE is not available)";
    // A layer with a small file and a 2 MiB one, built and pushed to a shared store.
    std::string tree = tmp_.path() + "/tree";
    ASSERT_OK(makeSampleTree(tree));
    big_ = randomBytes(2 << 20, 7);
    ASSERT_OK(writeFile(tree + "/big.bin", big_));
    ASSERT_OK(local_.init());
    auto built = local_.buildFromDir(ref_, tree, "", "dir:test");
    ASSERT_OK(built);
    ASSERT_OK(makeDirs(shared_.dir()));
    ASSERT_OK(shared_.init());
    ASSERT_OK(shared_.push(*built, local_.imagePath(ref_)));
    auto stored = shared_.get(ref_);
    ASSERT_OK(stored);
    stored_ = *stored;
    cache_ = std::make_shared<ChunkCache>(tmp_.path() + "/cache", 64 << 20,
                                          std::make_shared<StoreChunkSource>(shared_.dir(), 10));
    ASSERT_OK(cache_->init());
    auto fs = LazyLayerFs::mount(tmp_.path() + "/lazy", cache_);
    if (!fs.ok() && fs.error().code() == ErrorCode::kUnsupported) GTEST_SKIP() << fs.error().message();
    ASSERT_OK(fs);
    fs_ = std::move(fs).value();
  }
  void TearDown() override {
    if (!erofs_.empty()) ::umount2(erofs_.c_str(), MNT_DETACH);
    fs_.reset();
  }

  // Mounts the layer's FUSE file as EROFS, as LayerMounter does.
  std::string mountLayer(const std::string& file) {
    erofs_ = tmp_.path() + "/mnt";
    EXPECT_TRUE(makeDirs(erofs_).ok());
    EXPECT_EQ(::mount(file.c_str(), erofs_.c_str(), "erofs", MS_RDONLY | MS_NODEV | MS_NOSUID, nullptr), 0)
        << strerror(errno);
    return erofs_;
  }

  TempDir tmp_;
  LayerStore local_{tmp_.path() + "/local"};
  ChunkStore shared_{tmp_.path() + "/shared"};
  LayerRef ref_{"sample", "1"};
  StoredLayer stored_;
  std::string big_;
  std::shared_ptr<ChunkCache> cache_;
  std::unique_ptr<LazyLayerFs> fs_;
  std::string erofs_;
};

TEST_F(LazyLayerFsTest, ALayerOfTheStoreMountsWithoutACopyAndReadsOnlyWhatItTouches) {
  auto file = fs_->attach(stored_);
  ASSERT_OK(file);
  EXPECT_EQ(*file, tmp_.path() + "/lazy/sample@1.erofs");
  EXPECT_EQ(fs_->filePath(ref_), *file);
  struct stat st {};
  ASSERT_EQ(::stat(file->c_str(), &st), 0);
  EXPECT_EQ(st.st_size, stored_.layer.size);
  EXPECT_EQ(st.st_mode & 0777, 0444u);
  EXPECT_LT(::open(file->c_str(), O_WRONLY | O_CLOEXEC), 0);  // read-only

  std::string dir = mountLayer(*file);
  EXPECT_EQ(*readFile(dir + "/hello.txt"), "hello\n");
  EXPECT_EQ(*readFile(dir + "/sub/file.txt"), "in sub\n");
  auto touched = fs_->touchedChunks(ref_);
  EXPECT_FALSE(touched.empty());
  // The 2 MiB file was not read: far from every chunk was fetched.
  EXPECT_LT(cache_->stats().bytes_fetched, stored_.layer.size / 2) << touched.size() << " chunks touched";
  EXPECT_EQ(*readFile(dir + "/big.bin"), big_);
  EXPECT_GT(fs_->touchedChunks(ref_).size(), touched.size());
  EXPECT_EQ(sha256sumOf(*file), stored_.layer.sha256);  // the whole file is the layer's image
  EXPECT_EQ(cache_->stats().corrupt, 0);
}

TEST_F(LazyLayerFsTest, ACorruptChunkInTheStoreIsAnIoErrorNotWrongData) {
  // Damage one chunk of big.bin's data (the middle of the image) in the store.
  size_t victim = stored_.chunks.size() / 2;
  std::string path = shared_.chunkPath(stored_.chunks[victim]);
  std::string bytes = *readFile(path);
  bytes[100] = static_cast<char>(bytes[100] ^ 0x5a);
  ASSERT_OK(writeFile(path, bytes));
  int failures = 0;
  cache_->onFailure([&](const std::string&, const std::string&) { ++failures; });
  auto file = fs_->attach(stored_);
  ASSERT_OK(file);
  UniqueFd fd(::open(file->c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(fd);
  char buf[4096];
  off_t at = static_cast<off_t>(victim) * static_cast<off_t>(stored_.chunk_size);
  EXPECT_EQ(::pread(fd.get(), buf, sizeof buf, at), -1);
  EXPECT_EQ(errno, EIO);
  EXPECT_GE(failures, 1);
  EXPECT_GE(cache_->stats().corrupt, 1);
  // The chunks around it read fine.
  EXPECT_EQ(::pread(fd.get(), buf, sizeof buf, 0), static_cast<ssize_t>(sizeof buf));
}

TEST_F(LazyLayerFsTest, AReadWaitsOutAStoreThatVanishesForAMoment) {
  auto file = fs_->attach(stored_);
  ASSERT_OK(file);
  const std::string away = tmp_.path() + "/shared-away";
  ASSERT_EQ(::rename(shared_.dir().c_str(), away.c_str()), 0);
  std::thread back([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    (void)::rename(away.c_str(), shared_.dir().c_str());
  });
  std::string dir = mountLayer(*file);  // reads the superblock while the store is away
  auto big = readFile(dir + "/big.bin");
  back.join();
  ASSERT_OK(big);
  EXPECT_EQ(*big, big_);
}

}  // namespace
}  // namespace dsec::fs3
