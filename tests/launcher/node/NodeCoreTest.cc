// The node core over injected parts, without root: the simulated backend (records only), in-memory images and
// the real file state store in a temporary directory. Lifecycle, admission, timeouts, sessions (lapse, attach,
// retention) and re-adoption run exactly as on a real node; only the backend differs.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <optional>
#include <thread>

#include "dsec/common/Directory.h"
#include "dsec/common/Fault.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/node/NodeAgent.h"
#include "dsec/launcher/node/NodeParts.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::launcher {
namespace {

using dsec::testing::TempDir;
using nlohmann::json;

// The simulated backend, counting what the node asks it to reap (every operation forwarded).
class CountingBackend : public backends::Backend {
 public:
  explicit CountingBackend(std::unique_ptr<backends::Backend> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  std::vector<std::string> missingFeatures() const override { return inner_->missingFeatures(); }
  Result<std::unique_ptr<backends::Sandbox>> create(const backends::SandboxSpec& spec) override {
    return inner_->create(spec);
  }
  Result<std::unique_ptr<backends::Sandbox>> restore(const backends::SandboxSpec& spec,
                                                     const std::string& dir) override {
    return inner_->restore(spec, dir);
  }
  Result<std::unique_ptr<backends::Sandbox>> adopt(const json& state) override { return inner_->adopt(state); }
  Status reap(const json& state) override {
    reaped.push_back(state);
    return inner_->reap(state);
  }
  Result<std::vector<std::string>> listLeftovers() override {
    DSEC_ASSIGN_OR_RETURN(auto all, inner_->listLeftovers());
    all.insert(all.end(), leftovers.begin(), leftovers.end());  // cgroups a test says were left behind
    return all;
  }
  Status reapLeftover(const std::string& id) override {
    reaped_leftovers.push_back(id);
    return inner_->reapLeftover(id);
  }

  std::vector<json> reaped;
  std::vector<std::string> leftovers;  // added to the backend's own
  std::vector<std::string> reaped_leftovers;

 private:
  std::unique_ptr<backends::Backend> inner_;
};

class NodeCoreTest : public ::testing::Test {
 protected:
  NodeOptions options() const {
    NodeOptions o;
    o.root = dir_.path();
    o.node_name = "t1";
    o.max_sandboxes = 3;
    o.reaper_interval_seconds = 0.02;
    o.density_interval_seconds = 0.05;
    o.memory_capacity_bytes = 1LL << 30;
    o.density.memory_ratio_start = o.density.memory_ratio_max = 2.0;  // admits 2 GiB of limits
    return o;
  }
  NodeParts parts() const {
    NodeParts p = makeSimulatedNodeParts();
    p.state = std::make_unique<FileStateStore>(stateDir());
    return p;
  }
  std::string stateDir() const { return dir_.path() + "/state/sandboxes"; }
  void startAgent() {
    auto agent = NodeAgent::start(options(), &metrics_, parts());
    ASSERT_OK(agent);
    agent_ = std::move(*agent);
  }
  static CreateParams params(const std::string& image = "debian:12") {
    CreateParams p;
    p.image = image;
    p.layers = *fs3::parseImageRef(image);
    p.memory_bytes = 256LL << 20;
    return p;
  }
  std::string create(const CreateParams& p) {
    auto info = agent_->create(p);
    EXPECT_TRUE(info.ok()) << info.error().toString();
    return info.ok() ? info->id : "";
  }
  // The sandbox's info; a failed lookup is a test failure and an info with no id.
  SandboxInfo info(const std::string& id) {
    auto i = agent_->info(id);
    EXPECT_TRUE(i.ok()) << i.error().toString();
    return i.ok() ? *i : SandboxInfo{};
  }
  // Polls until `done` holds (a reaper tick is 20 ms; the deadline only bounds a failure).
  static bool eventually(const std::function<bool()>& done, double seconds = 10) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < deadline) {
      if (done()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return done();
  }
  // Counts without touching anything (listStateFiles would delete the temp file of a save in flight).
  size_t recordsOnDisk() {
    auto listed = listDirectory(stateDir());
    if (!listed.ok()) return 0;
    size_t n = 0;
    for (const auto& e : *listed) n += e.name.size() > 5 && e.name.compare(e.name.size() - 5, 5, ".json") == 0;
    return n;
  }

  TempDir dir_;
  Metrics metrics_;
  std::unique_ptr<NodeAgent> agent_;
};

TEST_F(NodeCoreTest, CreatesListsAndDestroysWithARecordEach) {
  startAgent();
  CreateParams p = params();
  p.labels = {{"job", "a"}};
  std::string a = create(p);
  std::string b = create(params());
  EXPECT_EQ(info(a).state, backends::SandboxState::kRunning);
  EXPECT_EQ(info(a).node, "t1");
  EXPECT_EQ(info(a).params.labels, p.labels);
  EXPECT_EQ(info(a).params.memory_bytes, 256LL << 20);
  EXPECT_FALSE(info(a).paused_by.has_value());
  EXPECT_EQ(agent_->list({{"job", "a"}}).size(), 1u);
  EXPECT_EQ(agent_->list({}).size(), 2u);
  EXPECT_EQ(recordsOnDisk(), 2u);
  ASSERT_OK(agent_->destroy(a));
  ASSERT_ERROR(agent_->info(a), ErrorCode::kNotFound);
  ASSERT_ERROR(agent_->destroy(a), ErrorCode::kNotFound);
  EXPECT_EQ(recordsOnDisk(), 1u);
  EXPECT_EQ(metrics_.creates_total.load(), 2u);
  EXPECT_EQ(metrics_.destroys_total.load(), 1u);
  ASSERT_OK(agent_->destroy(b));
}

TEST_F(NodeCoreTest, AdmissionRefusesAFullNodeAndCommittedMemoryBeyondCapacity) {
  startAgent();
  CreateParams big = params();
  big.memory_bytes = 1536LL << 20;
  create(big);  // 1.5 of 2 GiB
  ASSERT_ERROR(agent_->create(big), ErrorCode::kResourceExhausted);
  create(params());
  create(params());  // 3 sandboxes: the node's limit
  auto refused = agent_->create(params());
  ASSERT_ERROR(refused, ErrorCode::kResourceExhausted);
  EXPECT_NE(refused.error().message().find("is full"), std::string::npos) << refused.error().message();
  EXPECT_EQ(agent_->sandboxCount(), 3u);
  EXPECT_EQ(metrics_.create_failures_total.load(), 2u);
}

TEST_F(NodeCoreTest, AMissingImageIsNotFoundAndBooksNothing) {
  NodeParts p = parts();
  p.images = std::make_unique<InMemoryImageSource>(std::set<std::string>{"debian:12"});
  auto agent = NodeAgent::start(options(), &metrics_, std::move(p));
  ASSERT_OK(agent);
  agent_ = std::move(*agent);
  ASSERT_ERROR(agent_->create(params("debian:12+python:3.11")), ErrorCode::kNotFound);
  EXPECT_EQ(agent_->sandboxCount(), 0u);
  EXPECT_EQ(recordsOnDisk(), 0u);
  create(params("debian:12"));
}

TEST_F(NodeCoreTest, TimeoutAndIdleTimeoutReapButAnExecInFlightKeepsASandbox) {
  startAgent();
  CreateParams timed = params();
  timed.timeout = 0.2;
  CreateParams idle = params();
  idle.idle_timeout = 0.2;
  // Idle for 2 s at most, and the lease taken at once: a stall of the test thread cannot reap it first.
  CreateParams held = params();
  held.idle_timeout = 2.0;
  std::string busy = create(held);
  auto lease = agent_->use(busy);  // an exec in flight: not idle however long it runs
  ASSERT_OK(lease);
  auto held_since = std::chrono::steady_clock::now();
  std::string t = create(timed);
  std::string i = create(idle);
  // The reaper counts a destroy after it returns: wait for the count, not only for the sandboxes to be gone.
  EXPECT_TRUE(eventually([&] { return metrics_.reaped_total.load() == 2; }));
  ASSERT_ERROR(agent_->info(t), ErrorCode::kNotFound);
  ASSERT_ERROR(agent_->info(i), ErrorCode::kNotFound);
  std::this_thread::sleep_until(held_since + std::chrono::milliseconds(2500));  // past its idle timeout
  EXPECT_EQ(info(busy).state, backends::SandboxState::kRunning);
  EXPECT_EQ(metrics_.reaped_total.load(), 2u);
  { auto done = std::move(*lease); }
  // A destroy leaves the registry before its record goes: wait for both.
  EXPECT_TRUE(eventually([&] { return !agent_->info(busy).ok() && recordsOnDisk() == 0; }));
}

TEST_F(NodeCoreTest, ALapsedSessionPausesItsSandboxesAndUseResumesThem) {
  startAgent();
  ASSERT_OK(agent_->putSession("trainer", SessionSettings{60.0, 3600.0}));
  CreateParams p = params();
  p.session = "trainer";
  p.idle_timeout = 3.0;  // passes while the session is lapsed: the pause must keep the sandboxes
  auto created = std::chrono::steady_clock::now();
  std::string a = create(p);
  std::string b = create(p);
  ASSERT_OK(agent_->putSession("trainer", SessionSettings{1.0, std::nullopt}));  // the trainer stops renewing
  ASSERT_TRUE(
      eventually([&] { return info(a).paused_by == PausedBy::kLease && info(b).paused_by == PausedBy::kLease; }));
  EXPECT_EQ(info(a).state, backends::SandboxState::kPaused);
  std::this_thread::sleep_until(created + std::chrono::milliseconds(3500));  // past the idle timeout
  EXPECT_EQ(info(a).state, backends::SandboxState::kPaused)
      << "an idle timeout destroyed a sandbox its lapsed session paused";
  EXPECT_EQ(info(b).state, backends::SandboxState::kPaused);
  EXPECT_EQ(metrics_.reaped_total.load(), 0u);
  auto attached = agent_->attachSession("trainer", 60.0);  // long enough not to lapse again during the test
  ASSERT_OK(attached);
  EXPECT_EQ(attached->session.name, "trainer");
  EXPECT_EQ(attached->sandboxes.size(), 2u);
  EXPECT_EQ(info(a).state, backends::SandboxState::kPaused);  // attach renews; the first use resumes
  {
    auto lease = agent_->use(a);
    ASSERT_OK(lease);
  }
  EXPECT_EQ(info(a).state, backends::SandboxState::kRunning);
  EXPECT_FALSE(info(a).paused_by.has_value());
  EXPECT_EQ(info(b).state, backends::SandboxState::kPaused);
}

// The pause that should keep a lapsed session's sandboxes failed (or the tick that pauses them comes late): their
// idle timeout still must not destroy what the trainer will reattach to.
TEST_F(NodeCoreTest, AnIdleTimeoutSparesALapsedSessionsSandboxEvenWhenItsPauseFailed) {
  startAgent();
  ASSERT_OK(agent_->putSession("trainer", SessionSettings{1.0, 3600.0}));
  CreateParams p = params();
  p.session = "trainer";
  p.idle_timeout = 1.5;  // after the lease lapses
  armFault("simulated.pause");
  std::string a = create(p);
  ASSERT_TRUE(eventually([&] {
    auto s = agent_->getSession("trainer");
    return s.ok() && s->lapsed();
  }));
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));  // well past the idle timeout
  armFault("");
  EXPECT_EQ(info(a).state, backends::SandboxState::kRunning);  // the pause failed
  EXPECT_EQ(metrics_.reaped_total.load(), 0u) << "an idle timeout destroyed a sandbox of a lapsed session";
  ASSERT_OK(agent_->attachSession("trainer", 60.0));
  EXPECT_OK(agent_->use(a));
}

