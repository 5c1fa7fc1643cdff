// Removing layers from the shared store and collecting its unreferenced chunks: only what no manifest names, only
// when older than the grace period, and never while a live lease of a node stands in the way.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <random>

#include "LayerTestUtil.h"
#include "dsec/common/Directory.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/StoreMaintenance.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::fs3 {
namespace {

using ::dsec::fs3::testing::randomBytes;
using ::dsec::testing::TempDir;

class StoreMaintenanceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK(makeDirs(store_.dir()));
    // a:1 and b:1 share their first two chunks; each has two of its own.
    std::string shared = randomBytes(2 * kDefaultChunkSize, 1);
    push({"a", "1"}, shared + randomBytes(2 * kDefaultChunkSize, 2));
    push({"b", "1"}, shared + randomBytes(2 * kDefaultChunkSize, 3));
  }
  void push(const LayerRef& ref, const std::string& bytes) {
    std::string path = tmp_.path() + "/" + ref.name + ".img";
    ASSERT_OK(writeFile(path, bytes));
    LayerManifest m;
    m.ref = ref;
    m.sha256 = sha256Hex(bytes);
    m.size = static_cast<int64_t>(bytes.size());
    m.created = "2026-12-07T00:00:00Z";
    ASSERT_OK(store_.push(m, path));
  }
  // Makes every chunk look written long ago (past any grace period).
  void ageChunks() {
    auto layers = store_.list();
    ASSERT_OK(layers);
    for (const auto& l : *layers) {
      for (const auto& c : l.chunks) {
        struct timespec old[2] = {{1000000000, 0}, {1000000000, 0}};
        ASSERT_EQ(::utimensat(AT_FDCWD, store_.chunkPath(c).c_str(), old, 0), 0);
      }
    }
  }
  int chunkFiles() {
    int n = 0;
    auto prefixes = listDirectory(store_.dir() + "/chunks");
    if (!prefixes.ok()) return -1;
    for (const auto& p : *prefixes) {
      auto files = listDirectory(store_.dir() + "/chunks/" + p.name);
      n += files.ok() ? static_cast<int>(files->size()) : 0;
    }
    return n;
  }

  TempDir tmp_;
  ChunkStore store_{tmp_.path() + "/store"};
};

TEST_F(StoreMaintenanceTest, GcRemovesOnlyChunksNoManifestNamesAndOlderThanTheGrace) {
  ageChunks();
  EXPECT_EQ(chunkFiles(), 6);
  ASSERT_OK(removeStoredLayer(store_, {"b", "1"}));
  EXPECT_FALSE(store_.exists({"b", "1"}));
  EXPECT_EQ(removeStoredLayer(store_, {"b", "1"}).error().code(), ErrorCode::kNotFound);
  // A chunk a push just wrote (its manifest not there yet) is younger than the grace: kept.
  std::string fresh = randomBytes(4096, 9);
  std::string fresh_sha = sha256Hex(fresh);
  ASSERT_OK(makeDirs(store_.dir() + "/chunks/" + fresh_sha.substr(0, 2)));
  ASSERT_OK(writeFile(store_.chunkPath(fresh_sha), fresh));

  auto dry = collectGarbage(store_, 3600, /*dry_run=*/true);
  ASSERT_OK(dry);
  EXPECT_EQ(dry->chunks_removed, 2);
  EXPECT_EQ(chunkFiles(), 7);  // nothing removed
  auto gc = collectGarbage(store_, 3600, /*dry_run=*/false);
  ASSERT_OK(gc);
  EXPECT_EQ(gc->chunks_removed, 2);
  EXPECT_EQ(gc->bytes_removed, 2 * kDefaultChunkSize);
  EXPECT_EQ(gc->chunks_kept, 4);
  EXPECT_EQ(gc->chunks_too_new, 1);
  // a:1 is whole.
  auto a = store_.get({"a", "1"});
  ASSERT_OK(a);
  for (const auto& c : a->chunks) EXPECT_EQ(::access(store_.chunkPath(c).c_str(), F_OK), 0);
}

TEST_F(StoreMaintenanceTest, ALiveLeaseStopsRemovalAndAGcThatWouldBreakIt) {
  ASSERT_OK(writeLease(store_, {LayerRef{"a", "1"}}));
  auto leases = liveLeases(store_);
  ASSERT_OK(leases);
  ASSERT_EQ(leases->size(), 1u);
  EXPECT_EQ(leases->front().layers, std::vector<LayerRef>{LayerRef({"a", "1"})});
  auto refused = removeStoredLayer(store_, {"a", "1"});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), ErrorCode::kConflict);
  EXPECT_TRUE(store_.exists({"a", "1"}));

  // A node still using a layer someone removed by hand: gc refuses, naming it.
  ASSERT_OK(removeTree(store_.dir() + "/layers/a"));
  auto gc = collectGarbage(store_, 0, false);
  ASSERT_FALSE(gc.ok());
  EXPECT_EQ(gc.error().code(), ErrorCode::kConflict);
  EXPECT_NE(gc.error().message().find("a:1"), std::string::npos) << gc.error().message();

  // A lease not refreshed for longer than kLeaseFreshSeconds is a dead node's: ignored.
  std::string file = leases->front().file;
  struct timespec old[2] = {{::time(nullptr) - 120, 0}, {::time(nullptr) - 120, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, file.c_str(), old, 0), 0);
  EXPECT_TRUE(liveLeases(store_)->empty());
  EXPECT_OK(collectGarbage(store_, 0, false));
  removeLease(store_);
  EXPECT_NE(::access(file.c_str(), F_OK), 0);
}

TEST_F(StoreMaintenanceTest, AnUnreadableManifestStopsGcRatherThanLosingItsChunks) {
  ageChunks();
  ASSERT_OK(writeFile(store_.manifestPath({"b", "1"}), "{ torn"));
  auto gc = collectGarbage(store_, 0, false);
  ASSERT_FALSE(gc.ok());
  EXPECT_EQ(gc.error().sysErrno(), EIO);
  EXPECT_EQ(chunkFiles(), 6);
}

}  // namespace
}  // namespace dsec::fs3
