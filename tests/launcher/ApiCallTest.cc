// POST /v1/call end to end: an EmbeddedNode whose fncall image is a layer built from the host's Python
// (tests/backends/fncall/PythonTestImage.h). Calls run and are isolated from each other, a missing image is
// a 404 naming it, overload is 429 with a retry hint, worker sandboxes are never listed or persisted, are
// destroyed at shutdown, and a restarted node reaps workers an earlier agent left behind.
#include <dirent.h>
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "HttpTestClient.h"
#include "PythonTestImage.h"
#include "dsec/backends/container/ContainerBackend.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/LayerStore.h"
#include "dsec/launcher/api/Serve.h"
#include "dsec/launcher/node/NodeAgent.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::testing {
namespace {

using nlohmann::json;
constexpr const char* kImage = "pyfn:1";

std::string b64(const std::string& in) {
  static constexpr char kA[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = (uint32_t(uint8_t(in[i])) << 16) | (uint32_t(uint8_t(in[i + 1])) << 8) | uint8_t(in[i + 2]);
    for (int s : {18, 12, 6, 0}) out += kA[(v >> s) & 63];
  }
  if (i < in.size()) {
    uint32_t v = uint32_t(uint8_t(in[i])) << 16;
    if (i + 1 < in.size()) v |= uint32_t(uint8_t(in[i + 1])) << 8;
    out += kA[(v >> 18) & 63];
    out += kA[(v >> 12) & 63];
    out += i + 1 < in.size() ? kA[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

// Names of the cgroup directories under <hierarchy>/<parent> of every v1 hierarchy and the unified one.
std::vector<std::string> cgroupChildren(const std::string& parent) {
  std::vector<std::string> out;
  DIR* top = opendir("/sys/fs/cgroup");
  if (top == nullptr) return out;
  std::vector<std::string> dirs = {"/sys/fs/cgroup/" + parent};
  while (auto* e = readdir(top)) {
    if (e->d_name[0] != '.') dirs.push_back("/sys/fs/cgroup/" + std::string(e->d_name) + "/" + parent);
  }
  closedir(top);
  for (const auto& d : dirs) {
    DIR* dir = opendir(d.c_str());
    if (dir == nullptr) continue;
    while (auto* e = readdir(dir)) {
      if (e->d_type == DT_DIR && e->d_name[0] != '.') out.push_back(e->d_name);
    }
    closedir(dir);
  }
  return out;
}

bool anyWorkerCgroup(const std::string& parent) {
  for (const auto& name : cgroupChildren(parent)) {
    if (name.find("-fn-") != std::string::npos) return true;
  }
  return false;
}

class ApiCallTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    skip_ = missingPythonRootfsTools();
    if (!skip_.empty()) return;
    rootfs_dir_ = new TempDir();
    auto st = writePythonRootfs(rootfs_dir_->path() + "/rootfs");
    if (!st.ok()) skip_ = "cannot build the python rootfs: " + st.error().toString();
  }
  static void TearDownTestSuite() {
    delete rootfs_dir_;
    rootfs_dir_ = nullptr;
  }

  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    root_ = std::make_unique<TempDir>();
    fs3::LayerStore store(root_->path());
    auto built = store.buildFromDir({"pyfn", "1"}, rootfs_dir_->path() + "/rootfs", "", "dir:python");
    ASSERT_OK(built);
  }
  void TearDown() override {
    client_.reset();
    if (node_) node_->stop(true);
    node_.reset();
    root_.reset();
  }

  launcher::ServeOptions options() {
    launcher::ServeOptions o;
    o.node.root = root_->path();
    o.http.listen = "127.0.0.1:0";
    o.node.fleet_name = "call-test";
    o.node.node_name = "c0";
    o.write_fleet_file = false;
    o.node.fncall.image = kImage;
    o.node.fncall.max_workers = 2;
    return o;
  }
  void start(const launcher::ServeOptions& o) {
    auto node = launcher::EmbeddedNode::start(o);
    ASSERT_OK(node);
    node_ = std::move(*node);
    client_ = std::make_unique<HttpTestClient>(node_->endpoint(), node_->token());
    json info = client_->get("/v1/node").json();
    if (info["unavailable_backends"].contains("fncall")) {
      GTEST_SKIP() << "fncall unavailable: " << info["unavailable_backends"]["fncall"];
    }
  }
  json call(const json& body, int want_status = 200) {
    auto r = client_->postJson("/v1/call", body);
    EXPECT_EQ(r.status, want_status) << r.body;
    return r.json();
  }
  std::string cgroupParent() { return launcher::cgroupParentForRoot(root_->path()); }

  static inline std::string skip_;
  static inline TempDir* rootfs_dir_ = nullptr;
  std::unique_ptr<TempDir> root_;
  std::unique_ptr<launcher::EmbeddedNode> node_;
  std::unique_ptr<HttpTestClient> client_;
};

TEST_F(ApiCallTest, RunsPythonAndBashWithStdinFilesAndExitCodes) {
  start(options());
  json r = call({{"code", "print(sum(range(1000)))"}});
  EXPECT_EQ(r["exit_code"], 0);
  EXPECT_EQ(r["stdout"], "499500\n");
  EXPECT_EQ(r["timed_out"], false);
  for (const char* key : {"signal", "stderr", "truncated", "oom_killed", "duration"}) EXPECT_TRUE(r.contains(key));

  r = call({{"code", "import sys\nd = sys.stdin.read()\nprint(open('data/in.txt').read() + d)\nsys.exit(3)"},
            {"stdin", "-tail"},
            {"files", {{"data/in.txt", b64("head")}}}});
  EXPECT_EQ(r["exit_code"], 3);
  EXPECT_EQ(r["stdout"], "head-tail\n");

  r = call({{"code", "read x; echo \"got $x\" >&2; cat f.bin | wc -c"},
            {"language", "bash"},
            {"stdin_b64", b64("line\n")},
            {"files", {{"f.bin", b64(std::string("\0\1\2", 3))}}}});
  EXPECT_EQ(r["exit_code"], 0) << r.dump();
  EXPECT_EQ(r["stderr"], "got line\n");
  EXPECT_EQ(trim(r["stdout"].get<std::string>()), "3");

  r = call({{"code", "import time; time.sleep(30)"}, {"timeout", 1}});
  EXPECT_EQ(r["timed_out"], true);
  EXPECT_EQ(r["exit_code"], 137);
  r = call({{"code", "print('x' * 100000)"}, {"output_cap", 1000}});
  EXPECT_EQ(r["truncated"], true);
  EXPECT_EQ(r["stdout"].get<std::string>().size(), 1000u);
}

TEST_F(ApiCallTest, NothingOneCallLeavesIsSeenByTheNext) {
  start(options());
  json r = call({{"code",
                  "import os, subprocess\n"
                  "open('left.txt', 'w').write('x')\n"
                  "open('/tmp/left.txt', 'w').write('x')\n"
                  "os.environ['LEFT'] = '1'\n"
                  "import builtins; builtins.LEFT = 1\n"
                  "subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
                  "import time; time.sleep(0.5)\n"
                  "print('planted', any(open(f'/proc/{p}/cmdline', 'rb').read() == b'sleep\\x00' + b'300\\x00'\n"
                  "                     for p in os.listdir('/proc') if p.isdigit()))"}});
  EXPECT_EQ(r["stdout"], "planted True\n") << r.dump();
  for (int i = 0; i < 4; ++i) {  // whichever worker takes the next calls
    r = call({{"code",
               "import os, builtins\n"
               "print(os.path.exists('left.txt'), os.path.exists('/tmp/left.txt'), 'LEFT' in os.environ,\n"
               "      hasattr(builtins, 'LEFT'),\n"
               "      any(open(f'/proc/{p}/cmdline', 'rb').read() == b'sleep\\x00' + b'300\\x00'\n"
               "          for p in os.listdir('/proc') if p.isdigit()))"}});
    EXPECT_EQ(r["stdout"], "False False False False False\n") << r.dump();
  }
}

TEST_F(ApiCallTest, BadRequestsAndMissingImages) {
  start(options());
  auto r = client_->postJson("/v1/call", {{"code", "1"}, {"language", "ruby"}});
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("language"), std::string::npos) << r.body;
  r = client_->postJson("/v1/call", {{"code", "1"}, {"files", {{"../x", ""}}}});
  EXPECT_EQ(r.status, 400);
  r = client_->postJson("/v1/call", {{"code", "1"}, {"bogus", 1}});
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("unknown field 'bogus'"), std::string::npos) << r.body;
  r = client_->request(boost::beast::http::verb::get, "/v1/call");
  EXPECT_EQ(r.status, 405);
  r = client_->postJson("/v1/call", {{"code", "print(1)"}, {"image", "nope:1"}});
  EXPECT_EQ(r.status, 404);
  EXPECT_NE(r.body.find("nope:1"), std::string::npos) << r.body;
}

