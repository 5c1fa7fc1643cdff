// Sandboxes through the API with the real container backend: create, exec (buffered and streamed), files,
// tar, pause/resume, labels, timeouts, capacity and concurrent creates.
#include <filesystem>
#include <thread>

#include "ApiFixture.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {
namespace {

using boost::beast::http::verb;
using nlohmann::json;

TEST_F(ApiTest, CreateExecDestroy) {
  startNode();
  SKIP_WITHOUT_BACKEND();
  auto r = client_->postJson("/v1/sandboxes", {{"image", "busybox:1"},
                                               {"memory", "64M"},
                                               {"cpus", 0.5},
                                               {"pids", 64},
                                               {"env", {{"GREETING", "hello"}}},
                                               {"labels", {{"run", "7"}}}});
  ASSERT_EQ(r.status, 201) << r.body;
  json info = r.json();
  std::string id = info["id"];
  EXPECT_EQ(id.rfind("t0-", 0), 0u);
  EXPECT_EQ(id.size(), 3u + 16u);
  EXPECT_EQ(info["node"], "t0");
  EXPECT_EQ(info["state"], "running");
  EXPECT_EQ(info["image"], "busybox:1");
  EXPECT_EQ(info["memory"], 64 << 20);
  EXPECT_EQ(info["labels"]["run"], "7");
  EXPECT_TRUE(info["usage"].contains("memory_bytes"));
  EXPECT_FALSE(info["created"].get<std::string>().empty());

  auto e = exec(id, {{"cmd", "echo $GREETING; echo err >&2; exit 3"}});
  ASSERT_EQ(e.status, 200) << e.body;
  EXPECT_EQ(e.json()["stdout"], "hello\n");
  EXPECT_EQ(e.json()["stderr"], "err\n");
  EXPECT_EQ(e.json()["exit_code"], 3);
  EXPECT_EQ(e.json()["timed_out"], false);
  e = exec(id, {{"cmd", {"cat"}}, {"stdin", "from stdin"}});
  EXPECT_EQ(e.json()["stdout"], "from stdin");
  e = exec(id, {{"cmd", {"cat"}}, {"stdin_b64", "AAEC"}, {"output_cap", 2}});
  EXPECT_EQ(e.json()["truncated"], true) << e.body;
  e = exec(id, {{"cmd", "hostname; pwd"}, {"cwd", "/tmp"}, {"env", {{"X", "y"}}}});
  EXPECT_EQ(e.json()["stdout"], id + "\n/tmp\n");
  e = exec(id, {{"cmd", "sleep 10"}, {"timeout", 0.5}});
  ASSERT_EQ(e.status, 200);
  EXPECT_EQ(e.json()["timed_out"], true);
  EXPECT_EQ(e.json()["exit_code"], 137);
  e = exec(id, {{"cmd", "printf '\\377\\376ok'"}});
  ASSERT_EQ(e.status, 200) << "invalid UTF-8 must not break the JSON";
  EXPECT_NE(e.json()["stdout"].get<std::string>().find("ok"), std::string::npos);
  e = exec(id, {{"cmd", {"/no/such/program"}}});
  ASSERT_EQ(e.status, 200);
  EXPECT_EQ(e.json()["exit_code"], 127);

  auto d = client_->del(sandboxPath(id));
  ASSERT_EQ(d.status, 200) << d.body;
  EXPECT_EQ(d.json()["destroyed"], true);
  EXPECT_EQ(client_->get(sandboxPath(id)).status, 404);
  EXPECT_EQ(client_->del(sandboxPath(id)).status, 404);
  EXPECT_NE(::access((root_->path() + "/state/sandboxes/" + id + ".json").c_str(), F_OK), 0);
}

TEST_F(ApiTest, ExecStreamIsNdjson) {
  startNode();
  SKIP_WITHOUT_BACKEND();
  std::string id = createSandbox();
  ASSERT_FALSE(id.empty());
  auto r = client_->postJson(sandboxPath(id, "/exec/stream"),
                             {{"cmd", "echo one; sleep 0.2; echo two >&2; printf 'caf\\303\\251'; exit 4"}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.headers["content-type"], "application/x-ndjson");
  EXPECT_EQ(r.headers["transfer-encoding"], "chunked");
  std::string out, err;
  json last;
  int lines = 0;
  for (const auto& line : split(r.body, '\n')) {
    if (line.empty()) continue;
    ++lines;
    json j = json::parse(line);
    if (j.contains("done")) {
      last = j;
    } else if (j.contains("stdout")) {
      out += j["stdout"].get<std::string>();
    } else if (j.contains("stderr")) {
      err += j["stderr"].get<std::string>();
    }
  }
  EXPECT_EQ(out, "one\ncafé");
  EXPECT_EQ(err, "two\n");
  ASSERT_TRUE(last.is_object()) << r.body;
  EXPECT_EQ(last["exit_code"], 4);
  EXPECT_EQ(last["done"], true);
  EXPECT_EQ(last["stdout"], "");
  EXPECT_GE(lines, 3);
}

TEST_F(ApiTest, FilesSmall) {
  startNode();
  SKIP_WITHOUT_BACKEND();
  std::string id = createSandbox();
  ASSERT_FALSE(id.empty());
  auto put = client_->request(verb::put, sandboxPath(id, "/files?path=/work/dir/a.txt&mode=0600"), "hello file");
  ASSERT_EQ(put.status, 200) << put.body;
  EXPECT_EQ(put.json()["size"], 10);
  auto get = client_->get(sandboxPath(id, "/files?path=/work/dir/a.txt"));
  ASSERT_EQ(get.status, 200);
  EXPECT_EQ(get.body, "hello file");
  EXPECT_EQ(get.headers["content-type"], "application/octet-stream");
  auto st = client_->get(sandboxPath(id, "/files/stat?path=/work/dir/a.txt"));
  ASSERT_EQ(st.status, 200) << st.body;
  EXPECT_EQ(st.json()["type"], "file");
  EXPECT_EQ(st.json()["size"], 10);
  EXPECT_EQ(st.json()["mode"], 0600);
  auto ls = client_->get(sandboxPath(id, "/files/list?path=/work/dir"));
  ASSERT_EQ(ls.status, 200) << ls.body;
  ASSERT_EQ(ls.json()["entries"].size(), 1u);
  EXPECT_EQ(ls.json()["entries"][0]["name"], "a.txt");
  EXPECT_EQ(exec(id, {{"cmd", "cat /work/dir/a.txt"}}).json()["stdout"], "hello file");
  EXPECT_EQ(client_->get(sandboxPath(id, "/files?path=/work/missing")).status, 404);
  EXPECT_EQ(client_->get(sandboxPath(id, "/files?path=relative")).status, 400);
  EXPECT_EQ(client_->request(verb::put, sandboxPath(id, "/files?path=/x&mode=999"), "x").status, 400);
  auto rm = client_->del(sandboxPath(id, "/files?path=/work&recursive=1"));
  ASSERT_EQ(rm.status, 200) << rm.body;
  EXPECT_EQ(rm.json()["removed"], true);
  EXPECT_EQ(client_->get(sandboxPath(id, "/files/stat?path=/work")).status, 404);
  // Symlinks cannot lead out of the sandbox.
  ASSERT_EQ(exec(id, {{"cmd", "ln -s /../../../../etc/hostname /tmp/esc"}}).json()["exit_code"], 0);
  auto esc = client_->get(sandboxPath(id, "/files?path=/tmp/esc"));
  std::string host_hostname = trim(readFile("/etc/hostname").ok() ? *readFile("/etc/hostname") : "");
  if (esc.status == 200 && !host_hostname.empty()) {
    EXPECT_NE(trim(esc.body), host_hostname);
  }
}

TEST_F(ApiTest, LargeFileStreamsBothWaysWithoutBuffering) {
  startNode();
  SKIP_WITHOUT_BACKEND();
  std::string id = createSandbox({{"disk", "512M"}});
  ASSERT_FALSE(id.empty());
  constexpr uint64_t kSize = 50ULL << 20;
  auto pattern = [](uint64_t offset) {
    std::string piece(1 << 20, '\0');
    for (size_t i = 0; i < piece.size(); ++i) piece[i] = static_cast<char>(((offset + i) * 131) >> 7);
    return piece;
  };
  int64_t rss_before = residentBytes();
  resetPeakRss();
  auto put = client_->putStreamed(sandboxPath(id, "/files?path=/big.bin"), kSize, pattern);
  ASSERT_EQ(put.status, 200) << put.body;
  EXPECT_EQ(put.json()["size"], kSize);
  uint64_t got = 0;
  bool same = true;
  auto get = client_->getStreamed(sandboxPath(id, "/files?path=/big.bin"), [&](const char* data, size_t n) {
    for (size_t i = 0; i < n && same; ++i) {
      if (data[i] != static_cast<char>(((got + i) * 131) >> 7)) same = false;
    }
    got += n;
  });
  ASSERT_EQ(get.status, 200);
  EXPECT_EQ(got, kSize);
  EXPECT_TRUE(same) << "content differs";
  EXPECT_EQ(get.headers["content-length"], std::to_string(kSize));
  int64_t peak = peakResidentBytes();
  if (rss_before > 0 && peak > 0) {
    EXPECT_LT(peak - rss_before, 30LL << 20) << "the node (same process) seems to buffer the 50 MB file";
  }
  auto sum = exec(id, {{"cmd", "wc -c < /big.bin"}});
  EXPECT_EQ(trim(sum.json()["stdout"].get<std::string>()), std::to_string(kSize));
}

TEST_F(ApiTest, DiskQuotaStopsAnUpload) {
  startNode();
  SKIP_WITHOUT_BACKEND();
  std::string id = createSandbox({{"disk", "4M"}});
  ASSERT_FALSE(id.empty());
  auto put = client_->putStreamed(sandboxPath(id, "/files?path=/fill.bin"), 16 << 20,
                                  [](uint64_t) { return std::string(1 << 20, 'z'); });
  EXPECT_EQ(put.status, 413) << put.body;
  EXPECT_EQ(client_->get("/v1/node").status, 200);
}

TEST_F(ApiTest, TarUploadAndDownload) {
  startNode();
  SKIP_WITHOUT_BACKEND();
  std::string id = createSandbox();
  ASSERT_FALSE(id.empty());
  TempDir local;
  std::filesystem::create_directories(local.path() + "/src/sub");
  ASSERT_OK(writeFile(local.path() + "/src/a.txt", "alpha"));
  ASSERT_OK(writeFile(local.path() + "/src/sub/b.txt", "beta"));
  ASSERT_OK(runCommandChecked({"tar", "-C", local.path() + "/src", "-cf", local.path() + "/up.tar", "."}));
  auto tarball = readFile(local.path() + "/up.tar");
  ASSERT_OK(tarball);
  auto up = client_->request(verb::put, sandboxPath(id, "/tar?path=/work/proj"), *tarball,
                             {{"Content-Type", "application/x-tar"}});
  ASSERT_EQ(up.status, 200) << up.body;
  EXPECT_EQ(up.json()["path"], "/work/proj");
  EXPECT_EQ(exec(id, {{"cmd", "cat /work/proj/a.txt /work/proj/sub/b.txt"}}).json()["stdout"], "alphabeta");
  EXPECT_EQ(exec(id, {{"cmd", "ls /tmp | grep -c dsec-upload"}}).json()["stdout"], "0\n") << "staging file left";

  ASSERT_EQ(exec(id, {{"cmd", "echo gamma > /work/proj/sub/c.txt"}}).json()["exit_code"], 0);
  auto down = client_->get(sandboxPath(id, "/tar?path=/work/proj"));
  ASSERT_EQ(down.status, 200) << down.body;
  EXPECT_EQ(down.headers["content-type"], "application/x-tar");
  ASSERT_OK(writeFile(local.path() + "/down.tar", down.body));
  std::filesystem::create_directories(local.path() + "/out");
  ASSERT_OK(runCommandChecked({"tar", "-C", local.path() + "/out", "-xf", local.path() + "/down.tar"}));
  EXPECT_EQ(*readFile(local.path() + "/out/a.txt"), "alpha");
  EXPECT_EQ(*readFile(local.path() + "/out/sub/c.txt"), "gamma\n");

  EXPECT_EQ(client_->get(sandboxPath(id, "/tar?path=/nonexistent")).status, 404);
  auto bad = client_->request(verb::put, sandboxPath(id, "/tar?path=/work/bad"), "this is not a tar archive");
  EXPECT_EQ(bad.status, 400) << bad.body;
}

TEST_F(ApiTest, PauseResumeAndTransparentResume) {
  startNode();
  SKIP_WITHOUT_BACKEND();
  std::string id = createSandbox();
  ASSERT_FALSE(id.empty());
  auto p = client_->request(verb::post, sandboxPath(id, "/pause"));
  ASSERT_EQ(p.status, 200) << p.body;
  EXPECT_EQ(p.json()["state"], "paused");
  EXPECT_EQ(client_->get(sandboxPath(id)).json()["state"], "paused");
  auto state = json::parse(*readFile(root_->path() + "/state/sandboxes/" + id + ".json"));
  EXPECT_EQ(state["paused_by"], "user");  // the record (StateRecord.h) says why it is paused
  auto e = exec(id, {{"cmd", "echo awake"}});
  ASSERT_EQ(e.status, 200) << e.body;
  EXPECT_EQ(e.json()["stdout"], "awake\n");
  EXPECT_EQ(client_->get(sandboxPath(id)).json()["state"], "running");
  ASSERT_EQ(client_->request(verb::post, sandboxPath(id, "/pause")).status, 200);
  auto r = client_->request(verb::post, sandboxPath(id, "/resume"));
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.json()["state"], "running");
  ASSERT_EQ(client_->request(verb::post, sandboxPath(id, "/pause")).status, 200);
  EXPECT_EQ(client_->get(sandboxPath(id, "/files/stat?path=/etc/passwd")).status, 200);
  EXPECT_EQ(client_->get(sandboxPath(id)).json()["state"], "running") << "a file request resumes too";
}

TEST_F(ApiTest, LabelsFilterList) {
  startNode();
  SKIP_WITHOUT_BACKEND();
  std::string a = createSandbox({{"labels", {{"run", "1"}, {"role", "x"}}}});
  std::string b = createSandbox({{"labels", {{"run", "2"}}}});
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  auto all = client_->get("/v1/sandboxes");
  EXPECT_EQ(all.json()["sandboxes"].size(), 2u);
  auto one = client_->get("/v1/sandboxes?label=run=1");
  ASSERT_EQ(one.json()["sandboxes"].size(), 1u);
  EXPECT_EQ(one.json()["sandboxes"][0]["id"], a);
  EXPECT_EQ(client_->get("/v1/sandboxes?label=run=1&label=role=y").json()["sandboxes"].size(), 0u);
  EXPECT_EQ(client_->get("/v1/sandboxes?label=run%3D2").json()["sandboxes"].size(), 1u);
}

TEST_F(ApiTest, IdleAndAbsoluteTimeoutsReap) {
  startNode();
  SKIP_WITHOUT_BACKEND();
  std::string idle = createSandbox({{"idle_timeout", 1}});
  std::string busy = createSandbox({{"idle_timeout", 1.5}});
  std::string limited = createSandbox({{"timeout", 2}});
  ASSERT_FALSE(idle.empty() || busy.empty() || limited.empty());
  // A long exec counts as activity for its whole duration.
  auto e = exec(busy, {{"cmd", "sleep 2.5; echo done"}});
  EXPECT_EQ(e.json()["stdout"], "done\n");
  EXPECT_EQ(client_->get(sandboxPath(busy)).status, 200) << "reaped while an exec was running";
  EXPECT_EQ(client_->get(sandboxPath(idle)).status, 404) << "idle sandbox not reaped";
  double deadline = monotonicSeconds() + 5;
  while (client_->get(sandboxPath(limited)).status == 200 && monotonicSeconds() < deadline) {
    (void)exec(limited, {{"cmd", "true"}});  // activity does not extend an absolute timeout
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(client_->get(sandboxPath(limited)).status, 404);
  EXPECT_NE(client_->get("/metrics").body.find("dsec_sandbox_reaped_total"), std::string::npos);
}

// PUT .../timeout: the sandbox ends that long from now (E2B's setTimeout; extending an agent's sandbox).
TEST_F(ApiTest, ATimeoutSetWhileTheSandboxRunsIsCountedFromNow) {
  startNode();
  SKIP_WITHOUT_BACKEND();
  // `kept` is created last and extended at once: its first timeout (3 s) leaves room for that one request however
  // slow the machine, and it is checked only once that first timeout and a reaper pass (1 s) are well past.
  constexpr double kFirstTimeout = 3;
  std::string ended = createSandbox({{"timeout", 3600}});
  std::string kept = createSandbox({{"timeout", kFirstTimeout}});
  const double kept_created = monotonicSeconds();
  ASSERT_FALSE(kept.empty() || ended.empty());
  auto extended = client_->putJson(sandboxPath(kept) + "/timeout", {{"timeout", 3600}});
  ASSERT_EQ(extended.status, 200) << extended.body;
  EXPECT_GT(extended.json()["timeout"].get<double>(), 3600);  // its age plus an hour
  auto shortened = client_->putJson(sandboxPath(ended) + "/timeout", {{"timeout", 0.5}});
  ASSERT_EQ(shortened.status, 200) << shortened.body;
  const double deadline = monotonicSeconds() + 10;
  while (client_->get(sandboxPath(ended)).status == 200 && monotonicSeconds() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(client_->get(sandboxPath(ended)).status, 404) << "a shortened timeout did not end the sandbox";
  // Asserting that something did not happen needs its time to pass: until the old timeout plus two reaper passes.
  const double past_old_timeout = kept_created + kFirstTimeout + 2.0;
  if (monotonicSeconds() < past_old_timeout) {
    std::this_thread::sleep_for(std::chrono::duration<double>(past_old_timeout - monotonicSeconds()));
  }
  EXPECT_EQ(client_->get(sandboxPath(kept)).status, 200) << "an extended sandbox was reaped at its old timeout";
  auto none = client_->putJson(sandboxPath(kept) + "/timeout", {{"timeout", 0}});
  ASSERT_EQ(none.status, 200);
  EXPECT_EQ(none.json()["timeout"].get<double>(), 0);
  EXPECT_EQ(client_->putJson(sandboxPath(kept) + "/timeout", {{"timeout", -1}}).status, 400);
  EXPECT_EQ(client_->putJson(sandboxPath(kept) + "/timeout", {{"seconds", 5}}).status, 400);
  EXPECT_EQ(client_->putJson("/v1/sandboxes/n0-0000000000000000/timeout", {{"timeout", 5}}).status, 404);
}

TEST_F(ApiTest, CapacityGives429WithRetryAfter) {
  auto o = options();
  o.node.max_sandboxes = 1;
  ASSERT_TRUE(startNode(o));
  SKIP_WITHOUT_BACKEND();
  ASSERT_FALSE(createSandbox().empty());
  auto r = client_->postJson("/v1/sandboxes", {{"image", "busybox:1"}});
  EXPECT_EQ(r.status, 429) << r.body;
  EXPECT_EQ(r.errorCode(), "capacity");
  EXPECT_EQ(r.headers["retry-after"], "1");
  EXPECT_EQ(r.json()["error"]["retry_after"], 1);
}

TEST_F(ApiTest, ConcurrentCreates) {
  startNode();
  SKIP_WITHOUT_BACKEND();
  constexpr int kCount = 32;
  std::vector<std::string> ids(kCount);
  std::vector<int> statuses(kCount, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < kCount; ++i) {
    threads.emplace_back([&, i] {
      HttpTestClient c(node_->endpoint(), node_->token());
      auto r = c.postJson("/v1/sandboxes", {{"image", "busybox:1"}, {"memory", "32M"}, {"labels", {{"batch", "c"}}}});
      statuses[i] = r.status;
      if (r.status == 201) {
        ids[i] = r.json()["id"];
        auto e = c.postJson("/v1/sandboxes/" + ids[i] + "/exec", {{"cmd", "echo ok"}});
        if (e.status != 200 || e.json()["stdout"] != "ok\n") statuses[i] = -e.status;
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kCount; ++i) EXPECT_EQ(statuses[i], 201) << "create " << i;
  EXPECT_EQ(client_->get("/v1/sandboxes?label=batch=c").json()["sandboxes"].size(), static_cast<size_t>(kCount));
  auto metrics = client_->get("/metrics").body;
  EXPECT_NE(metrics.find("dsec_sandbox_creates_total 32"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("dsec_sandboxes{state=\"running\"} 32"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("dsec_execs_total 32"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("dsec_layer_mounts 1"), std::string::npos) << metrics;
}

TEST_F(ApiTest, ClientGoneMidExecStream) {
  startNode();
  SKIP_WITHOUT_BACKEND();
  std::string id = createSandbox();
  ASSERT_FALSE(id.empty());
  std::string body = json{{"cmd", "while true; do echo spam; done"}}.dump();
  std::string req = "POST " + sandboxPath(id, "/exec/stream") + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                    node_->token() + "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  std::string got = client_->raw(req, 0.5);  // reads a little, then closes the connection
  EXPECT_NE(got.find("spam"), std::string::npos);
  // The command is stopped when the client leaves: no spam loop keeps running.
  double deadline = monotonicSeconds() + 5;
  int loops = -1;
  while (monotonicSeconds() < deadline) {
    std::string ps = exec(id, {{"cmd", {"ps", "-o", "args"}}}).json()["stdout"];
    loops = 0;
    for (const auto& line : split(ps, '\n')) loops += line.find("echo spam") != std::string::npos ? 1 : 0;
    if (loops == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(loops, 0) << "the streamed command kept running after its client left";
  EXPECT_EQ(client_->get("/healthz").status, 200);
}

}  // namespace
}  // namespace dsec::testing
