// The node's chunk cache: fetch once, verify, keep within capacity (LRU), never use a corrupt chunk; and the store
// source's retries when the store goes away for a moment.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <random>
#include <thread>

#include "LayerTestUtil.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/ChunkCache.h"
#include "dsec/fs3/ChunkStore.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::fs3 {
namespace {

using ::dsec::fs3::testing::randomBytes;
using ::dsec::testing::TempDir;

// Chunks in memory; counts fetches; can lie about one chunk and be slow.
class FakeSource : public ChunkSource {
 public:
  std::string add(const std::string& bytes) {
    std::string sha = sha256Hex(bytes);
    chunks_[sha] = bytes;
    return sha;
  }
  Result<std::string> fetch(const std::string& sha256, int64_t /*length*/) override {
    ++fetches;
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    auto it = chunks_.find(sha256);
    if (it == chunks_.end()) return Error::sys(ENOENT, "no chunk");
    if (sha256 == corrupt) return it->second.substr(1) + "X";
    return it->second;
  }
  std::atomic<int> fetches{0};
  int delay_ms = 0;
  std::string corrupt;

 private:
  std::map<std::string, std::string> chunks_;
};

std::string readAll(ChunkCache& cache, const std::string& sha, int64_t length) {
  std::string out(static_cast<size_t>(length), '\0');
  auto n = cache.read(sha, length, 0, out.data(), out.size());
  if (!n.ok()) return "error: " + n.error().message();
  out.resize(*n);
  return out;
}

TEST(ChunkCacheTest, AChunkIsFetchedOnceVerifiedAndThenServedFromTheNodesDisk) {
  TempDir dir;
  auto source = std::make_shared<FakeSource>();
  std::string bytes = randomBytes(4096, 1);
  std::string sha = source->add(bytes);
  ChunkCache cache(dir.path() + "/cache", 1 << 20, source);
  ASSERT_OK(cache.init());
  EXPECT_EQ(readAll(cache, sha, 4096), bytes);
  EXPECT_EQ(readAll(cache, sha, 4096), bytes);
  char part[10];
  auto n = cache.read(sha, 4096, 4090, part, sizeof part);
  ASSERT_OK(n);
  EXPECT_EQ(*n, 6u);  // only what the chunk holds
  EXPECT_EQ(std::string(part, 6), bytes.substr(4090));
  EXPECT_EQ(source->fetches.load(), 1);
  auto s = cache.stats();
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.hits, 2);
  EXPECT_EQ(s.bytes_fetched, 4096);
  EXPECT_TRUE(cache.contains(sha));

  // A new cache over the same directory (a restarted node) finds it without fetching.
  ChunkCache again(dir.path() + "/cache", 1 << 20, source);
  ASSERT_OK(again.init());
  EXPECT_EQ(readAll(again, sha, 4096), bytes);
  EXPECT_EQ(source->fetches.load(), 1);
}

TEST(ChunkCacheTest, ACorruptChunkIsAnIoErrorAndReportedAndNeverKept) {
  TempDir dir;
  auto source = std::make_shared<FakeSource>();
  std::string sha = source->add(randomBytes(8192, 2));
  source->corrupt = sha;
  ChunkCache cache(dir.path() + "/cache", 1 << 20, source);
  ASSERT_OK(cache.init());
  std::vector<std::string> reported;
  cache.onFailure([&](const std::string& s, const std::string& what) { reported.push_back(s + ": " + what); });
  char buf[16];
  auto r = cache.read(sha, 8192, 0, buf, sizeof buf);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().sysErrno(), EIO);
  EXPECT_FALSE(cache.contains(sha));
  ASSERT_EQ(reported.size(), 1u);
  EXPECT_NE(reported[0].find("corrupt"), std::string::npos) << reported[0];
  EXPECT_EQ(cache.stats().corrupt, 1);
  // A wrong length is as corrupt as a wrong hash.
  source->corrupt.clear();
  EXPECT_FALSE(cache.read(sha, 8191, 0, buf, sizeof buf).ok());
  EXPECT_EQ(cache.stats().corrupt, 2);
  EXPECT_TRUE(cache.read(sha, 8192, 0, buf, sizeof buf).ok());
}

