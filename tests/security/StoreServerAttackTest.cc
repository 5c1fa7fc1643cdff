// `dsec layer serve` against hostile clients and a store a hostile node could write into (docs/security.md §7c): no
// request reaches a file outside the store's chunks, manifests and recordings, whether by "..", encoded "..",
// a symbolic link planted in the store, or a FIFO that would hang a reader; a server with a token answers nothing
// without it; a recording is stored only when the server takes recordings, and only one of the layer's own bytes.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dsec/common/Strings.h"
#include "dsec/fs3/ChunkStore.h"
#include "dsec/fs3/Prefetch.h"
#include "dsec/launcher/api/HttpClient.h"
#include "dsec/launcher/api/StoreServer.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::testing {
namespace {

namespace http = boost::beast::http;

class StoreServerAttack : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK(makeDirs(store_.dir()));
    ASSERT_OK(store_.init());
    secret_ = "HOST-SECRET-" + randomHex(16);
    ASSERT_OK(writeFile(tmp_.path() + "/secret.txt", secret_));
    bytes_ = std::string(200000, 'x');
    ASSERT_OK(writeFile(tmp_.path() + "/layer.img", bytes_));
    fs3::LayerManifest m;
    m.ref = {"victim", "1"};
    m.sha256 = fs3::sha256Hex(bytes_);
    m.size = static_cast<int64_t>(bytes_.size());
    m.created = "2026-12-07T00:00:00Z";
    auto pushed = store_.push(m, tmp_.path() + "/layer.img");
    ASSERT_OK(pushed);
    layer_ = pushed->stored;
  }

  void serve(bool accept_recordings = false, const std::string& token = "") {
    launcher::StoreServerOptions o;
    o.store_dir = store_.dir();
    o.http.listen = "127.0.0.1:0";
    o.accept_recordings = accept_recordings;
    o.token = token;
    auto server = launcher::StoreServer::start(o);
    ASSERT_OK(server);
    server_ = std::move(server).value();
  }

  launcher::client::HttpReply request(http::verb method, const std::string& target, const std::string& body = "",
                                      const std::string& token = "") {
    launcher::client::CallOptions o;
    o.io_timeout_ms = 5000;
    auto reply = launcher::client::call(server_->endpoint(), method, target, token, body, o);
    EXPECT_TRUE(reply.ok()) << target << ": " << (reply.ok() ? "" : reply.error().message());
    return reply.ok() ? *reply : launcher::client::HttpReply{};
  }

  // Every way of asking for a file, none of which may return the host's secret.
  void expectNoSecret(const std::string& target) {
    auto reply = request(http::verb::get, target);
    EXPECT_NE(reply.status, 200) << target << " was answered: " << reply.body.substr(0, 80);
    EXPECT_EQ(reply.body.find(secret_), std::string::npos) << target << " leaked a host file";
  }

  TempDir tmp_;
  fs3::ChunkStore store_{tmp_.path() + "/store"};
  fs3::StoredLayer layer_;
  std::string bytes_;
  std::string secret_;
  std::unique_ptr<launcher::StoreServer> server_;
};

TEST_F(StoreServerAttack, DotDotAndEncodedPathsReachNothingOutsideTheStore) {
  serve();
  const std::string up = "../../secret.txt";
  for (const std::string& target : std::vector<std::string>{
           "/layers/../../secret.txt", "/layers/victim/1/../../../../secret.txt", "/layers/victim/../../../secret.txt",
           "/layers/%2e%2e/%2e%2e/manifest.json", "/chunks/../../secret.txt", "/chunks/se/../../../secret.txt",
           "/layers/victim/1/" + up, "/layers/victim/1/manifest.json/../../../../../secret.txt", "/secret.txt",
           "//" + tmp_.path() + "/secret.txt", "/layers/victim/1/%2e%2e%2f%2e%2e%2f%2e%2e%2fsecret.txt"}) {
    expectNoSecret(target);
  }
  // The store's own files are served: the probes above could have succeeded.
  EXPECT_EQ(request(http::verb::get, "/layers/victim/1/manifest.json").status, 200);
  const std::string& sha = layer_.chunks[0];
  EXPECT_EQ(request(http::verb::get, "/chunks/" + sha.substr(0, 2) + "/" + sha).status, 200);
}

TEST_F(StoreServerAttack, SymlinksPlantedInTheStoreAreNotFollowed) {
  serve();
  // A chunk named like a real one, a manifest and a whole layer directory, each a link to host files.
  const std::string fake = fs3::sha256Hex(secret_);
  ASSERT_OK(makeDirs(store_.dir() + "/chunks/" + fake.substr(0, 2)));
  ASSERT_EQ(::symlink((tmp_.path() + "/secret.txt").c_str(), store_.chunkPath(fake).c_str()), 0);
  expectNoSecret("/chunks/" + fake.substr(0, 2) + "/" + fake);
  ASSERT_OK(makeDirs(store_.dir() + "/layers/linked/1"));
  ASSERT_EQ(::symlink((tmp_.path() + "/secret.txt").c_str(), (store_.dir() + "/layers/linked/1/manifest.json").c_str()),
            0);
  expectNoSecret("/layers/linked/1/manifest.json");
  ASSERT_OK(makeDirs(tmp_.path() + "/elsewhere/1"));
  ASSERT_OK(writeFile(tmp_.path() + "/elsewhere/1/manifest.json", secret_));
  ASSERT_EQ(::symlink((tmp_.path() + "/elsewhere").c_str(), (store_.dir() + "/layers/dirlink").c_str()), 0);
  expectNoSecret("/layers/dirlink/1/manifest.json");
}

