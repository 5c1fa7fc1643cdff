// The shared layer store over HTTP (docs/layer-store.md): `dsec layer serve`'s StoreServer and the node's HttpStore
// reading it. Real sockets and a real store directory; what the node does above the store (FUSE, EROFS) is the
// same as for a directory store and is tested end to end in tests/pydsec/test_http_store.py.
#include <gtest/gtest.h>
#include <unistd.h>

#include <thread>

#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/ChunkStore.h"
#include "dsec/fs3/LayerPull.h"
#include "dsec/fs3/Prefetch.h"
#include "dsec/fs3/StoreMaintenance.h"
#include "dsec/launcher/api/HttpStore.h"
#include "dsec/launcher/api/StoreServer.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::launcher {
namespace {

using ::dsec::testing::TempDir;

std::string patternBytes(size_t size, uint32_t seed) {
  std::string s(size, '\0');
  for (size_t i = 0; i < size; ++i) {
    seed = seed * 1103515245u + 12345u;
    s[i] = static_cast<char>(seed >> 16);
  }
  return s;
}

class StoreServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK(makeDirs(store_.dir()));
    ASSERT_OK(store_.init());
    bytes_ = patternBytes(300000, 7);  // 3 chunks of 128 KiB, the last short
    const std::string image = tmp_.path() + "/layer.img";
    ASSERT_OK(writeFile(image, bytes_));
    fs3::LayerManifest m;
    m.ref = ref_;
    m.sha256 = fs3::sha256Hex(bytes_);
    m.size = static_cast<int64_t>(bytes_.size());
    m.created = "2026-12-07T00:00:00Z";
    auto pushed = store_.push(m, image);
    ASSERT_OK(pushed);
    layer_ = pushed->stored;
    ASSERT_EQ(layer_.chunks.size(), 3u);
  }

  std::unique_ptr<StoreServer> serve(bool accept_recordings = false, const std::string& token = "",
                                     const std::string& listen = "127.0.0.1:0", bool accept_leases = false) {
    StoreServerOptions o;
    o.accept_leases = accept_leases;
    o.store_dir = store_.dir();
    o.http.listen = listen;
    o.accept_recordings = accept_recordings;
    o.token = token;
    auto server = StoreServer::start(o);
    EXPECT_TRUE(server.ok()) << server.error().message();
    return server.ok() ? std::move(server).value() : nullptr;
  }

  std::shared_ptr<HttpStore> open(const StoreServer& server, const std::string& token = "", double retry = 2) {
    auto store = HttpStore::open(server.endpoint(), token, retry);
    EXPECT_TRUE(store.ok());
    return *store;
  }

  std::string recordingText(const std::vector<size_t>& chunks) {
    // writeRecording into a directory store elsewhere, to get a well-formed recording's text.
    TempDir other;
    fs3::DirectoryStore dir(other.path());
    EXPECT_TRUE(fs3::writeRecording(dir, "", layer_, chunks).ok());
    auto text = readFile(fs3::storeRecordingPath(dir.chunkStore(), ref_));
    EXPECT_TRUE(text.ok());
    return text.ok() ? *text : "";
  }

  TempDir tmp_;
  fs3::ChunkStore store_{tmp_.path() + "/store"};
  fs3::LayerRef ref_{"served", "1"};
  fs3::StoredLayer layer_;
  std::string bytes_;
};

TEST_F(StoreServerTest, ANodeReadsManifestsAndChunksOverHttp) {
  auto server = serve();
  ASSERT_NE(server, nullptr);
  auto http = open(*server);
  EXPECT_TRUE(http->has(ref_));
  EXPECT_FALSE(http->has({"missing", "1"}));
  auto m = http->manifest(ref_);
  ASSERT_OK(m);
  EXPECT_EQ(m->chunks, layer_.chunks);
  EXPECT_EQ(m->layer.sha256, layer_.layer.sha256);
  auto missing = http->manifest({"missing", "1"});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code(), ErrorCode::kNotFound);
  std::string whole;
  for (size_t i = 0; i < layer_.chunks.size(); ++i) {
    auto chunk = http->fetch(layer_.chunks[i], layer_.chunkLength(i));
    ASSERT_OK(chunk);
    whole += *chunk;
  }
  EXPECT_EQ(whole, bytes_);
  EXPECT_EQ(server->stats().chunks_served.load(), 3u);
}

