// Attack: read the agent's memory (its token) through the processes it starts inside a sandbox. A watcher runs as
// root inside the sandbox, SIGSTOPs every new process and steps it while trying /proc/N/mem, while the test drives
// execs, file writes and tar uploads from outside through the real node API. When execs were cloned sharing the
// agent's memory this read the fleet token on every exec. The test fails if the watcher ever finds the token
// anywhere but in a canary of its own, or if an exec stopped by it holds the caller past its timeout.
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "../launcher/ApiFixture.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {
namespace {

using boost::beast::http::verb;

// One file "hello.txt" in a ustar archive.
std::string tinyTar() {
  std::string header(512, '\0');
  auto put = [&](size_t off, const std::string& v) { header.replace(off, v.size(), v); };
  put(0, "hello.txt");
  put(100, "0000644");
  put(108, "0000000");
  put(116, "0000000");
  put(124, "00000000006");
  put(136, "00000000000");
  put(156, "0");
  put(257, "ustar");
  put(263, "00");
  std::fill(header.begin() + 148, header.begin() + 156, ' ');
  unsigned sum = 0;
  for (unsigned char c : header) sum += c;
  char chk[8];
  snprintf(chk, sizeof chk, "%06o", sum);
  put(148, std::string(chk, 6) + std::string("\0 ", 2));
  std::string body = "hello\n";
  body.resize(512, '\0');
  return header + body + std::string(1024, '\0');
}

TEST_F(ApiTest, ExecWindowNeverExposesTheAgentsMemory) {
  startNode();
  SKIP_WITHOUT_BACKEND();
  // The agent must not be dumpable either: then nothing but host root may read it even on the host.
  EXPECT_EQ(prctl(PR_GET_DUMPABLE), 0) << "the process hosting sandboxes is dumpable";
  const std::string token = node_->token();
  ASSERT_GE(token.size(), 32u);
  std::string reversed(token.rbegin(), token.rend());

  std::string id = createSandbox({{"memory", "256M"}});
  ASSERT_FALSE(id.empty());
  auto watcher = readFile(DSEC_TEST_EXEC_WATCHER);
  ASSERT_OK(watcher);
  auto put = client_->request(verb::put, sandboxPath(id, "/files?path=/tmp/watcher&mode=0755"), *watcher);
  ASSERT_EQ(put.status, 200) << put.body;
  // A canary: a process of the sandbox's own holding the token. The watcher must find it there, which proves it
  // reads the memory of every process it is allowed to.
  // The watcher starts only once the canary is its settled self (sleep, the token in its environment): a watcher
  // that came upon it mid-exec could read its memory between two images, find nothing and never look again.
  auto canary =
      exec(id, {{"cmd", "T=" + token +
                            " sh -c 'echo $$ > /tmp/canary.pid; exec sleep 1000' "
                            "</dev/null >/dev/null 2>&1 & "
                            "n=0; while ! grep -q sleep /proc/$(cat /tmp/canary.pid 2>/dev/null || echo 0)/cmdline "
                            "2>/dev/null && [ $n -lt 1000 ]; do usleep 10000; n=$((n+1)); done"},
                {"timeout", 30}});
  ASSERT_EQ(canary.status, 200) << canary.body;
  auto started = exec(id, {{"cmd", "/tmp/watcher " + reversed + " /tmp/stop >/tmp/watch.log 2>&1 </dev/null &"}});
  ASSERT_EQ(started.status, 200) << started.body;

  const std::string tar = tinyTar();
  constexpr int kRounds = 30;
  for (int round = 0; round < kRounds; ++round) {
    auto t0 = std::chrono::steady_clock::now();
    auto e = exec(id, {{"cmd", {"/bin/true"}}, {"timeout", 5}});
    double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_EQ(e.status, 200) << "round " << round << ": " << e.body;
    EXPECT_LT(took, 5 + 10.0) << "an exec the watcher stopped held the caller past its timeout";
    auto w = client_->request(verb::put, sandboxPath(id, "/files?path=/work/f" + std::to_string(round)), "data");
    EXPECT_EQ(w.status, 200) << w.body;
    auto t = client_->request(verb::put, sandboxPath(id, "/tar?path=/work/t" + std::to_string(round)), tar,
                              {{"Content-Type", "application/x-tar"}});
    EXPECT_EQ(t.status, 200) << t.body;
  }
  // The watcher writes its summary ("seen ...") as it exits, which on a loaded machine may take a while: wait
  // for that line (bounded by the exec's timeout), not a fixed time.
  auto stop = exec(id, {{"cmd",
                         "touch /tmp/stop; n=0; while ! grep -q '^seen' /tmp/watch.log && [ $n -lt 1500 ]; do "
                         "usleep 20000; n=$((n+1)); done; cat /tmp/watch.log; echo; cat /tmp/canary.pid"},
                        {"timeout", 60}});
  ASSERT_EQ(stop.status, 200) << stop.body;
  std::string out = stop.json()["stdout"];
  auto lines = split(trim(out), '\n');
  ASSERT_GE(lines.size(), 2u) << out;
  const std::string canary_pid = trim(lines.back());
  bool canary_found = false;
  int seen = 0;
  for (const auto& line : lines) {
    if (startsWith(line, "found ")) {
      std::string pid = line.substr(6);
      if (pid == canary_pid) {
        canary_found = true;
      } else {
        ADD_FAILURE() << "process " << pid << " inside the sandbox held the agent's token in its memory";
      }
    }
    if (startsWith(line, "seen ")) seen = atoi(line.c_str() + 5);
  }
  EXPECT_TRUE(canary_found) << "the watcher could not read a canary's memory, so it proves nothing:\n" << out;
  // The watcher was at work: each round starts several processes (the exec, the tar upload's sh and tar). A watcher
  // starved of CPU may miss short-lived ones, so a third of the rounds' worth proves it ran, not that it saw all.
  EXPECT_GE(seen, kRounds / 3) << out;
}

}  // namespace
}  // namespace dsec::testing
