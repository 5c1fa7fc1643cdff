// Sessions: the SessionTable on its own (lease, lapse, retention, persistence, reconcile), and through the API
// with the real container backend: a lapsed lease pauses the session's sandboxes (processes frozen), attach
// lists them and the first request resumes them intact, retention destroys them, a node restart keeps them.
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "ApiFixture.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/api/NodeJson.h"
#include "dsec/launcher/api/Requests.h"
#include "dsec/launcher/api/Router.h"
#include "dsec/launcher/node/NodeAgent.h"
#include "dsec/launcher/node/Sessions.h"

namespace dsec::testing {
namespace {

using boost::beast::http::verb;
using launcher::Session;
using launcher::SessionSettings;
using launcher::SessionTable;
using nlohmann::json;

// ---------------------------------------------------------------------------------------------------------
// SessionTable (no backend, no root)
// ---------------------------------------------------------------------------------------------------------
TEST(SessionNames, FollowTheRule) {
  for (const char* ok : {"run-42", "a", "A.b_c-9", "0abc"}) EXPECT_OK(launcher::validateSessionName(ok));
  std::string longest(64, 'x');
  EXPECT_OK(launcher::validateSessionName(longest));
  for (std::string bad : {std::string(""), std::string("-x"), std::string(".x"), std::string("a b"), std::string("a/b"),
                          std::string(65, 'x'), std::string("a\nb"), std::string("é")}) {
    auto st = launcher::validateSessionName(bad);
    ASSERT_FALSE(st.ok()) << bad;
    EXPECT_EQ(st.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(st.error().message().find("[A-Za-z0-9]"), std::string::npos) << st.error().message();
  }
}

TEST(SessionSettingsParse, RangesAndFields) {
  auto s = launcher::parseSessionSettings(json::object(), true);
  ASSERT_OK(s);
  EXPECT_FALSE(s->lease.has_value());
  s = launcher::parseSessionSettings({{"lease", 1}, {"retention", 0}}, true);
  ASSERT_OK(s);
  EXPECT_EQ(*s->lease, 1);
  EXPECT_EQ(*s->retention, 0);
  EXPECT_OK(launcher::parseSessionSettings({{"lease", 86400}, {"retention", 604800}}, true));
  for (const json& bad : {json{{"lease", 0}}, json{{"lease", 86401}}, json{{"lease", "60"}}, json{{"retention", -1}},
                          json{{"retention", 604801}}, json{{"other", 1}}, json{{"lease", nullptr}}}) {
    auto r = launcher::parseSessionSettings(bad, true);
    ASSERT_FALSE(r.ok()) << bad.dump();
    EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
  }
  auto r = launcher::parseSessionSettings({{"retention", 5}}, false);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("attach takes only 'lease'"), std::string::npos);
}

TEST(SessionRoutes, MatchAndValidate) {
  using launcher::Op;
  auto m = launcher::matchRoute(verb::put, "/v1/sessions/run-42");
  EXPECT_EQ(m.error_status, 0) << m.error;
  EXPECT_EQ(m.op, Op::kPutSession);
  EXPECT_EQ(m.session, "run-42");
  EXPECT_EQ(launcher::matchRoute(verb::get, "/v1/sessions/run-42").op, Op::kGetSession);
  EXPECT_EQ(launcher::matchRoute(verb::delete_, "/v1/sessions/run-42/").op, Op::kDeleteSession);
  m = launcher::matchRoute(verb::post, "/v1/sessions/run-42/attach");
  EXPECT_EQ(m.op, Op::kAttachSession);
  EXPECT_EQ(m.session, "run-42");
  EXPECT_EQ(launcher::matchRoute(verb::get, "/v1/sessions").op, Op::kListSessions);
  m = launcher::matchRoute(verb::get, "/v1/sessions/run-42/attach");
  EXPECT_EQ(m.error_status, 405);
  EXPECT_EQ(m.allow, "POST");
  EXPECT_EQ(launcher::matchRoute(verb::post, "/v1/sessions").error_status, 405);
  m = launcher::matchRoute(verb::put, "/v1/sessions/-x");
  EXPECT_EQ(m.error_status, 400);
  EXPECT_NE(m.error.find("invalid session name"), std::string::npos) << m.error;
  EXPECT_EQ(launcher::matchRoute(verb::put, "/v1/sessions/a%2Fb").error_status, 400);
  EXPECT_EQ(launcher::matchRoute(verb::put, "/v1/sessions/x/other").error_status, 404);
  EXPECT_EQ(launcher::bodyKind(Op::kPutSession), launcher::BodyKind::kJson);
  EXPECT_EQ(launcher::bodyKind(Op::kAttachSession), launcher::BodyKind::kJson);
  EXPECT_EQ(launcher::bodyKind(Op::kDeleteSession), launcher::BodyKind::kNone);
}

TEST(SessionCreateField, Validated) {
  auto p = launcher::parseCreateRequest({{"image", "busybox:1"}, {"session", "run-1"}}, 0);
  ASSERT_OK(p);
  EXPECT_EQ(p->session, "run-1");
  p = launcher::parseCreateRequest({{"image", "busybox:1"}, {"session", nullptr}}, 0);
  ASSERT_OK(p);
  EXPECT_EQ(p->session, "");
  for (const json& bad : {json(5), json("a b"), json(""), json(std::string(65, 'x'))}) {
    auto r = launcher::parseCreateRequest({{"image", "busybox:1"}, {"session", bad}}, 0);
    ASSERT_FALSE(r.ok()) << bad.dump();
    EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(r.error().message().find("field 'session'"), std::string::npos) << r.error().message();
  }
}

TEST(SessionTableTest, LeaseLapseRetentionAndPersistence) {
  TempDir dir;
  std::string path = dir.path() + "/sessions";
  SessionTable table(path);
  ASSERT_OK(table.load());
  double t = 1000;
  auto s = table.put("run-1", {.lease = 10, .retention = 30}, t);
  ASSERT_OK(s);
  EXPECT_EQ(s->expires_unix, 1010);
  EXPECT_EQ(launcher::toJson(*s)["state"], "active");
  EXPECT_TRUE(launcher::toJson(*s)["lapsed_unix"].is_null());
  ASSERT_OK(table.addSandbox("run-1", "n0-a"));
  ASSERT_OK(table.addSandbox("run-1", "n0-b"));
  ASSERT_ERROR(table.addSandbox("nope", "n0-c"), ErrorCode::kNotFound);

  // Renewal with absent fields keeps the session's values.
  s = table.put("run-1", {}, t + 5);
  ASSERT_OK(s);
  EXPECT_EQ(s->lease, 10);
  EXPECT_EQ(s->retention, 30);
  EXPECT_EQ(s->expires_unix, 1015);

  EXPECT_TRUE(table.tick(t + 14).lapsed.empty());
  auto due = table.tick(t + 15);
  ASSERT_EQ(due.lapsed.size(), 1u);
  EXPECT_EQ(due.lapsed[0].first, "run-1");
  EXPECT_EQ(due.lapsed[0].second, (std::vector<std::string>{"n0-a", "n0-b"}));
  EXPECT_TRUE(table.tick(t + 16).lapsed.empty()) << "a lapse is reported once";
  EXPECT_EQ(table.lapsesTotal(), 1u);
  EXPECT_EQ(table.countLapsed(), 1);
  ASSERT_ERROR(table.checkJoinable("run-1"), ErrorCode::kConflict);
  ASSERT_ERROR(table.addSandbox("run-1", "n0-c"), ErrorCode::kConflict);

  // Persisted: a new table over the same directory sees the lapsed session.
  {
    SessionTable again(path);
    ASSERT_OK(again.load());
    auto got = again.get("run-1");
    ASSERT_OK(got);
    EXPECT_TRUE(got->lapsed());
    EXPECT_EQ(*got->lapsed_unix, t + 15);
    EXPECT_EQ(got->sandboxes.size(), 2u);
  }

  // Attach (renew) makes it active again; a second lapse, then the retention passes.
  auto r = table.renew("run-1", std::nullopt, t + 20);
  ASSERT_OK(r);
  EXPECT_FALSE(r->lapsed());
  EXPECT_EQ(r->expires_unix, t + 30);
  ASSERT_ERROR(table.renew("nope", 5.0, t), ErrorCode::kNotFound);
  EXPECT_EQ(table.tick(t + 30).lapsed.size(), 1u);
  table.removeSandbox("run-1", "n0-b");
  EXPECT_TRUE(table.tick(t + 59).expired.empty());
  due = table.tick(t + 60);
  ASSERT_EQ(due.expired.size(), 1u);
  EXPECT_EQ(due.expired[0].second, (std::vector<std::string>{"n0-a"}));
  ASSERT_ERROR(table.renew("run-1", 5.0, t + 61), ErrorCode::kNotFound);  // being deleted
  table.erase("run-1");
  EXPECT_NE(::access((path + "/run-1.json").c_str(), F_OK), 0);
  SessionTable empty(path);
  ASSERT_OK(empty.load());
  EXPECT_TRUE(empty.list().empty());
}

TEST(SessionTableTest, ReconcileAfterRestart) {
  TempDir dir;
  std::string path = dir.path() + "/sessions";
  {
    SessionTable table(path);
    ASSERT_OK(table.load());
    ASSERT_OK(table.put("keep", {}, 100));
    ASSERT_OK(table.addSandbox("keep", "n0-alive"));
    ASSERT_OK(table.addSandbox("keep", "n0-gone"));
  }
  ASSERT_OK(writeFile(path + "/junk.json", "{ not json"));
  ASSERT_OK(writeFile(
      path + "/other.json",
      json{{"name", "different"}, {"lease", 1}, {"retention", 1}, {"expires_unix", 1}, {"sandboxes", json::array()}}
          .dump()));
  SessionTable table(path);
  ASSERT_OK(table.load());
  EXPECT_NE(::access((path + "/junk.json").c_str(), F_OK), 0) << "unreadable session file kept";
  EXPECT_NE(::access((path + "/other.json").c_str(), F_OK), 0) << "misnamed session file kept";
  table.reconcile({{"n0-alive", "keep"}, {"n0-late", "keep"}, {"n0-orphan", "lost"}}, 500);
  auto keep = table.get("keep");
  ASSERT_OK(keep);
  EXPECT_EQ(keep->sandboxes, (std::set<std::string>{"n0-alive", "n0-late"}));
  auto lost = table.get("lost");
  ASSERT_OK(lost);  // a member of an unknown session restores the session
  EXPECT_EQ(lost->sandboxes, (std::set<std::string>{"n0-orphan"}));
  auto due = table.tick(501);
  bool lost_lapsed = false;
  for (const auto& [name, ids] : due.lapsed) lost_lapsed |= name == "lost";
  EXPECT_TRUE(lost_lapsed) << "the restored session starts with an expired lease";
}

// ---------------------------------------------------------------------------------------------------------
// Through the API, real backend
// ---------------------------------------------------------------------------------------------------------
class SessionApiTest : public ApiTest {
 protected:
  HttpReply put(const std::string& name, const json& body) {
    return client_->request(verb::put, "/v1/sessions/" + name, body.dump(), {{"Content-Type", "application/json"}});
  }
  HttpReply attach(const std::string& name, const json& body) {
    return client_->postJson("/v1/sessions/" + name + "/attach", body);
  }
  json sandboxState(const std::string& id) {
    return json::parse(*readFile(root_->path() + "/state/sandboxes/" + id + ".json"));
  }
  // Reads a file of a sandbox from the host through its init's root, without an API request (which would
  // resume a paused sandbox).
  std::string peek(const std::string& id, const std::string& path) {
    pid_t init = sandboxState(id)["backend_state"]["init_pid"].get<pid_t>();
    auto text = readFile("/proc/" + std::to_string(init) + "/root" + path);
    return text.ok() ? *text : "";
  }
  // Polls GET /v1/sandboxes/{id} until its state is `want` or the deadline passes.
  bool waitState(const std::string& id, const std::string& want, double seconds) {
    double end = monotonicSeconds() + seconds;
    while (monotonicSeconds() < end) {
      auto r = client_->get(sandboxPath(id));
      if (r.status == 200 && r.json()["state"] == want) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }
  bool cgroupExists(const std::string& id) {
    std::string parent = launcher::cgroupParentForRoot(root_->path());
    if (std::filesystem::exists("/sys/fs/cgroup/" + parent + "/" + id)) return true;
    for (const auto& entry : std::filesystem::directory_iterator("/sys/fs/cgroup")) {
      if (std::filesystem::exists(entry.path() / parent / id)) return true;
    }
    return false;
  }
  // Each value is written to a temporary file and renamed over /tmp/counter: a reader never sees the file
  // truncated but not yet written (an empty read once made `[ $c2 -gt $c1 ]` fail).
  static constexpr const char* kCounter =
      "(i=0; while true; do i=$((i+1)); echo $i > /tmp/counter.new; mv /tmp/counter.new /tmp/counter; sleep 0.1; "
      "done) > /dev/null 2>&1 &";
  // Polls `path` in the sandbox until it differs from `before` (a counter that still runs) or `seconds` pass.
  bool changes(const std::string& id, const std::string& path, const std::string& before, double seconds) {
    double end = monotonicSeconds() + seconds;
    while (monotonicSeconds() < end) {
      std::string now = peek(id, path);
      if (!now.empty() && now != before) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
};

TEST_F(SessionApiTest, LapsedLeasePausesAndAttachResumesIntact) {
  startNode();
  SKIP_WITHOUT_BACKEND();
  auto p = put("run-42", {{"lease", 2}, {"retention", 60}});
  ASSERT_EQ(p.status, 200) << p.body;
  EXPECT_EQ(p.json()["state"], "active");
  EXPECT_EQ(p.json()["lease"], 2);
  std::string a = createSandbox({{"session", "run-42"}});
  std::string b = createSandbox({{"session", "run-42"}});
  std::string outside = createSandbox();
  ASSERT_FALSE(a.empty() || b.empty() || outside.empty());
  auto info = client_->get(sandboxPath(a)).json();
  EXPECT_EQ(info["session"], "run-42");
  EXPECT_TRUE(info["paused_by"].is_null());
  EXPECT_TRUE(client_->get(sandboxPath(outside)).json()["session"].is_null());
  auto s = client_->get("/v1/sessions/run-42").json();
  EXPECT_EQ(s["sandboxes"].size(), 2u) << s.dump();

  ASSERT_EQ(exec(a, {{"cmd", std::string("echo kept > /tmp/state; ") + kCounter}}).json()["exit_code"], 0);
  ASSERT_EQ(exec(b, {{"cmd", "sleep 1000 > /dev/null 2>&1 &"}}).json()["exit_code"], 0);
  ASSERT_EQ(exec(outside, {{"cmd", kCounter}}).json()["exit_code"], 0);

  // Nobody renews: within lease + a reaper tick or two both session sandboxes are paused by the lease.
  ASSERT_TRUE(waitState(a, "paused", 8)) << client_->get(sandboxPath(a)).body;
  ASSERT_TRUE(waitState(b, "paused", 3)) << client_->get(sandboxPath(b)).body;
  EXPECT_EQ(client_->get(sandboxPath(a)).json()["paused_by"], "lease");
  EXPECT_EQ(client_->get(sandboxPath(b)).json()["paused_by"], "lease");
  EXPECT_EQ(sandboxState(a)["paused_by"], "lease") << "paused_by is persisted";
  auto out_info = client_->get(sandboxPath(outside)).json();
  EXPECT_EQ(out_info["state"], "running");
  EXPECT_TRUE(out_info["paused_by"].is_null());
  s = client_->get("/v1/sessions/run-42").json();
  EXPECT_EQ(s["state"], "lapsed");
  EXPECT_TRUE(s["lapsed_unix"].is_number());

  // The counter in `a` is frozen; the one outside the session keeps counting.
  std::string frozen1 = peek(a, "/tmp/counter"), out1 = peek(outside, "/tmp/counter");
  EXPECT_FALSE(frozen1.empty());
  EXPECT_TRUE(changes(outside, "/tmp/counter", out1, 20)) << "a sandbox outside the session was affected";
  EXPECT_EQ(peek(a, "/tmp/counter"), frozen1) << "the paused sandbox's process still runs";

  std::string metrics = client_->get("/metrics").body;
  EXPECT_NE(metrics.find("dsec_sandboxes_paused_by_lease 2"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("dsec_session_lapses_total 1"), std::string::npos);
  EXPECT_NE(metrics.find("dsec_sessions{state=\"lapsed\"} 1"), std::string::npos);

  // A lapsed session takes no new sandboxes.
  auto c = client_->postJson("/v1/sandboxes", {{"image", "busybox:1"}, {"session", "run-42"}});
  EXPECT_EQ(c.status, 409) << c.body;
  EXPECT_NE(c.body.find("attach"), std::string::npos) << c.body;

  // The requeued trainer attaches: both are listed, still paused until their first request.
  auto at = attach("run-42", {{"lease", 30}});
  ASSERT_EQ(at.status, 200) << at.body;
  json att = at.json();
  EXPECT_EQ(att["state"], "active");
  EXPECT_TRUE(att["lapsed_unix"].is_null());
  EXPECT_EQ(att["lease"], 30);
  ASSERT_EQ(att["sandbox_infos"].size(), 2u) << at.body;
  std::set<std::string> ids;
  for (const auto& i : att["sandbox_infos"]) {
    ids.insert(i["id"].get<std::string>());
    EXPECT_EQ(i["state"], "paused");
    EXPECT_EQ(i["paused_by"], "lease");
  }
  EXPECT_EQ(ids, (std::set<std::string>{a, b}));

  auto e = exec(a, {{"cmd",
                     "cat /tmp/state; c1=$(cat /tmp/counter); c2=$c1; n=0; "
                     "while [ $c2 -le $c1 ] && [ $n -lt 200 ]; do sleep 0.1; c2=$(cat /tmp/counter); n=$((n+1)); done; "
                     "[ $c2 -gt $c1 ] && echo counting"}});
  ASSERT_EQ(e.status, 200) << e.body;
  EXPECT_EQ(e.json()["stdout"], "kept\ncounting\n") << e.body;
  auto ai = client_->get(sandboxPath(a)).json();
  EXPECT_EQ(ai["state"], "running");
  EXPECT_TRUE(ai["paused_by"].is_null());
  EXPECT_TRUE(sandboxState(a)["paused_by"].is_null());
  e = exec(b, {{"cmd", "ps -o args | grep -c '^sleep 1000'"}});
  EXPECT_EQ(e.json()["stdout"], "1\n") << "the background process did not survive the pause";
  metrics = client_->get("/metrics").body;
  EXPECT_NE(metrics.find("dsec_sandboxes_paused_by_lease 0"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("dsec_sessions{state=\"active\"} 1"), std::string::npos);

  // DELETE destroys the session's sandboxes, and only those.
  auto d = client_->del("/v1/sessions/run-42");
  ASSERT_EQ(d.status, 200) << d.body;
  EXPECT_EQ(d.json()["destroyed"], 2);
  EXPECT_EQ(client_->get(sandboxPath(a)).status, 404);
  EXPECT_EQ(client_->get(sandboxPath(b)).status, 404);
  EXPECT_EQ(client_->get(sandboxPath(outside)).json()["state"], "running");
  EXPECT_EQ(client_->get("/v1/sessions/run-42").status, 404);
  EXPECT_NE(::access((root_->path() + "/state/sessions/run-42.json").c_str(), F_OK), 0);
}

TEST_F(SessionApiTest, LapseReclaimsMemory) {
  startNode();
  SKIP_WITHOUT_BACKEND();
  ASSERT_EQ(put("reclaim", {{"lease", 1}, {"retention", 600}}).status, 200);
  // The only sandbox on this root's layer mount: the page cache of what it reads is charged to it.
  // idle_timeout 2: a lease-paused sandbox must not count as idle (it is kept for the retention).
  std::string a = createSandbox({{"session", "reclaim"}, {"idle_timeout", 2}});
  ASSERT_FALSE(a.empty());
  std::string parent = launcher::cgroupParentForRoot(root_->path());
  if (std::filesystem::exists("/sys/fs/cgroup/cgroup.controllers") &&
      !std::filesystem::exists("/sys/fs/cgroup/" + parent + "/" + a + "/memory.reclaim")) {
    GTEST_SKIP() << "cgroup v2 without memory.reclaim (Linux < 5.19): nothing to reclaim with";
  }
  auto e =
      exec(a, {{"cmd", "cat /bin/busybox > /dev/null; find / -xdev > /dev/null 2>&1; sleep 1000 > /dev/null 2>&1 &"}});
  ASSERT_EQ(e.json()["exit_code"], 0) << e.body;
  int64_t before = client_->get(sandboxPath(a)).json()["usage"]["memory_bytes"];
  ASSERT_TRUE(waitState(a, "paused", 8));
  // The reaper reclaims right after freezing; on a loaded machine that may take a while.
  int64_t after = before;
  for (double end = monotonicSeconds() + 20; after >= before * 3 / 4 && monotonicSeconds() < end;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    after = client_->get(sandboxPath(a)).json()["usage"]["memory_bytes"];
  }
  EXPECT_LT(after, before * 3 / 4) << "memory of a lease-paused sandbox was not reclaimed (" << before << " -> "
                                   << after << " bytes)";
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  auto i = client_->get(sandboxPath(a));
  ASSERT_EQ(i.status, 200) << "the idle reaper destroyed a sandbox paused by its session's lease";
  EXPECT_EQ(i.json()["paused_by"], "lease");
  auto r = exec(a, {{"cmd", "ps -o args | grep -c '^sleep 1000'"}});
  EXPECT_EQ(r.json()["stdout"], "1\n") << r.body;
}

TEST_F(SessionApiTest, RetentionAfterLapseDestroysEverything) {
  startNode();
  SKIP_WITHOUT_BACKEND();
  ASSERT_EQ(put("short", {{"lease", 1}, {"retention", 1}}).status, 200);
  std::string a = createSandbox({{"session", "short"}});
  std::string b = createSandbox({{"session", "short"}});
  ASSERT_FALSE(a.empty() || b.empty());
  ASSERT_EQ(exec(a, {{"cmd", "sleep 1000 > /dev/null 2>&1 &"}}).json()["exit_code"], 0);
  ASSERT_TRUE(cgroupExists(a));
  double end = monotonicSeconds() + 10;
  while (monotonicSeconds() < end && client_->get("/v1/sessions/short").status == 200) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(client_->get("/v1/sessions/short").status, 404) << "the session outlived lease + retention";
  // The node drops the session first, then destroys its sandboxes (each a kill and wait): give it a moment.
  for (const auto& id : {a, b}) {
    for (double until = monotonicSeconds() + 10;
         monotonicSeconds() < until && client_->get(sandboxPath(id)).status == 200;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_EQ(client_->get(sandboxPath(id)).status, 404) << id << " outlived its session";
  }
  EXPECT_FALSE(cgroupExists(a)) << "cgroup of a reaped session sandbox left behind";
  EXPECT_FALSE(cgroupExists(b));
  EXPECT_NE(::access((root_->path() + "/state/sandboxes/" + a + ".json").c_str(), F_OK), 0);
  EXPECT_NE(::access((root_->path() + "/state/sessions/short.json").c_str(), F_OK), 0);
  EXPECT_EQ(client_->get("/v1/sandboxes").json()["sandboxes"].size(), 0u);
}

TEST_F(SessionApiTest, NodeRestartKeepsSessionsAndTheirSandboxes) {
  startNode();
  SKIP_WITHOUT_BACKEND();
  ASSERT_EQ(put("survivor", {{"lease", 60}, {"retention", 600}}).status, 200);
  std::string a = createSandbox({{"session", "survivor"}});
  std::string dead = createSandbox({{"session", "survivor"}});
  ASSERT_FALSE(a.empty() || dead.empty());
  ASSERT_EQ(exec(a, {{"cmd", "echo kept > /tmp/state; sleep 1000 > /dev/null 2>&1 &"}}).json()["exit_code"], 0);
  node_->stop(/*destroy_sandboxes=*/false);
  node_.reset();
  // One member dies while the node is down: the restart drops it from the session.
  pid_t init = sandboxState(dead)["backend_state"]["init_pid"].get<pid_t>();
  ASSERT_EQ(::kill(init, SIGKILL), 0);
  for (int i = 0; i < 100 && ::kill(init, 0) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));

  startNode();
  auto s = client_->get("/v1/sessions/survivor");
  ASSERT_EQ(s.status, 200) << s.body;
  EXPECT_EQ(s.json()["state"], "active");
  EXPECT_EQ(s.json()["retention"], 600);
  EXPECT_EQ(s.json()["sandboxes"], json::array({a}));
  EXPECT_EQ(client_->get(sandboxPath(a)).json()["session"], "survivor");
  auto list = client_->get("/v1/sessions").json();
  ASSERT_EQ(list["sessions"].size(), 1u);
  auto at = attach("survivor", json::object());
  ASSERT_EQ(at.status, 200) << at.body;
  EXPECT_EQ(at.json()["lease"], 60) << "attach without a lease keeps the session's";
  ASSERT_EQ(at.json()["sandbox_infos"].size(), 1u);
  auto e = exec(a, {{"cmd", "cat /tmp/state; ps -o args | grep -c '^sleep 1000'"}});
  EXPECT_EQ(e.json()["stdout"], "kept\n1\n") << e.body;

  // Destroying a sandbox removes it from its session (persisted).
  ASSERT_EQ(client_->del(sandboxPath(a)).status, 200);
  EXPECT_EQ(client_->get("/v1/sessions/survivor").json()["sandboxes"], json::array());
  auto file = json::parse(*readFile(root_->path() + "/state/sessions/survivor.json"));
  EXPECT_EQ(file["sandboxes"], json::array());
}

TEST_F(SessionApiTest, ValidationErrors) {
  startNode();
  // Session routes need no backend.
  auto r = put("-bad", json::object());
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.errorCode(), "invalid_request");
  EXPECT_NE(r.body.find("[A-Za-z0-9]"), std::string::npos) << r.body;
  EXPECT_EQ(put(std::string(65, 'x'), json::object()).status, 400);
  EXPECT_EQ(client_->get("/v1/sessions/a%20b").status, 400);
  EXPECT_EQ(put("ok", {{"lease", 0}}).status, 400);
  EXPECT_EQ(put("ok", {{"lease", 86401}}).status, 400);
  EXPECT_EQ(put("ok", {{"retention", -1}}).status, 400);
  EXPECT_EQ(put("ok", {{"lease", "60"}}).status, 400);
  r = put("ok", {{"leese", 60}});
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("leese"), std::string::npos);
  EXPECT_EQ(client_->request(verb::put, "/v1/sessions/ok", "[1]", {{"Content-Type", "application/json"}}).status, 400);
  EXPECT_EQ(client_->get("/v1/sessions/unknown").status, 404);
  EXPECT_EQ(attach("unknown", json::object()).status, 404);
  EXPECT_EQ(client_->del("/v1/sessions/unknown").status, 404);
  EXPECT_EQ(client_->request(verb::post, "/v1/sessions/x").status, 405);

  // No body: defaults. Renewal without fields keeps them.
  r = client_->request(verb::put, "/v1/sessions/defaults");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["lease"], 60);
  EXPECT_EQ(r.json()["retention"], 3600);
  ASSERT_EQ(put("defaults", {{"retention", 5}}).status, 200);
  r = put("defaults", json::object());
  EXPECT_EQ(r.json()["retention"], 5);
  EXPECT_EQ(attach("defaults", {{"retention", 5}}).status, 400);
  EXPECT_EQ(client_->get("/v1/sessions").json()["sessions"].size(), 1u);

  SKIP_WITHOUT_BACKEND();
  auto c = client_->postJson("/v1/sandboxes", {{"image", "busybox:1"}, {"session", "nope"}});
  EXPECT_EQ(c.status, 404) << c.body;
  EXPECT_NE(c.body.find("nope"), std::string::npos);
  c = client_->postJson("/v1/sandboxes", {{"image", "busybox:1"}, {"session", "bad name!"}});
  EXPECT_EQ(c.status, 400) << c.body;
  EXPECT_NE(c.body.find("session"), std::string::npos);
  EXPECT_EQ(client_->postJson("/v1/sandboxes", {{"image", "busybox:1"}, {"session", 5}}).status, 400);
  EXPECT_EQ(client_->get("/v1/sandboxes").json()["sandboxes"].size(), 0u);
}

}  // namespace
}  // namespace dsec::testing
