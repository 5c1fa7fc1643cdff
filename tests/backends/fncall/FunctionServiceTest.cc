// The service: calls and their results, languages, files, pools (growth, capacity, shrink), worker
// replacement, failures that leave nothing behind, memory limits that cannot be set, and the per-call cost
// (printed, not asserted).
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <thread>

#include "FncallTestSupport.h"
#include "dsec/backends/ForwardingSandbox.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {
namespace {

using backends::fncall::CallRequest;

TEST_F(FncallTest, PythonCallResults) {
  startService();
  auto r = py("print(sum(range(1000)))");
  EXPECT_EQ(r.stdout_data, "499500\n");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.stderr_data, "");
  EXPECT_FALSE(r.timed_out || r.truncated || r.oom_killed);
  EXPECT_GT(r.duration_seconds, 0);

  auto req = python("import sys\nprint(sys.stdin.read().upper(), end='')\nsys.exit(3)");
  req.stdin_data = "hello stdin\n";
  r = run(req);
  EXPECT_EQ(r.stdout_data, "HELLO STDIN\n");
  EXPECT_EQ(r.exit_code, 3);

  r = py("print('before')\n1/0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.stdout_data, "before\n");
  EXPECT_NE(r.stderr_data.find("ZeroDivisionError"), std::string::npos) << r.stderr_data;
  EXPECT_NE(r.stderr_data.find("File \"<string>\", line 2"), std::string::npos) << r.stderr_data;
  EXPECT_EQ(r.stderr_data.find("run_python"), std::string::npos) << "zygote frames leak: " << r.stderr_data;

  r = py("import sys; sys.exit('fatal message')");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.stderr_data, "fatal message\n");
  r = py("import os; os.kill(os.getpid(), 15)");
  EXPECT_EQ(r.signal, 15);
  EXPECT_EQ(r.exit_code, 128 + 15);
  EXPECT_FALSE(r.oom_killed);
  // Who the call runs as, where, and with what.
  r =
      py("import os, sys\nprint(os.getuid(), os.getgid(), os.getgroups(), os.getcwd())\n"
         "print(__name__, sys.argv, os.environ.get('HOME') == os.getcwd())");
  auto lines = split(r.stdout_data, '\n');
  ASSERT_GE(lines.size(), 2u) << r.stdout_data << r.stderr_data;
  EXPECT_TRUE(startsWith(lines[0], "65534 65534 [] /work/call")) << lines[0];
  EXPECT_EQ(lines[1], "__main__ ['-c'] True");
}

// The zygote keeps its output pipes across calls and leaves threading out of its preloads: output larger
// than a pipe, output written by a thread or a leftover process, and a big stdin all arrive complete, and
// none of it reaches the next call.
TEST_F(FncallTest, OutputThreadsAndEnvironmentAcrossCalls) {
  options_.max_workers = 1;  // every call on the same worker
  startService();
  auto req = python(
      "import sys, threading, time\n"
      "data = sys.stdin.buffer.read()\n"
      "def late():\n"
      "    time.sleep(0.2)\n"
      "    print('thread done', flush=True)\n"
      "threading.Thread(target=late).start()\n"
      "sys.stdout.write('o' * 300000)\n"
      "sys.stderr.write('e' * 200000)\n"
      "print(len(data), data == bytes(range(256)) * 8192)\n");
  for (int i = 0; i < 8192; ++i) {
    for (int b = 0; b < 256; ++b) req.stdin_data.push_back(static_cast<char>(b));
  }
  auto r = run(req);
  EXPECT_EQ(r.stdout_data, std::string(300000, 'o') + "2097152 True\nthread done\n") << r.stderr_data.substr(0, 500);
  EXPECT_EQ(r.stderr_data, std::string(200000, 'e'));
  EXPECT_FALSE(r.truncated);
  // A process left behind keeps writing: it is killed, and nothing of it shows in the next call.
  r =
      run(bash("(echo leftover >&2; : > /tmp/started; while :; do echo leftover >&2; done) & "
               "while [ ! -e /tmp/started ]; do sleep 0.01; done; echo main"));
  EXPECT_EQ(r.stdout_data, "main\n");
  EXPECT_NE(r.stderr_data.find("leftover"), std::string::npos);
  auto next = py("import os\nprint(sorted(os.environ.items()))");
  EXPECT_EQ(next.stdout_data,
            "[('HOME', '/work/call'), ('LANG', 'C.UTF-8'), ('PATH', '/usr/local/bin:/usr/bin:/bin'), "
            "('PWD', '/work/call'), ('TMPDIR', '/tmp')]\n")
      << next.stderr_data;
  EXPECT_EQ(next.stderr_data, "");
  auto sh = bash("echo $HOME $PWD; pwd");
  EXPECT_EQ(run(sh).stdout_data, "/work/call /work/call\n/work/call\n");
}

