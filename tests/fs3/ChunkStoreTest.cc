// The shared store's format: chunks named by their sha256, stored once across layers and versions, and manifests
// that are checked (checksum, shape, name) before anything uses them.
#include <gtest/gtest.h>

#include <random>

#include "LayerTestUtil.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/ChunkStore.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::fs3 {
namespace {

using ::dsec::fs3::testing::randomBytes;
using ::dsec::testing::TempDir;

class ChunkStoreTest : public ::testing::Test {
 protected:
  // A layer manifest for an image file holding bytes (as the node's layer store would have made it).
  LayerManifest imageOf(const LayerRef& ref, const std::string& bytes) {
    std::string path = tmp_.path() + "/" + ref.name + "-" + ref.version + ".erofs";
    EXPECT_TRUE(writeFile(path, bytes).ok());
    LayerManifest m;
    m.ref = ref;
    m.sha256 = sha256Hex(bytes);
    m.size = static_cast<int64_t>(bytes.size());
    m.created = "2026-12-07T00:00:00Z";
    m.source = "test";
    paths_[ref.toString()] = path;
    return m;
  }
  std::string pathOf(const LayerRef& ref) { return paths_[ref.toString()]; }

  TempDir tmp_;
  ChunkStore store_{tmp_.path() + "/store"};
  std::map<std::string, std::string> paths_;
};

TEST_F(ChunkStoreTest, PushCutsTheImageIntoChunksAndStoresSharedOnesOnce) {
  ASSERT_OK(makeDirs(store_.dir()));
  const int64_t chunk = kDefaultChunkSize;
  std::string v1 = randomBytes(8 * chunk + 100, 1);
  // Version 2 shares its first five chunks with version 1 and differs after.
  std::string v2 = v1.substr(0, 5 * chunk) + randomBytes(4 * chunk, 2);
  LayerManifest m1 = imageOf({"ws", "1"}, v1);
  LayerManifest m2 = imageOf({"ws", "2"}, v2);

  auto p1 = store_.push(m1, pathOf(m1.ref));
  ASSERT_OK(p1);
  EXPECT_EQ(p1->chunks_total, 9);
  EXPECT_EQ(p1->chunks_new, 9);
  EXPECT_EQ(p1->bytes_new, static_cast<int64_t>(v1.size()));
  EXPECT_EQ(p1->stored.chunkLength(8), 100);
  auto p2 = store_.push(m2, pathOf(m2.ref));
  ASSERT_OK(p2);
  EXPECT_EQ(p2->chunks_total, 9);
  EXPECT_EQ(p2->chunks_new, 4);
  EXPECT_EQ(p2->bytes_new, 4 * chunk);

  // Chunks are the image's bytes, named by their hash.
  auto got = store_.get(m2.ref);
  ASSERT_OK(got);
  std::string joined;
  for (size_t i = 0; i < got->chunks.size(); ++i) {
    auto bytes = readFile(store_.chunkPath(got->chunks[i]));
    ASSERT_OK(bytes);
    EXPECT_EQ(sha256Hex(*bytes), got->chunks[i]);
    joined += *bytes;
  }
  EXPECT_EQ(joined, v2);

  auto stats = store_.stats();
  ASSERT_OK(stats);
  EXPECT_EQ(stats->layers, 2);
  EXPECT_EQ(stats->chunks, 13);
  EXPECT_EQ(stats->logical_bytes, static_cast<int64_t>(v1.size() + v2.size()));
  EXPECT_EQ(stats->stored_bytes, static_cast<int64_t>(v1.size()) + 4 * chunk);
  EXPECT_NEAR(stats->dedupRatio(), static_cast<double>(v1.size() + v2.size()) / (v1.size() + 4 * chunk), 1e-9);

  auto all = store_.list();
  ASSERT_OK(all);
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].layer.ref.version, "1");
}

TEST_F(ChunkStoreTest, VersionsAreImmutableAndAPushIsCheckedAgainstItsManifest) {
  ASSERT_OK(makeDirs(store_.dir()));
  LayerManifest m = imageOf({"base", "1"}, randomBytes(300000, 3));
  ASSERT_OK(store_.push(m, pathOf(m.ref)));
  auto again = store_.push(m, pathOf(m.ref));
  ASSERT_OK(again);
  EXPECT_EQ(again->chunks_new, 0);

  LayerManifest other = imageOf({"base", "1"}, randomBytes(1000, 4));
  auto clash = store_.push(other, pathOf(other.ref));
  ASSERT_FALSE(clash.ok());
  EXPECT_EQ(clash.error().code(), ErrorCode::kAlreadyExists);

  LayerManifest lying = imageOf({"base", "2"}, randomBytes(1000, 5));
  lying.sha256 = std::string(64, 'a');
  auto refused = store_.push(lying, pathOf(lying.ref));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message().find("does not match"), std::string::npos) << refused.error().message();
  EXPECT_FALSE(store_.exists(lying.ref));  // no manifest for a refused push

  EXPECT_FALSE(store_.push(m, pathOf(m.ref), 1000).ok());  // not a multiple of 4 KiB
  EXPECT_EQ(store_.get({"missing", "1"}).error().code(), ErrorCode::kNotFound);
}

TEST_F(ChunkStoreTest, AManifestThatFailsItsChecksOrShapeIsCorruptNotUsed) {
  ASSERT_OK(makeDirs(store_.dir()));
  LayerManifest m = imageOf({"base", "1"}, randomBytes(3 * kDefaultChunkSize, 6));
  ASSERT_OK(store_.push(m, pathOf(m.ref)));
  const std::string path = store_.manifestPath(m.ref);
  const std::string good = *readFile(path);
  auto expectCorrupt = [&](const std::string& text, const std::string& why) {
    ASSERT_OK(writeFile(path, text));
    auto got = store_.get(m.ref);
    ASSERT_FALSE(got.ok()) << why;
    EXPECT_EQ(got.error().sysErrno(), EIO) << why;
    EXPECT_NE(got.error().message().find("corrupt"), std::string::npos) << got.error().message();
  };
  // A chunk swapped without updating the checksum.
  auto j = nlohmann::json::parse(good);
  j["chunks"][1] = j["chunks"][0];
  expectCorrupt(j.dump(), "chunk swapped");
  // A consistent checksum over an impossible shape: a missing chunk.
  StoredLayer s = *parseStoredLayer(good, "good");
  s.chunks.pop_back();
  expectCorrupt(s.toJson().dump(), "too few chunks");
  // Another layer's manifest in this one's place.
  s = *parseStoredLayer(good, "good");
  s.layer.ref.version = "2";
  expectCorrupt(s.toJson().dump(), "renamed");
  expectCorrupt(good.substr(0, good.size() / 2), "truncated");
  auto listed = store_.list();
  ASSERT_OK(listed);
  EXPECT_TRUE(listed->empty());  // a corrupt manifest is not listed
  ASSERT_OK(writeFile(path, good));
  EXPECT_OK(store_.get(m.ref));
}

}  // namespace
}  // namespace dsec::fs3
