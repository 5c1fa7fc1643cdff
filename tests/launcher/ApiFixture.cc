#include "ApiFixture.h"

#include <stdexcept>

#include "BusyboxRootfs.h"
#include "dsec/fs3/LayerStore.h"

namespace dsec::testing {

void ApiTest::SetUp() {
  root_ = std::make_unique<TempDir>();
  fs3::LayerStore store(root_->path());
  TempDir tree;
  try {
    auto written = cli::writeBusyboxRootfs(tree.path() + "/rootfs");
    if (!written.ok()) throw std::runtime_error(written.error().toString());
    auto built = store.buildFromDir({"busybox", "1"}, tree.path() + "/rootfs", "", "dir:busybox");
    if (!built.ok()) layer_error_ = built.error().toString();
  } catch (const std::exception& e) {
    layer_error_ = e.what();
  }
}

void ApiTest::TearDown() {
  client_.reset();
  if (node_) node_->stop(/*destroy_sandboxes=*/true);
  node_.reset();
  root_.reset();
}

launcher::ServeOptions ApiTest::options() {
  launcher::ServeOptions o;
  o.node.root = root_->path();
  o.http.listen = "127.0.0.1:0";
  o.node.fleet_name = "launcher-test";
  o.node.node_name = "t0";
  o.write_fleet_file = false;
  return o;
}

bool ApiTest::startNode(const launcher::ServeOptions& options) {
  client_.reset();
  auto node = launcher::EmbeddedNode::start(options);
  EXPECT_TRUE(node.ok()) << node.error().toString();
  if (!node.ok()) return false;
  node_ = std::move(*node);
  client_ = std::make_unique<HttpTestClient>(node_->endpoint(), node_->token());
  return true;
}

std::string ApiTest::missingBackend() {
  std::string why = missingRoot();
  if (why.empty() && !layer_error_.empty()) why = "cannot build the busybox layer: " + layer_error_;
  if (why.empty()) {
    auto info = client_->get("/v1/node").json();
    auto unavailable = info.value("unavailable_backends", nlohmann::json::object());
    if (unavailable.contains("container")) why = unavailable["container"].get<std::string>();
  }
  return why;
}

std::string ApiTest::createSandbox(const nlohmann::json& extra) {
  nlohmann::json body = {{"image", "busybox:1"}, {"memory", "64M"}, {"disk", "256M"}};
  for (const auto& [k, v] : extra.items()) body[k] = v;
  auto r = client_->postJson("/v1/sandboxes", body);
  EXPECT_EQ(r.status, 201) << r.body;
  if (r.status != 201) return "";
  return r.json().value("id", "");
}

HttpReply ApiTest::exec(const std::string& id, const nlohmann::json& body) {
  return client_->postJson(sandboxPath(id, "/exec"), body);
}

}  // namespace dsec::testing