// A Python call with fresh_interpreter runs in an interpreter started for it (execve in the call's child)
// and behaves as a forked call does: stdin, files, imports from its directory, exit codes, tracebacks
// without our frames, who it runs as; its code may be longer than one argument can be (128 KiB).
TEST_F(FncallTest, FreshInterpreterCallsBehaveAsForkedOnes) {
  options_.max_workers = 1;
  startService();
  auto fresh = [this](const std::string& code) {
    auto req = python(code);
    req.fresh_interpreter = true;
    return req;
  };
  auto req = fresh(
      "import mod, os, sys\nprint(sys.stdin.read().upper(), end='')\nprint(mod.X, open('data/in.txt').read())\n"
      "print(os.getuid(), os.getgid(), os.getgroups(), os.getcwd(), __name__, sys.argv)\n"
      "print(os.getpid() != 1, sorted(m for m in ('json', 'decimal', 'fractions') if m in sys.modules))\nsys.exit(3)");
  req.stdin_data = "hello stdin\n";
  req.files = {{"mod.py", "X = 5\n"}, {"data/in.txt", "in"}};
  auto r = run(req);
  auto lines = split(r.stdout_data, '\n');
  ASSERT_GE(lines.size(), 4u) << r.stdout_data << r.stderr_data;
  EXPECT_EQ(lines[0], "HELLO STDIN");
  EXPECT_EQ(lines[1], "5 in");
  EXPECT_EQ(lines[2], "65534 65534 [] /work/call __main__ ['-c']");
  EXPECT_EQ(lines[3], "True []") << "a fresh interpreter has none of the zygote's preloaded modules";
  EXPECT_EQ(r.exit_code, 3) << r.stderr_data;

  r = run(fresh("print('before')\n1/0"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.stdout_data, "before\n");
  EXPECT_NE(r.stderr_data.find("ZeroDivisionError"), std::string::npos) << r.stderr_data;
  EXPECT_NE(r.stderr_data.find("File \"<string>\", line 2"), std::string::npos) << r.stderr_data;
  EXPECT_EQ(r.stderr_data.find("_run"), std::string::npos) << "bootstrap frames leak: " << r.stderr_data;
  r = run(fresh("def f(:\n"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.stderr_data.find("SyntaxError"), std::string::npos) << r.stderr_data;
  r = run(fresh("import sys; sys.exit('fatal message')"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.stderr_data, "fatal message\n");

  std::string big = "x = 0\n";
  while (big.size() < (300u << 10)) big += "x += 1\n";
  big += "print(x)\n";
  r = run(fresh(big));
  EXPECT_EQ(r.exit_code, 0) << r.stderr_data.substr(0, 500);
  EXPECT_EQ(r.stdout_data, std::to_string(std::count(big.begin(), big.end(), '\n') - 2) + "\n");

  // Each fresh call draws its own hash seed; forked calls share the worker's.
  auto seed = [&](bool own) {
    auto q = python("print(hash('x'))");
    q.fresh_interpreter = own;
    return run(q).stdout_data;
  };
  EXPECT_EQ(seed(false), seed(false));
  const std::string a = seed(true), b = seed(true);
  EXPECT_NE(a, b);
  EXPECT_NE(a, seed(false));
  // Bash always starts its own shell: the flag is accepted and changes nothing.
  auto sh = bash("echo $((6*7))");
  sh.fresh_interpreter = true;
  EXPECT_EQ(run(sh).stdout_data, "42\n");
}

TEST_F(FncallTest, FilesArePlacedInTheWorkingDirectory) {
  startService();
  auto req = python(
      "import mod, os\nprint(open('data/in.txt').read(), mod.X)\nprint(sorted(os.listdir('.')))\n"
      "print(open('bin.dat','rb').read() == bytes(range(256)))");
  req.files = {{"data/in.txt", "hello"}, {"mod.py", "X = 5\n"}, {"bin.dat", std::string()}};
  for (int i = 0; i < 256; ++i) req.files["bin.dat"].push_back(static_cast<char>(i));
  auto r = run(req);
  EXPECT_EQ(r.stdout_data, "hello 5\n['bin.dat', 'data', 'mod.py']\nTrue\n") << r.stderr_data;
}

TEST_F(FncallTest, BashCalls) {
  startService();
  auto req = bash("echo $((6*7)); read x; echo \"got $x\"; echo err >&2; pwd; id -u; exit 4");
  req.stdin_data = "line\n";
  req.files = {{"f.txt", "content"}};
  auto r = run(req);
  auto lines = split(r.stdout_data, '\n');
  ASSERT_GE(lines.size(), 4u) << r.stdout_data << r.stderr_data;
  EXPECT_EQ(lines[0], "42");
  EXPECT_EQ(lines[1], "got line");
  EXPECT_TRUE(startsWith(lines[2], "/work/call")) << lines[2];
  EXPECT_EQ(lines[3], "65534");
  EXPECT_EQ(r.stderr_data, "err\n");
  EXPECT_EQ(r.exit_code, 4);
  req = bash("cat f.txt; [ -n \"$BASH_VERSION\" ] && echo bash");
  req.files = {{"f.txt", "content\n"}};
  EXPECT_EQ(run(req).stdout_data, "content\nbash\n");
  // A broken pipe ends a pipeline as in a normal shell (SIGPIPE is not left ignored).
  EXPECT_EQ(run(bash("yes | head -n 2")).stdout_data, "y\ny\n");
}

TEST_F(FncallTest, InvalidRequestsNameTheField) {
  startService();
  auto req = python("print(1)");
  req.timeout_seconds = 0;
  auto r = service().call(req);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(r.error().message().find("timeout"), std::string::npos);
  req = python("print(1)");
  req.files = {{"../escape", "x"}};
  r = service().call(req);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("files"), std::string::npos);
  req = python("print(1)");
  req.memory_bytes = 1 << 20;
  ASSERT_ERROR(service().call(req), ErrorCode::kInvalidArgument);
  // Nothing was started for them.
  EXPECT_EQ(service().stats().workers_created, 0u);
}

TEST_F(FncallTest, ManyConcurrentCalls) {
  options_.max_workers = 3;
  startService();
  constexpr int kThreads = 8, kCalls = 15;
  std::atomic<int> good{0};
  std::vector<std::string> failures(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCalls; ++i) {
        auto req = python("import sys; print(int(sys.stdin.read()) * 2)");
        req.stdin_data = std::to_string(t * 1000 + i);
        auto r = service().call(req);
        std::string want = std::to_string((t * 1000 + i) * 2) + "\n";
        if (r.ok() && r->stdout_data == want && r->exit_code == 0) {
          ++good;
        } else {
          failures[t] = r.ok() ? r->stdout_data + r->stderr_data : r.error().toString();
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(good.load(), kThreads * kCalls);
  for (const auto& f : failures) EXPECT_EQ(f, "");
  auto stats = service().stats();
  EXPECT_LE(stats.workers_created, 3u);
  EXPECT_GE(stats.workers_created, 1u);
  EXPECT_EQ(stats.calls, static_cast<uint64_t>(kThreads * kCalls));
}

TEST_F(FncallTest, CapacityErrorWhenAllWorkersAreBusy) {
  options_.max_workers = 1;
  options_.queue_wait_seconds = 0.5;
  startService();
  EXPECT_EQ(py("print('warm')").stdout_data, "warm\n");
  std::thread busy([&] { EXPECT_EQ(run(python("import time; time.sleep(4); print('done')")).stdout_data, "done\n"); });
  for (int i = 0; i < 200 && service().stats().busy == 0; ++i) usleep(20000);
  EXPECT_EQ(service().stats().busy, 1);
  auto r = service().call(python("print(1)"));
  EXPECT_FALSE(r.ok());
  if (!r.ok()) {
    EXPECT_EQ(r.error().code(), ErrorCode::kResourceExhausted) << r.error().toString();
    EXPECT_NE(r.error().message().find("1 of 1 workers"), std::string::npos) << r.error().message();
  }
  busy.join();
  EXPECT_EQ(service().stats().rejected, 1u);
  EXPECT_EQ(py("print('after')").stdout_data, "after\n");
}

TEST_F(FncallTest, PoolsShrinkWhenIdleAndKeepMinIdle) {
  options_.max_workers = 3;
  options_.min_idle_workers = 1;
  options_.idle_shrink_seconds = 0.5;
  startService();
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&] { EXPECT_EQ(run(python("import time; time.sleep(2); print(1)")).stdout_data, "1\n"); });
  }
  for (auto& th : threads) th.join();
  EXPECT_GE(service().stats().workers_created, 2u);
  for (int i = 0; i < 100 && (service().stats().workers > 1 || workerCgroups().size() > 1); ++i) {
    usleep(100000);
  }
  auto stats = service().stats();
  EXPECT_EQ(stats.workers, 1);
  EXPECT_EQ(stats.idle, 1);
  EXPECT_EQ(workerCgroups().size(), 1u);
  EXPECT_EQ(py("print(2)").stdout_data, "2\n");
}

TEST_F(FncallTest, PoolsPerLanguageShareTheBudget) {
  options_.max_workers = 1;
  startService();
  EXPECT_EQ(py("print('p')").stdout_data, "p\n");
  // The python pool's idle worker is evicted to make room for a bash worker, and back.
  EXPECT_EQ(run(bash("echo b")).stdout_data, "b\n");
  EXPECT_EQ(py("print('p2')").stdout_data, "p2\n");
  auto stats = service().stats();
  EXPECT_EQ(stats.workers, 1);
  EXPECT_EQ(stats.pools.size(), 2u);
  EXPECT_EQ(workerCgroups().size(), 1u);
}

TEST_F(FncallTest, DeadWorkerIsReplaced) {
  options_.max_workers = 1;
  startService();
  EXPECT_EQ(py("print(1)").stdout_data, "1\n");
  auto zygotes = zygotePids();
  ASSERT_EQ(zygotes.size(), 1u);
  ASSERT_EQ(kill(zygotes[0], SIGKILL), 0);
  // Dead (a zombie until the service reaps it) before the next call, which must then get another worker.
  for (int i = 0; i < 500; ++i) {
    auto stat = readFile("/proc/" + std::to_string(zygotes[0]) + "/stat");
    if (!stat.ok() || stat->find(") Z") != std::string::npos) break;
    usleep(10000);
  }
  EXPECT_EQ(py("print(2)").stdout_data, "2\n");
  auto now = zygotePids();
  ASSERT_EQ(now.size(), 1u);
  EXPECT_NE(now[0], zygotes[0]);
  EXPECT_GE(service().stats().workers_replaced, 1u);
  EXPECT_EQ(workerCgroups().size(), 1u) << "the dead worker's sandbox is gone";
}

TEST_F(FncallTest, WorkerDyingUnderACallGivesAClearErrorAndIsReplaced) {
  options_.max_workers = 1;
  startService();
  EXPECT_EQ(py("print(1)").stdout_data, "1\n");
  std::thread killer([&] {
    usleep(500000);
    for (pid_t z : zygotePids()) kill(z, SIGKILL);
  });
  auto r = service().call(python("import time; time.sleep(10)"));
  killer.join();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kUnavailable);
  EXPECT_NE(r.error().message().find("died"), std::string::npos) << r.error().toString();
  EXPECT_EQ(py("print(3)").stdout_data, "3\n");
}

