// Fixture for attacks on function calls through a real node (FncallNodeFixture.h).
#include "FncallNodeFixture.h"

#include "PythonTestImage.h"
#include "dsec/backends/container/ContainerBackend.h"
#include "dsec/fs3/LayerStore.h"

namespace dsec::testing {

void FncallNodeAttack::SetUpTestSuite() {
  skip_ = missingPythonRootfsTools();
  if (!skip_.empty()) return;
  rootfs_dir_ = new TempDir();
  auto st = writePythonRootfs(rootfs_dir_->path() + "/rootfs");
  // Only a missing host feature skips; any other failure is a failure of every test (SetUp asserts it).
  if (!st.ok() && st.error().code() == ErrorCode::kUnsupported) skip_ = st.error().message();
  if (!st.ok() && st.error().code() != ErrorCode::kUnsupported) setup_error_ = st.error().toString();
}

void FncallNodeAttack::TearDownTestSuite() {
  delete rootfs_dir_;
  rootfs_dir_ = nullptr;
}

void FncallNodeAttack::SetUp() {
  if (!skip_.empty()) GTEST_SKIP() << skip_;
  ASSERT_TRUE(setup_error_.empty()) << "cannot build the python rootfs: " << setup_error_;
  root_ = std::make_unique<TempDir>();
  fs3::LayerStore store(root_->path());
  auto built = store.buildFromDir({"pyattack", "1"}, rootfs_dir_->path() + "/rootfs", "", "dir:python");
  ASSERT_OK(built);
}

void FncallNodeAttack::TearDown() {
  client_.reset();
  if (node_) node_->stop(true);
  node_.reset();
  root_.reset();
}

launcher::ServeOptions FncallNodeAttack::options() {
  launcher::ServeOptions o;
  o.node.root = root_->path();
  o.http.listen = "127.0.0.1:0";
  o.node.fleet_name = "attack";
  o.node.node_name = "a0";
  o.write_fleet_file = false;
  o.node.fncall.image = kImage;
  o.node.fncall.max_workers = 1;
  o.node.fncall.queue_wait_seconds = 120;  // a loaded machine may take long to start the worker
  return o;
}

void FncallNodeAttack::start(const launcher::ServeOptions& o) {
  auto node = launcher::EmbeddedNode::start(o);
  ASSERT_OK(node);
  node_ = std::move(*node);
  client_ = std::make_unique<HttpTestClient>(node_->endpoint(), node_->token());
  nlohmann::json info = client_->get("/v1/node").json();
  if (info["unavailable_backends"].contains("fncall")) {
    // Skipped only where the host lacks what container sandboxes need; otherwise the node is wrong.
    backends::ContainerBackendOptions probe;
    probe.init_pool_size = 0;  // nothing started: only asked what the host lacks
    auto backend = backends::makeContainerBackend(probe);
    if (!backend.ok()) {
      GTEST_SKIP() << "container sandboxes cannot start here (" << backend.error().message()
                   << "): fncall unavailable: " << info["unavailable_backends"]["fncall"];
    }
    if (!(*backend)->missingFeatures().empty()) {
      GTEST_SKIP() << "fncall unavailable here: " << info["unavailable_backends"]["fncall"];
    }
    FAIL() << "the node offers no fncall on a host that has what it needs: " << info["unavailable_backends"]["fncall"];
  }
}

HttpReply FncallNodeAttack::post(const nlohmann::json& body) { return client_->postJson("/v1/call", body); }

nlohmann::json FncallNodeAttack::call(const nlohmann::json& body) {
  HttpReply r = post(body);
  EXPECT_EQ(r.status, 200) << r.body;
  return r.status == 200 ? r.json() : nlohmann::json::object();
}

}  // namespace dsec::testing