TEST_F(StoreServerAttack, AFifoInTheStoreDoesNotHangTheServer) {
  serve();
  const std::string fake = std::string(64, 'f');
  ASSERT_OK(makeDirs(store_.dir() + "/chunks/ff"));
  ASSERT_EQ(::mkfifo(store_.chunkPath(fake).c_str(), 0644), 0);
  const double t0 = monotonicSeconds();
  auto reply = request(http::verb::get, "/chunks/ff/" + fake);
  EXPECT_EQ(reply.status, 404);
  EXPECT_LT(monotonicSeconds() - t0, 3.0);
}

TEST_F(StoreServerAttack, WithATokenNothingIsAnsweredWithoutIt) {
  const std::string token = randomHex(32);
  serve(true, token);
  const std::string& sha = layer_.chunks[0];
  for (const std::string& target :
       std::vector<std::string>{"/layers/victim/1/manifest.json", "/chunks/" + sha.substr(0, 2) + "/" + sha}) {
    auto reply = request(http::verb::get, target);
    EXPECT_EQ(reply.status, 401) << target;
    EXPECT_EQ(reply.body.find(bytes_.substr(0, 64)), std::string::npos);
    EXPECT_EQ(request(http::verb::get, target, "", randomHex(32)).status, 401) << target;
    EXPECT_EQ(request(http::verb::get, target, "", token).status, 200) << target;
  }
  auto put = request(http::verb::put, "/layers/victim/1/prefetch.json", "{}");
  EXPECT_EQ(put.status, 401);
}

TEST_F(StoreServerAttack, RecordingsCannotBeWrittenWhereTheServerTakesNoneNorOutsideALayer) {
  TempDir scratch;
  fs3::DirectoryStore dir(scratch.path());
  ASSERT_TRUE(fs3::writeRecording(dir, "", layer_, {1, 0}).ok());
  auto text = readFile(fs3::storeRecordingPath(dir.chunkStore(), layer_.layer.ref));
  ASSERT_OK(text);
  const std::string recording = store_.dir() + "/layers/victim/1/prefetch.json";
  serve(false);
  EXPECT_EQ(request(http::verb::put, "/layers/victim/1/prefetch.json", *text).status, 403);
  EXPECT_NE(::access(recording.c_str(), F_OK), 0);
  serve(true);
  EXPECT_EQ(request(http::verb::put, "/layers/victim/1/../../../evil.json", *text).status, 404);
  EXPECT_EQ(request(http::verb::put, "/layers/victim/1/manifest.json", *text).status, 405);
  EXPECT_EQ(request(http::verb::put, "/chunks/" + layer_.chunks[0].substr(0, 2) + "/" + layer_.chunks[0], "x").status,
            405);
  EXPECT_EQ(request(http::verb::put, "/layers/nosuch/1/prefetch.json", *text).status, 404);
  EXPECT_NE(::access((store_.dir() + "/layers/nosuch").c_str(), F_OK), 0);
  EXPECT_EQ(request(http::verb::put, "/layers/victim/1/prefetch.json", std::string(17 << 20, ' ')).status, 413);
  EXPECT_NE(::access(recording.c_str(), F_OK), 0);
  auto manifest = readFile(store_.manifestPath(layer_.layer.ref));
  ASSERT_OK(manifest);
  EXPECT_EQ(request(http::verb::put, "/layers/victim/1/prefetch.json", *text).status, 200);
  EXPECT_EQ(::access(recording.c_str(), F_OK), 0);
  EXPECT_EQ(*readFile(store_.manifestPath(layer_.layer.ref)), *manifest);  // the manifest untouched
}

TEST_F(StoreServerAttack, LeasesAreTakenOnlyWhenAskedAndOnlyUnderLeases) {
  const std::string body = R"({"host": "n1", "layers": ["victim:1"]})";
  serve(false);
  EXPECT_EQ(request(http::verb::put, "/leases/n1.1", body).status, 403);
  EXPECT_NE(::access((store_.dir() + "/leases/n1.1.json").c_str(), F_OK), 0);
  launcher::StoreServerOptions o;
  o.store_dir = store_.dir();
  o.http.listen = "127.0.0.1:0";
  o.accept_leases = true;
  auto server = launcher::StoreServer::start(o);
  ASSERT_OK(server);
  server_ = std::move(server).value();
  for (const std::string name : {"../../evil", "..", ".hidden", "a/b", "%2e%2e%2fevil", ""}) {
    EXPECT_NE(request(http::verb::put, "/leases/" + name, body).status, 200) << name;
  }
  EXPECT_NE(::access((tmp_.path() + "/evil.json").c_str(), F_OK), 0);
  EXPECT_NE(::access((store_.dir() + "/evil.json").c_str(), F_OK), 0);
  EXPECT_EQ(request(http::verb::put, "/leases/n1.1", R"({"host": "n1", "layers": ["../x:1"]})").status, 400);
  EXPECT_EQ(request(http::verb::put, "/leases/n1.1", "not json").status, 400);
  EXPECT_EQ(request(http::verb::put, "/leases/n1.1", body).status, 200);
  EXPECT_EQ(::access((store_.dir() + "/leases/n1.1.json").c_str(), F_OK), 0);
  EXPECT_NE(request(http::verb::delete_, "/leases/../layers/victim/1/manifest", "").status, 200);
  EXPECT_EQ(::access(store_.manifestPath(layer_.layer.ref).c_str(), F_OK), 0);
}

}  // namespace
}  // namespace dsec::testing