TEST_F(FncallTest, WorkerStartFailuresLeaveNothingAndReportTheCause) {
  options_.python = "no-such-python";
  startService();
  auto r = service().call(python("print(1)"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kNotFound) << r.error().toString();
  EXPECT_NE(r.error().message().find("no-such-python"), std::string::npos) << r.error().toString();
  service_->shutdown();
  service_.reset();
  expectNothingLeft();

  options_.python = "python3";
  startService();
  auto req = python("print(1)");
  req.image = "no-such:image";
  r = service().call(req);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kNotFound) << r.error().toString();
}

// A worker sandbox whose memory limit can be set to `allowed` only (0: never): a backend, or a wrapper of
// one, that cannot enforce the limits of calls.
class LimitRefusingSandbox : public backends::ForwardingSandbox {
 public:
  LimitRefusingSandbox(std::unique_ptr<backends::Sandbox> inner, int64_t allowed)
      : ForwardingSandbox(std::move(inner)), allowed_(allowed) {}
  Status setMemoryLimit(int64_t bytes) override {
    if (bytes == allowed_) return ForwardingSandbox::setMemoryLimit(bytes);
    return Error(ErrorCode::kUnsupported, "this sandbox cannot change its memory limit");
  }

 private:
  int64_t allowed_;
};