TEST_F(ApiCallTest, DefaultImageMissingIsA404SayingHowToBuildIt) {
  auto o = options();
  o.node.fncall.image = launcher::kDefaultFncallImage;
  start(o);
  auto r = client_->postJson("/v1/call", {{"code", "print(1)"}});
  EXPECT_EQ(r.status, 404);
  EXPECT_NE(r.body.find("debian:12+python:3.11"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("examples/rollout.py"), std::string::npos) << r.body;
  // The same node runs calls on an image that exists.
  EXPECT_EQ(call({{"code", "print(2)"}, {"image", kImage}})["stdout"], "2\n");
}

TEST_F(ApiCallTest, WorkersAreNotUserSandboxesAndGoAtShutdown) {
  start(options());
  EXPECT_EQ(call({{"code", "print(1)"}})["stdout"], "1\n");
  json info = client_->get("/v1/node").json();
  auto backends = info["backends"].get<std::vector<std::string>>();
  EXPECT_NE(std::find(backends.begin(), backends.end(), "fncall"), backends.end()) << info.dump();
  ASSERT_TRUE(info.contains("fncall")) << info.dump();
  EXPECT_GE(info["fncall"]["workers"].get<int>(), 1);
  EXPECT_EQ(info["fncall"]["default_image"], kImage);
  EXPECT_EQ(info["sandboxes"], 0);
  EXPECT_TRUE(client_->get("/v1/sandboxes").json()["sandboxes"].empty());
  std::string metrics = client_->get("/metrics").body;
  EXPECT_NE(metrics.find("dsec_fncall_calls_total"), std::string::npos);
  EXPECT_TRUE(anyWorkerCgroup(cgroupParent()));
  std::vector<std::string> state_files;
  if (auto listed = launcher::listStateFiles(root_->path() + "/state/sandboxes"); listed.ok()) state_files = *listed;
  EXPECT_TRUE(state_files.empty()) << "worker persisted as a user sandbox";

  client_.reset();
  node_->stop(/*destroy_sandboxes=*/false);  // user sandboxes would stay; workers never do
  node_.reset();
  EXPECT_FALSE(anyWorkerCgroup(cgroupParent()));
}

TEST_F(ApiCallTest, RestartedNodeReapsWorkersLeftBehind) {
  // A worker sandbox an agent that died left behind: created under the node's cgroup parent, then its handle
  // dropped without destroy (the backend keeps it running as a leftover).
  backends::ContainerBackendOptions backend_options;
  backend_options.cgroup_parent = cgroupParent();
  backend_options.init_pool_size = 0;
  {
    auto backend = backends::makeContainerBackend(backend_options);
    ASSERT_OK(backend);
    if (!(*backend)->missingFeatures().empty()) GTEST_SKIP() << "container backend unavailable here";
    fs3::LayerStore store(root_->path());
    fs3::LayerMounter mounter(&store);
    auto layers = fs3::parseImageRef(kImage);
    ASSERT_OK(layers);
    auto mount = mounter.acquire(*layers);
    ASSERT_OK(mount);
    backends::SandboxSpec spec;
    spec.id = "c0-fn-0123456789abcdef";
    spec.lower_dirs = (*mount)->dirs();
    spec.read_only_root = true;
    auto sandbox = (*backend)->create(spec);
    ASSERT_OK(sandbox);
    EXPECT_TRUE(anyWorkerCgroup(cgroupParent()));
    sandbox->reset();  // no destroy: a leftover
  }
  start(options());
  EXPECT_FALSE(anyWorkerCgroup(cgroupParent())) << "the restarted node did not reap the leftover worker";
  EXPECT_EQ(call({{"code", "print(5)"}})["stdout"], "5\n");
}

TEST_F(ApiCallTest, OverloadIsA429WithRetryAfter) {
  auto o = options();
  o.node.fncall.max_workers = 1;
  o.node.fncall.queue_wait_seconds = 0.2;
  start(o);
  // Warm the single worker (it starts on the first call; until it is up a call may see the 0.2 s queue wait's 429),
  // then keep it busy.
  for (double deadline = monotonicSeconds() + 120;;) {
    auto warm = client_->postJson("/v1/call", {{"code", "print(0)"}});
    if (warm.status == 429 && monotonicSeconds() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      continue;
    }
    ASSERT_EQ(warm.status, 200) << warm.body;
    EXPECT_EQ(warm.json()["stdout"], "0\n");
    break;
  }
  auto busy = std::async(std::launch::async, [this] {
    HttpTestClient other(node_->endpoint(), node_->token());
    return other.postJson("/v1/call", {{"code", "import time; time.sleep(6)"}, {"timeout", 30}});
  });
  bool seen_busy = false;
  for (int i = 0; i < 100 && !seen_busy; ++i) {
    seen_busy = client_->get("/v1/node").json()["fncall"].value("busy", 0) >= 1;
    if (!seen_busy) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(seen_busy) << "the long call never started";
  auto r = client_->postJson("/v1/call", {{"code", "print(1)"}});
  EXPECT_EQ(r.status, 429) << r.body;
  EXPECT_EQ(r.errorCode(), "capacity");
  EXPECT_EQ(r.headers["retry-after"], "1");
  EXPECT_TRUE(r.json()["error"].contains("retry_after")) << r.body;
  EXPECT_EQ(busy.get().status, 200);
  EXPECT_EQ(call({{"code", "print(2)"}})["stdout"], "2\n");  // capacity is back
}

}  // namespace
}  // namespace dsec::testing
