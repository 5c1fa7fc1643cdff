// The shared layer store against hostile users of the node and a hostile store (docs/security.md §7c): another
// user cannot read the on-demand layer files or the node's chunk cache, a manifest cannot name a path for a chunk,
// and a chunk that is a symlink (to a host file) is an I/O error, never bytes from elsewhere.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "dsec/common/Strings.h"
#include "dsec/fs3/ChunkCache.h"
#include "dsec/fs3/ChunkStore.h"
#include "dsec/fs3/LazyLayerFs.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::testing {
namespace {

using fs3::ChunkCache;
using fs3::ChunkStore;
using fs3::LazyLayerFs;
using fs3::StoredLayer;

constexpr uid_t kNobody = 65534;

// Whether uid can open path for reading (in a child that drops to it).
bool canRead(uid_t uid, const std::string& path) {
  pid_t pid = ::fork();
  if (pid == 0) {
    if (::setresgid(uid, uid, uid) != 0 || ::setresuid(uid, uid, uid) != 0) ::_exit(2);
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    ::_exit(fd >= 0 ? 0 : 1);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

class SharedStoreAttack : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = missingRoot(); !why.empty()) GTEST_SKIP() << why;
    ASSERT_OK(makeDirs(store_.dir()));
    std::string image = tmp_.path() + "/layer.img";
    bytes_ = std::string(300000, 'L');
    ASSERT_OK(writeFile(image, bytes_));
    fs3::LayerManifest m;
    m.ref = {"victim", "1"};
    m.sha256 = fs3::sha256Hex(bytes_);
    m.size = static_cast<int64_t>(bytes_.size());
    m.created = "2026-12-07T00:00:00Z";
    auto pushed = store_.push(m, image);
    ASSERT_OK(pushed);
    layer_ = pushed->stored;
    cache_ = std::make_shared<ChunkCache>(tmp_.path() + "/cache", 64 << 20,
                                          std::make_shared<fs3::StoreChunkSource>(store_.dir(), 0.2));
    ASSERT_OK(cache_->init());
  }

  TempDir tmp_;
  ChunkStore store_{tmp_.path() + "/store"};
  StoredLayer layer_;
  std::string bytes_;
  std::shared_ptr<ChunkCache> cache_;
};

TEST_F(SharedStoreAttack, AnotherUserCannotReadOnDemandLayersOrTheChunkCache) {
  if (::access("/dev/fuse", R_OK | W_OK) != 0) GTEST_SKIP() << "no /dev/fuse (FUSE is not available)";
  ASSERT_EQ(::chmod(tmp_.path().c_str(), 0755), 0);  // the test's own dir is not what keeps them out
  auto fs = LazyLayerFs::mount(tmp_.path() + "/lazy", cache_);
  if (!fs.ok() && fs.error().code() == ErrorCode::kUnsupported) GTEST_SKIP() << fs.error().message();
  ASSERT_OK(fs);
  auto file = (*fs)->attach(layer_);
  ASSERT_OK(file);
  ASSERT_TRUE(canRead(0, *file));  // root (the node) reads it: the probe works
  EXPECT_FALSE(canRead(kNobody, *file)) << "a node user read an on-demand layer's file";
  char buf[16];
  auto n = cache_->read(layer_.chunks[0], layer_.chunkLength(0), 0, buf, sizeof buf);
  ASSERT_OK(n);
  struct stat st {};
  ASSERT_EQ(::stat((tmp_.path() + "/cache").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  std::string chunk = tmp_.path() + "/cache/" + layer_.chunks[0].substr(0, 2) + "/" + layer_.chunks[0];
  EXPECT_FALSE(canRead(kNobody, chunk)) << "a node user read a cached chunk";
}

TEST_F(SharedStoreAttack, AManifestCannotNameAPathAsAChunk) {
  auto j = layer_.toJson();
  j["chunks"][0] = "../../../../etc/passwd";
  j.erase("checksum");
  j["checksum"] = fs3::sha256Hex(j.dump());  // a writer of the store can make the checksum match
  auto parsed = fs3::parseStoredLayer(j.dump(), "hostile manifest");
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.error().message().find("not a sha256"), std::string::npos) << parsed.error().message();
  // And the cache refuses such a name whoever asks.
  char buf[8];
  EXPECT_FALSE(cache_->read("../../../../etc/passwd", 8, 0, buf, sizeof buf).ok());
}

TEST_F(SharedStoreAttack, AChunkThatIsASymlinkToAHostFileIsAnIoError) {
  // The host file has exactly the bytes the chunk should: following the link would pass the hash check.
  std::string host_file = tmp_.path() + "/host-file";
  ASSERT_OK(writeFile(host_file, bytes_.substr(0, static_cast<size_t>(layer_.chunkLength(0)))));
  std::string chunk = store_.chunkPath(layer_.chunks[0]);
  ASSERT_EQ(::unlink(chunk.c_str()), 0);
  ASSERT_EQ(::symlink(host_file.c_str(), chunk.c_str()), 0);
  char buf[16];
  auto r = cache_->read(layer_.chunks[0], layer_.chunkLength(0), 0, buf, sizeof buf);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().sysErrno(), EIO);
  EXPECT_GE(cache_->stats().fetch_errors, 1);
}

}  // namespace
}  // namespace dsec::testing