backends::fncall::WorkerSandboxFactory limitRefusingFactory(backends::Backend* backend, PythonTestImage* image,
                                                            int64_t allowed) {
  auto inner = makeTestWorkerFactory(backend, image);
  return [inner, allowed](const std::string& name,
                          const backends::SandboxSpec& spec) -> Result<std::unique_ptr<backends::Sandbox>> {
    DSEC_ASSIGN_OR_RETURN(auto sandbox, inner(name, spec));
    return std::unique_ptr<backends::Sandbox>(std::make_unique<LimitRefusingSandbox>(std::move(sandbox), allowed));
  };
}

// A limit asked for is enforced or the call fails: a sandbox that cannot set it never runs the call with
// some other limit (this once only logged "per-call memory limits unavailable" and ran the call).
TEST_F(FncallTest, MemoryLimitThatCannotBeSetFailsTheCall) {
  // Refused from the start: no worker starts, and the call says why.
  auto s = backends::fncall::FunctionService::start(options_, limitRefusingFactory(backend_.get(), image(), 0));
  ASSERT_OK(s);
  service_ = std::move(*s);
  auto r = service().call(python("print('ran')"));
  ASSERT_FALSE(r.ok()) << "ran without its memory limit: " << r->stdout_data;
  EXPECT_EQ(r.error().code(), ErrorCode::kUnsupported) << r.error().toString();
  EXPECT_NE(r.error().message().find("memory limit"), std::string::npos) << r.error().toString();
  service_->shutdown();
  service_.reset();
  expectNothingLeft();

  // Refused for a call's limit only (the worker started): that call fails, naming its limit.
  s = backends::fncall::FunctionService::start(options_, limitRefusingFactory(backend_.get(), image(), 512LL << 20));
  ASSERT_OK(s);
  service_ = std::move(*s);
  auto req = python("print('ran')");
  req.memory_bytes = 64LL << 20;
  r = service().call(req);
  ASSERT_FALSE(r.ok()) << "ran without its memory limit: " << r->stdout_data;
  EXPECT_EQ(r.error().code(), ErrorCode::kUnsupported) << r.error().toString();
  EXPECT_NE(r.error().message().find(std::to_string(64LL << 20)), std::string::npos) << r.error().toString();
}