TEST_F(NodeCoreTest, ASessionLapsedForItsRetentionIsDroppedWithItsSandboxes) {
  startAgent();
  ASSERT_OK(agent_->putSession("gone", SessionSettings{60.0, 0.3}));
  CreateParams p = params();
  p.session = "gone";
  std::string a = create(p);
  ASSERT_OK(agent_->putSession("gone", SessionSettings{1.0, std::nullopt}));
  EXPECT_TRUE(
      eventually([&] { return !agent_->info(a).ok() && !agent_->getSession("gone").ok() && recordsOnDisk() == 0; }));
}

TEST_F(NodeCoreTest, DeletingASessionDestroysItsSandboxes) {
  startAgent();
  ASSERT_OK(agent_->putSession("s", SessionSettings{}));
  CreateParams p = params();
  p.session = "s";
  std::string a = create(p);
  std::string other = create(params());
  auto deleted = agent_->deleteSession("s");
  ASSERT_OK(deleted);
  EXPECT_EQ(deleted->name, "s");
  EXPECT_EQ(deleted->destroyed, 1);
  ASSERT_ERROR(agent_->info(a), ErrorCode::kNotFound);
  EXPECT_EQ(info(other).state, backends::SandboxState::kRunning);
  ASSERT_ERROR(agent_->create(p), ErrorCode::kNotFound);  // no such session any more
}

