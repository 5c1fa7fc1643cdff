// Recorded prefetch through a node's shared layers: the first start of a layer is recorded into the store (or, where
// the node cannot write it, into the node's cache dir), and a later node's first mount fetches those chunks before
// its sandbox asks for them.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <thread>

#include "LayerTestUtil.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/LayerStore.h"
#include "dsec/fs3/Prefetch.h"
#include "dsec/fs3/SharedLayers.h"
#include "dsec/fs3/StoreMaintenance.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::fs3 {
namespace {

using ::dsec::testing::TempDir;
using namespace ::dsec::fs3::testing;

template <typename Pred>
bool eventually(Pred pred, double seconds = 20) {
  for (const double deadline = monotonicSeconds() + seconds; monotonicSeconds() < deadline;) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return pred();
}

class SharedLayersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DSEC_SKIP_UNLESS_IMAGES();
    if (::access("/dev/fuse", R_OK | W_OK) != 0) GTEST_SKIP() << "no /dev/fuse (FUSE is not available)";
    std::string tree = tmp_.path() + "/tree";
    ASSERT_OK(makeSampleTree(tree));
    ASSERT_OK(writeFile(tree + "/big.bin", randomBytes(3 << 20, 9)));
    ASSERT_OK(local_.init());
    auto built = local_.buildFromDir(ref_, tree, "", "dir:test");
    ASSERT_OK(built);
    ASSERT_OK(makeDirs(store_.dir()));
    ASSERT_OK(store_.push(*built, local_.imagePath(ref_)));
  }
  void TearDown() override {
    for (const auto& m : mounts_) ::umount2(m.c_str(), MNT_DETACH);
  }

  Result<std::unique_ptr<SharedLayers>> openNode(const std::string& name, const std::string& store_dir) {
    SharedLayersOptions o;
    o.store_dir = store_dir;
    o.cache_dir = tmp_.path() + "/" + name + "/chunk-cache";
    o.mountpoint = tmp_.path() + "/" + name + "/lazy";
    o.record_settle_seconds = 0.3;
    return SharedLayers::open(o);
  }
  // Mounts the layer's on-demand file as EROFS (as the layer mounter does) and returns the mount point.
  std::string mountLayer(SharedLayers& shared, const std::string& name) {
    auto file = shared.fileFor(ref_);
    EXPECT_TRUE(file.ok()) << (file.ok() ? "" : file.error().message());
    std::string dir = tmp_.path() + "/" + name + "/mnt";
    EXPECT_TRUE(makeDirs(dir).ok());
    EXPECT_EQ(::mount(file->c_str(), dir.c_str(), "erofs", MS_RDONLY | MS_NODEV | MS_NOSUID, nullptr), 0)
        << strerror(errno);
    mounts_.push_back(dir);
    return dir;
  }
  void unmountAll() {
    for (const auto& m : mounts_) ::umount2(m.c_str(), MNT_DETACH);
    mounts_.clear();
  }

  TempDir tmp_;
  LayerStore local_{tmp_.path() + "/local"};
  ChunkStore store_{tmp_.path() + "/store"};
  DirectoryStore shared_store_{tmp_.path() + "/store"};
  LayerRef ref_{"sample", "1"};
  std::vector<std::string> mounts_;
};