TEST_F(StoreServerTest, ALayerRemovedAndPushedAnewIsMountedWithItsNewManifest) {
  auto server = serve();
  ASSERT_NE(server, nullptr);
  auto http = open(*server);
  ASSERT_TRUE(http->has(ref_));
  ASSERT_OK(http->manifest(ref_));
  ASSERT_OK(fs3::removeStoredLayer(store_, ref_));
  const std::string other = patternBytes(200000, 11);
  ASSERT_OK(writeFile(tmp_.path() + "/other.img", other));
  fs3::LayerManifest m = layer_.layer;
  m.sha256 = fs3::sha256Hex(other);
  m.size = static_cast<int64_t>(other.size());
  auto pushed = store_.push(m, tmp_.path() + "/other.img");
  ASSERT_OK(pushed);
  auto again = http->manifest(ref_);  // what a mount reads: the store's manifest now, not the first one
  ASSERT_OK(again);
  EXPECT_EQ(again->layer.sha256, m.sha256);
  EXPECT_EQ(again->chunks, pushed->stored.chunks);
}

TEST_F(StoreServerTest, RecordingsAreTakenOnlyWhenAskedAndOnlyForTheLayersBytes) {
  auto text = recordingText({2, 0});
  {
    auto server = serve(false);
    auto http = open(*server);
    EXPECT_EQ(http->recording(ref_).error().code(), ErrorCode::kNotFound);
    EXPECT_FALSE(http->putRecording(ref_, text).ok());  // 403: this server takes none
    EXPECT_FALSE(fs3::DirectoryStore(store_.dir()).recording(ref_).ok());
  }
  auto server = serve(true);
  auto http = open(*server);
  // A recording of other bytes (another layer's sha256) is refused: a node cannot steer others' prefetch.
  fs3::StoredLayer other = layer_;
  other.layer.sha256 = std::string(64, 'a');
  TempDir scratch;
  fs3::DirectoryStore dir(scratch.path());
  ASSERT_TRUE(fs3::writeRecording(dir, "", other, {0}).ok());
  auto foreign = readFile(fs3::storeRecordingPath(dir.chunkStore(), ref_));
  ASSERT_OK(foreign);
  EXPECT_FALSE(http->putRecording(ref_, *foreign).ok());
  EXPECT_FALSE(http->putRecording(ref_, "{\"not\": \"a recording\"}").ok());
  EXPECT_FALSE(fs3::DirectoryStore(store_.dir()).recording(ref_).ok());
  // The layer's own recording is kept, and every node reads it back.
  ASSERT_OK(http->putRecording(ref_, text));
  auto chunks = fs3::readRecording(*http, "", layer_);
  ASSERT_TRUE(chunks.has_value());
  EXPECT_EQ(*chunks, (std::vector<size_t>{2, 0}));
}

TEST_F(StoreServerTest, ANodesLeaseThroughTheServerKeepsGcAndRmOffItsLayers) {
  {
    auto server = serve(false, "", "127.0.0.1:0", false);
    auto http = open(*server);
    auto refused = http->renewLease({ref_});
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.error().code(), ErrorCode::kUnsupported) << refused.error().message();
  }
  auto server = serve(false, "", "127.0.0.1:0", true);
  auto http = open(*server);
  ASSERT_OK(http->renewLease({ref_}));
  auto leases = fs3::liveLeases(store_);
  ASSERT_OK(leases);
  ASSERT_EQ(leases->size(), 1u);
  EXPECT_EQ(leases->front().layers, std::vector<fs3::LayerRef>{ref_});
  auto removed = fs3::removeStoredLayer(store_, ref_);
  ASSERT_FALSE(removed.ok());
  EXPECT_EQ(removed.error().code(), ErrorCode::kConflict);
  http->dropLease();
  leases = fs3::liveLeases(store_);
  ASSERT_OK(leases);
  EXPECT_TRUE(leases->empty());
  ASSERT_OK(fs3::removeStoredLayer(store_, ref_));
}