TEST_F(NodeCoreTest, NodeInfoCountsSandboxesAndSaysWhichBackendsAreOffered) {
  startAgent();
  create(params());
  NodeInfo node = agent_->nodeInfo();
  EXPECT_EQ(node.node, "t1");
  EXPECT_EQ(node.fleet, kDefaultFleetName);
  EXPECT_EQ(node.backends, std::vector<backends::BackendKind>{backends::BackendKind::kContainer});
  // A simulated node runs no processes, so no fncall workers, and has no machine backends.
  EXPECT_EQ(node.unavailable_backends.size(), 3u);
  EXPECT_EQ(node.unavailable_backends.count(backends::BackendKind::kFncall), 1u);
  EXPECT_EQ(node.unavailable_backends.count(backends::BackendKind::kMicrovm), 1u);
  // A create of a kind the node has not is refused, saying why, before anything is admitted.
  CreateParams vm = params();
  vm.backend = backends::BackendKind::kMicrovm;
  auto refused = agent_->create(vm);
  ASSERT_ERROR(refused, ErrorCode::kUnsupported);
  EXPECT_NE(refused.error().message().find("microvm is not available"), std::string::npos);
  EXPECT_EQ(node.sandboxes, 1u);
  EXPECT_EQ(node.capacity.max_sandboxes, 3);
  EXPECT_EQ(node.capacity.free_sandboxes, 2);
  EXPECT_EQ(node.capacity.memory_bytes, 1LL << 30);
  EXPECT_EQ(node.capacity.memory_committed_bytes, 256LL << 20);
  EXPECT_TRUE(node.user_namespaces);
  EXPECT_EQ(node.isolation_warning, "");
  ASSERT_TRUE(node.density.has_value());
  EXPECT_EQ(node.density->actions_total.size(), 5u);
  EXPECT_TRUE(node.qos.has_value());
}