TEST_F(SharedLayersTest, TheFirstStartIsRecordedAndALaterNodePrefetchesItBeforeItsSandboxReads) {
  std::vector<size_t> touched;
  {
    auto first = openNode("first", store_.dir());
    ASSERT_OK(first);
    std::string dir = mountLayer(**first, "first");
    // The node's lease names the layer while it uses it (gc and removal elsewhere see it).
    auto leases = liveLeases(store_);
    ASSERT_OK(leases);
    ASSERT_EQ(leases->size(), 1u);
    EXPECT_EQ(leases->front().layers, std::vector<LayerRef>{ref_});
    EXPECT_EQ(removeStoredLayer(store_, ref_).error().code(), ErrorCode::kConflict);
    EXPECT_EQ(*readFile(dir + "/hello.txt"), "hello\n");
    EXPECT_EQ(*readFile(dir + "/sub/file.txt"), "in sub\n");
    // Quiet for the settle time: the recording goes to the store.
    ASSERT_TRUE(eventually([&] { return (*first)->prefetchStats().recordings_written == 1; }));
    touched = (*first)->fs().touchedChunks(ref_);
    unmountAll();
  }
  EXPECT_TRUE(liveLeases(store_)->empty());  // gone with the node
  auto stored = store_.get(ref_);
  ASSERT_OK(stored);
  auto recorded = readRecording(shared_store_, "", *stored);
  ASSERT_TRUE(recorded.has_value());
  EXPECT_EQ(*recorded, touched);
  EXPECT_LT(recorded->size(), stored->chunks.size() / 2);  // big.bin was not read

  // A second node: its first mount prefetches the recorded chunks in the background.
  auto second = openNode("second", store_.dir());
  ASSERT_OK(second);
  auto file = (*second)->fileFor(ref_);
  ASSERT_OK(file);
  ASSERT_TRUE(eventually([&] {
    return (*second)->prefetchStats().chunks_prefetched == static_cast<int64_t>(recorded->size());
  })) << (*second)->prefetchStats().chunks_prefetched
      << " of " << recorded->size();
  EXPECT_EQ((*second)->prefetchStats().prefetches, 1);
  int64_t misses = (*second)->cacheStats().misses;
  std::string dir = mountLayer(**second, "second");
  EXPECT_EQ(*readFile(dir + "/hello.txt"), "hello\n");
  EXPECT_EQ(*readFile(dir + "/sub/file.txt"), "in sub\n");
  EXPECT_EQ((*second)->cacheStats().misses, misses) << "the start read a chunk the prefetch had not fetched";
  EXPECT_EQ((*second)->prefetchStats().recordings_written, 0);  // it had one: nothing recorded again
}

TEST_F(SharedLayersTest, ANodeThatCannotWriteTheStoreKeepsItsRecordingToItself) {
  // The store through a read-only bind mount, as a node that may only read it sees it.
  std::string view = tmp_.path() + "/store-ro";
  ASSERT_OK(makeDirs(view));
  ASSERT_EQ(::mount(store_.dir().c_str(), view.c_str(), nullptr, MS_BIND, nullptr), 0) << strerror(errno);
  mounts_.push_back(view);
  ASSERT_EQ(::mount(nullptr, view.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr), 0) << strerror(errno);
  {
    auto node = openNode("reader", view);
    ASSERT_OK(node);
    std::string dir = mountLayer(**node, "reader");
    EXPECT_EQ(*readFile(dir + "/hello.txt"), "hello\n");
    ASSERT_TRUE(eventually([&] { return (*node)->prefetchStats().recordings_written == 1; }));
    ::umount2(dir.c_str(), MNT_DETACH);
  }
  auto stored = store_.get(ref_);
  ASSERT_OK(stored);
  EXPECT_FALSE(readRecording(shared_store_, "", *stored).has_value());  // not in the store
  EXPECT_TRUE(readRecording(shared_store_, tmp_.path() + "/reader/chunk-cache", *stored).has_value());
}

TEST_F(SharedLayersTest, ARecordingOfOtherBytesOrDamagedIsNotUsed) {
  auto stored = store_.get(ref_);
  ASSERT_OK(stored);
  ASSERT_OK(writeRecording(shared_store_, "", *stored, {0, 1}));
  ASSERT_TRUE(readRecording(shared_store_, "", *stored).has_value());
  std::string path = storeRecordingPath(store_, ref_);
  std::string text = *readFile(path);
  ASSERT_OK(writeFile(path, text.replace(text.find("[0,1]"), 5, "[0,2]")));
  EXPECT_FALSE(readRecording(shared_store_, "", *stored).has_value());  // checksum
  StoredLayer other = *stored;
  other.layer.sha256 = std::string(64, 'b');
  ASSERT_OK(writeRecording(shared_store_, "", other, {0}));
  EXPECT_FALSE(readRecording(shared_store_, "", *stored).has_value());  // recorded for other bytes
}

}  // namespace
}  // namespace dsec::fs3