TEST(ChunkCacheTest, ASmallCacheEvictsTheLeastRecentlyUsedAndStillReadsRightBytes) {
  TempDir dir;
  auto source = std::make_shared<FakeSource>();
  std::vector<std::pair<std::string, std::string>> chunks;
  for (uint32_t i = 0; i < 6; ++i) {
    std::string bytes = randomBytes(4096, 10 + i);
    chunks.emplace_back(source->add(bytes), bytes);
  }
  ChunkCache cache(dir.path() + "/cache", int64_t{2} * 4096, source);  // two chunks
  ASSERT_OK(cache.init());
  for (int round = 0; round < 3; ++round) {
    for (const auto& [sha, bytes] : chunks) EXPECT_EQ(readAll(cache, sha, 4096), bytes);
  }
  auto s = cache.stats();
  EXPECT_LE(s.bytes_cached, int64_t{2} * 4096);
  EXPECT_EQ(s.chunks_cached, 2);
  EXPECT_EQ(s.evictions, 18 - 2);
  EXPECT_EQ(source->fetches.load(), 18);
  // The rounds leave chunks 4 and 5; 5 is used again, so 4 is the one that goes when 0 comes in.
  readAll(cache, chunks[5].first, 4096);
  readAll(cache, chunks[0].first, 4096);
  EXPECT_TRUE(cache.contains(chunks[5].first));
  EXPECT_FALSE(cache.contains(chunks[4].first));
}

TEST(ChunkCacheTest, ConcurrentFirstReadersOfAChunkShareOneFetch) {
  TempDir dir;
  auto source = std::make_shared<FakeSource>();
  std::string bytes = randomBytes(65536, 3);
  std::string sha = source->add(bytes);
  source->delay_ms = 200;
  ChunkCache cache(dir.path() + "/cache", 1 << 20, source);
  ASSERT_OK(cache.init());
  std::vector<std::thread> readers;
  std::atomic<int> right{0};
  for (int i = 0; i < 8; ++i) {
    readers.emplace_back([&] { right += readAll(cache, sha, 65536) == bytes ? 1 : 0; });
  }
  for (auto& t : readers) t.join();
  EXPECT_EQ(right.load(), 8);
  EXPECT_EQ(source->fetches.load(), 1);
}

TEST(ChunkCacheTest, TheStoreSourceWaitsOutAStoreThatIsGoneForAMomentThenGivesUp) {
  TempDir dir;
  ChunkStore store(dir.path() + "/store");
  ASSERT_OK(makeDirs(store.dir()));
  ASSERT_OK(store.init());
  std::string bytes = randomBytes(4096, 4);
  std::string sha = sha256Hex(bytes);
  ASSERT_OK(makeDirs(store.dir() + "/chunks/" + sha.substr(0, 2)));
  ASSERT_OK(writeFile(store.chunkPath(sha), bytes));

  StoreChunkSource source(store.dir(), 5);
  const std::string moved = dir.path() + "/store-away";
  ASSERT_EQ(::rename(store.dir().c_str(), moved.c_str()), 0);  // the store is gone ...
  std::thread back([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    (void)::rename(moved.c_str(), store.dir().c_str());  // ... and back
  });
  auto got = source.fetch(sha, 4096);
  back.join();
  ASSERT_OK(got);
  EXPECT_EQ(*got, bytes);

  StoreChunkSource impatient(store.dir(), 0.3);
  ASSERT_EQ(::rename(store.dir().c_str(), moved.c_str()), 0);
  double start = monotonicSeconds();
  auto gone = impatient.fetch(sha, 4096);
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.error().sysErrno(), EIO);
  EXPECT_LT(monotonicSeconds() - start, 3.0);
}

}  // namespace
}  // namespace dsec::fs3