TEST_F(NodeCoreTest, ARestartedNodeReadoptsItsSandboxesAsTheyWere) {
  startAgent();
  CreateParams p = params();
  p.labels = {{"k", "v"}};
  std::string a = create(p);
  std::string b = create(params());
  ASSERT_OK(agent_->pause(b));
  agent_->shutdown(false);
  agent_.reset();
  startAgent();
  EXPECT_EQ(agent_->sandboxCount(), 2u);
  EXPECT_EQ(info(a).state, backends::SandboxState::kRunning);
  EXPECT_EQ(info(a).params.labels.at("k"), "v");
  EXPECT_EQ(info(b).state, backends::SandboxState::kPaused);
  EXPECT_EQ(info(b).paused_by, std::optional(PausedBy::kUser));
}

// A record written by a node before records were versioned: the API's flat sandbox info.
TEST_F(NodeCoreTest, ARecordOfThePreviousFormatStillReadopts) {
  ASSERT_OK(makeDirs(stateDir(), 0700));
  json v0 = {{"id", "t1-0123456789abcdef"},
             {"image", "debian:12"},
             {"backend", "container"},
             {"cpus", 1.0},
             {"memory", 268435456},
             {"disk", 1073741824},
             {"pids", 1024},
             {"timeout", 0.0},
             {"idle_timeout", 0.0},
             {"network", "none"},
             {"env", {{"A", "1"}}},
             {"labels", {{"team", "rl"}}},
             {"session", nullptr},
             {"qos", "batch"},
             {"created_unix", 1764547200.5},
             {"paused", true},
             {"paused_by", "lease"},
             {"backend_state", {{"backend", "simulated"}, {"id", "t1-0123456789abcdef"}, {"paused", true}}},
             {"cpuset", nullptr}};
  std::ofstream(stateDir() + "/t1-0123456789abcdef.json") << v0.dump();
  startAgent();
  SandboxInfo i = info("t1-0123456789abcdef");
  EXPECT_EQ(i.state, backends::SandboxState::kPaused);
  EXPECT_EQ(i.paused_by, std::optional(PausedBy::kLease));
  EXPECT_EQ(i.params.labels.at("team"), "rl");
  EXPECT_EQ(i.params.env.at("A"), "1");
  EXPECT_EQ(i.params.backend, backends::BackendKind::kContainer);
  EXPECT_EQ(i.created_unix, 1764547200.5);
  // The next write is in the current format.
  ASSERT_OK(agent_->resume("t1-0123456789abcdef"));
  auto text = readFile(stateDir() + "/t1-0123456789abcdef.json");
  ASSERT_OK(text);
  EXPECT_EQ(json::parse(*text)["version"], kStateRecordVersion);
}