TEST_F(FncallTest, ShutdownEndsCallsInFlightAndLeavesNothing) {
  options_.max_workers = 2;
  options_.prewarm_default = true;
  startService();
  std::thread caller([&] {
    auto r = service().call(python("import time; time.sleep(60)"));
    EXPECT_FALSE(r.ok());
  });
  for (int i = 0; i < 600 && service().stats().busy == 0; ++i) usleep(50000);
  const double start = monotonicSeconds();
  service_->shutdown();
  caller.join();
  EXPECT_LT(monotonicSeconds() - start, 30);
  ASSERT_ERROR(service().call(python("print(1)")), ErrorCode::kUnavailable);
  service_.reset();
  expectNothingLeft();
}

double processCpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

// Not a timed assertion: prints what one call costs inside the service (no HTTP), for the report.
TEST_F(FncallTest, PerCallCostIsPrinted) {
  options_.max_workers = 2;
  startService();
  const auto req = python("print(sum(range(1000)))");
  for (int i = 0; i < 20; ++i) ASSERT_EQ(run(req).stdout_data, "499500\n");
  std::vector<double> ms;
  const double cpu0 = workerCpuSeconds();
  const double self0 = processCpuSeconds();
  for (int i = 0; i < 300; ++i) {
    double t = monotonicSeconds();
    auto r = run(req);
    ms.push_back((monotonicSeconds() - t) * 1000);
    ASSERT_EQ(r.stdout_data, "499500\n");
  }
  std::sort(ms.begin(), ms.end());
  std::printf("fncall CPU per call: workers %.3f ms, this process (service + test) %.3f ms\n",
              (workerCpuSeconds() - cpu0) * 1000 / 300, (processCpuSeconds() - self0) * 1000 / 300);
  std::printf("fncall sequential: p50 %.2f ms, p90 %.2f ms, p99 %.2f ms per call\n", ms[ms.size() / 2],
              ms[ms.size() * 9 / 10], ms[ms.size() * 99 / 100]);
  constexpr int kEach = 200;
  const double t0 = monotonicSeconds();
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kEach; ++i) EXPECT_EQ(run(req).stdout_data, "499500\n");
    });
  }
  for (auto& th : threads) th.join();
  std::printf("fncall concurrency 2: %.0f calls/s\n", 2 * kEach / (monotonicSeconds() - t0));
}

}  // namespace
}  // namespace dsec::testing