TEST_F(StoreServerTest, AServerWithATokenAnswersOnlyRequestsCarryingIt) {
  const std::string token = randomHex(32);
  auto server = serve(false, token);
  auto anonymous = open(*server, "");
  auto m = anonymous->manifest(ref_);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().code(), ErrorCode::kUnauthenticated) << m.error().message();
  EXPECT_FALSE(anonymous->fetch(layer_.chunks[0], layer_.chunkLength(0)).ok());
  auto wrong = open(*server, randomHex(32));
  EXPECT_FALSE(wrong->manifest(ref_).ok());
  auto right = open(*server, token);
  ASSERT_OK(right->manifest(ref_));
  auto chunk = right->fetch(layer_.chunks[0], layer_.chunkLength(0));
  ASSERT_OK(chunk);
  EXPECT_EQ(*chunk, bytes_.substr(0, static_cast<size_t>(layer_.chunkLength(0))));
}

TEST_F(StoreServerTest, AFetchWaitsOutAServerThatIsAwayForAMoment) {
  auto server = serve();
  const std::string endpoint = server->endpoint();
  const std::string listen = endpoint.substr(std::string("http://").size());
  auto http = open(*server, "", 5);
  server.reset();  // gone
  std::thread back([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    server = serve(false, "", listen);  // back on the same port
  });
  auto chunk = http->fetch(layer_.chunks[1], layer_.chunkLength(1));
  back.join();
  ASSERT_OK(chunk);
  EXPECT_EQ(*chunk, bytes_.substr(128 << 10, 128 << 10));
  ASSERT_NE(server, nullptr);
}

TEST_F(StoreServerTest, AFetchFromAServerThatStaysAwayIsEio) {
  auto server = serve();
  auto http = open(*server, "", 0.5);
  server.reset();
  const double t0 = monotonicSeconds();
  auto chunk = http->fetch(layer_.chunks[0], layer_.chunkLength(0));
  ASSERT_FALSE(chunk.ok());
  EXPECT_EQ(chunk.error().sysErrno(), EIO);
  EXPECT_LT(monotonicSeconds() - t0, 5.0);
}

TEST_F(StoreServerTest, APullCopiesTheLayerWholeAndAPullOfACorruptChunkLeavesNothing) {
  auto server = serve();
  auto http = open(*server);
  fs3::LayerStore local(tmp_.path() + "/node");
  ASSERT_OK(local.init());
  auto pulled = fs3::pullLayer(*http, layer_, local, 2);
  ASSERT_OK(pulled);
  auto image = readFile(local.imagePath(ref_));
  ASSERT_OK(image);
  EXPECT_EQ(*image, bytes_);
  ASSERT_OK(local.get(ref_));
  EXPECT_EQ(fs3::pullLayer(*http, layer_, local, 2).error().code(), ErrorCode::kAlreadyExists);

  fs3::LayerStore other(tmp_.path() + "/other");
  ASSERT_OK(other.init());
  std::string damaged = bytes_.substr(128 << 10, 128 << 10);
  damaged[100] ^= 1;
  ASSERT_OK(writeFile(store_.chunkPath(layer_.chunks[1]), damaged));
  auto bad = fs3::pullLayer(*http, layer_, other, 2);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().sysErrno(), EIO) << bad.error().message();
  EXPECT_FALSE(other.exists(ref_));
  auto left = runCommand({"sh", "-c", "ls -A " + tmp_.path() + "/other/layers | wc -l"});
  ASSERT_OK(left);
  EXPECT_EQ(trim(left->output), "0") << "a failed pull left files behind";
}

}  // namespace
}  // namespace dsec::launcher