TEST_F(NodeCoreTest, UndecodableRecordsAreReapedWithWhatTheyHoldAndLeftoversToo) {
  ASSERT_OK(makeDirs(stateDir(), 0700));
  std::ofstream(stateDir() + "/t1-aaaa.json") << "{not json";
  json other_id = {{"version", 1},
                   {"id", "t1-other"},
                   {"created_unix", 1.0},
                   {"params", {{"image", "debian:12"}}},
                   {"backend_state", {{"backend", "simulated"}, {"id", "t1-cccc"}}}};
  std::ofstream(stateDir() + "/t1-cccc.json") << other_id.dump();
  NodeParts p = parts();
  auto counting = std::make_unique<CountingBackend>(std::move(p.backend));
  CountingBackend* backend = counting.get();
  backend->leftovers = {"t1-orphan"};
  p.backend = std::move(counting);
  auto agent = NodeAgent::start(options(), &metrics_, std::move(p));
  ASSERT_OK(agent);
  agent_ = std::move(*agent);
  EXPECT_EQ(agent_->sandboxCount(), 0u);
  EXPECT_EQ(recordsOnDisk(), 0u);
  // The record naming another id is reaped with its backend state; the non-JSON one has none to give.
  ASSERT_EQ(backend->reaped.size(), 1u);
  EXPECT_EQ(backend->reaped[0]["id"], "t1-cccc");
  EXPECT_EQ(backend->reaped_leftovers, std::vector<std::string>{"t1-orphan"});
}

TEST_F(NodeCoreTest, ARecordOfANewerVersionStopsTheNodeAndIsKept) {
  ASSERT_OK(makeDirs(stateDir(), 0700));
  std::ofstream(stateDir() + "/t1-bbbb.json") << json{{"version", kStateRecordVersion + 1}, {"id", "t1-bbbb"}}.dump();
  auto agent = NodeAgent::start(options(), &metrics_, parts());
  ASSERT_ERROR(agent, ErrorCode::kUnsupported);
  EXPECT_NE(agent.error().message().find("t1-bbbb"), std::string::npos) << agent.error().message();
  EXPECT_EQ(recordsOnDisk(), 1u);  // a newer node's sandbox is not reaped, its record not deleted
}

TEST(StateRecord, RoundTripsEveryField) {
  SandboxStateRecord r;
  r.id = "n1-00ff";
  r.params.image = "debian:12+python:3.11";
  r.params.layers = *fs3::parseImageRef(r.params.image);
  r.params.cpus = 1.5;
  r.params.memory_bytes = 123;
  r.params.timeout = 9;
  r.params.env = {{"K", "V"}};
  r.params.session = "s1";
  r.params.qos = backends::CpuQos::kLatency;
  r.params.network = backends::NetworkMode::kNone;
  r.created_unix = 42.25;
  r.paused_by = PausedBy::kDensity;
  r.backend_state = {{"pid", 7}};
  r.cpuset = "2-3";
  r.slurm_job = "4242";
  auto back = decodeStateRecord(encodeStateRecord(r));
  ASSERT_OK(back);
  EXPECT_EQ(back->id, r.id);
  EXPECT_EQ(back->params.image, r.params.image);
  EXPECT_EQ(back->params.layers.size(), 2u);
  EXPECT_EQ(back->params.cpus, 1.5);
  EXPECT_EQ(back->params.memory_bytes, 123);
  EXPECT_EQ(back->params.timeout, 9);
  EXPECT_EQ(back->params.env, r.params.env);
  EXPECT_EQ(back->params.session, "s1");
  EXPECT_EQ(back->params.qos, backends::CpuQos::kLatency);
  EXPECT_EQ(back->created_unix, 42.25);
  EXPECT_EQ(back->paused_by, PausedBy::kDensity);
  EXPECT_EQ(back->backend_state["pid"], 7);
  EXPECT_EQ(back->cpuset, "2-3");
  EXPECT_EQ(back->slurm_job, "4242");
  // A record without an owner (outside Slurm, or written before records named their job).
  r.slurm_job.clear();
  auto unowned = decodeStateRecord(encodeStateRecord(r));
  ASSERT_OK(unowned);
  EXPECT_EQ(unowned->slurm_job, "");
  ASSERT_ERROR(decodeStateRecord("[]"), ErrorCode::kInvalidArgument);
  ASSERT_ERROR(decodeStateRecord(R"({"version": 1, "id": "x"})"), ErrorCode::kInvalidArgument);
}

TEST(PausedBy, NamesRoundTrip) {
  for (PausedBy by : {PausedBy::kUser, PausedBy::kLease, PausedBy::kDensity}) {
    EXPECT_EQ(parsePausedBy(pausedByName(by)), by);
  }
  EXPECT_EQ(pausedByName(PausedBy::kNone), "");
  EXPECT_EQ(parsePausedBy("something new"), PausedBy::kUser);
}

}  // namespace
}  // namespace dsec::launcher
