// The guest agent in a real guest: QEMU (TCG) boots the guest kernel with the agent as PID 1 and a busybox layer;
// every request of AgentChannel is checked against what the guest really did.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "dsec/backends/vm/AgentChannel.h"
#include "dsec/common/Strings.h"
#include "dsec/testing/TestSupport.h"
#include "support/TestVm.h"

namespace dsec::testing {
namespace {

using backends::ExecControl;
using backends::ExecRequest;
using backends::ExecResult;
using backends::ExecSink;
using backends::vm::AgentChannel;
using Clock = std::chrono::steady_clock;

constexpr double kBootSeconds = 120;  // TCG on a loaded machine
constexpr int kPidsLimit = 48;

double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

class VmGuestTest : public ::testing::Test {
 protected:
  void SetUp() override { boot({}); }

  void boot(const TestVmOptions& options) {
    std::string why = vmTestSkipReason();
    if (!why.empty()) GTEST_SKIP() << why;
    auto vm = TestVm::start(options);
    ASSERT_OK(vm);
    vm_ = std::move(vm).value();
    auto channel = vm_->connectChannel(kBootSeconds);
    ASSERT_TRUE(channel.ok()) << channel.error().toString() << "\nconsole:\n" << vm_->consoleLog();
    channel_ = std::move(channel).value();
    backends::vm::GuestSetup setup;
    setup.hostname = "guest-test";
    setup.layer_disks = 1;
    setup.upper_bytes = 64 << 20;
    setup.pids = kPidsLimit;
    setup.env = {{"FROM_SETUP", "yes"}};
    Status done = channel_->setup(setup, 60);
    ASSERT_TRUE(done.ok()) << done.error().toString() << "\nconsole:\n" << vm_->consoleLog();
  }

  ExecResult sh(const std::string& script, double timeout = 60) {
    ExecRequest r;
    r.argv = {"sh", "-c", script};
    r.timeout_seconds = timeout;
    auto result = channel_->exec(r, nullptr);
    EXPECT_TRUE(result.ok()) << result.error().toString();
    return result.ok() ? *result : ExecResult{};
  }

  std::unique_ptr<TestVm> vm_;
  std::unique_ptr<AgentChannel> channel_;
};

TEST_F(VmGuestTest, ExecExitCodesOutputAndEnvironment) {
  ExecResult r = sh("echo out; echo err >&2; exit 3");
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.signal, 0);
  EXPECT_EQ(r.stdout_data, "out\n");
  EXPECT_EQ(r.stderr_data, "err\n");
  r = sh("kill -9 $$");
  EXPECT_EQ(r.exit_code, 128 + 9);
  EXPECT_EQ(r.signal, 9);
  // The sandbox root is the layer under a writable upper, with the setup's hostname and environment.
  ExecRequest req;
  req.argv = {"sh", "-c",
              "cat /layer-file; hostname; echo $FROM_SETUP $FROM_EXEC; pwd; echo new > /layer-file; cat /layer-file"};
  req.env = {{"FROM_EXEC", "here"}};
  req.cwd = "/tmp";
  req.timeout_seconds = 60;
  auto layered = channel_->exec(req, nullptr);
  ASSERT_OK(layered);
  EXPECT_EQ(layered->stdout_data, "from the layer\nguest-test\nyes here\n/tmp\nnew\n") << layered->stderr_data;
  req = ExecRequest{};
  req.argv = {"no-such-program"};
  auto missing = channel_->exec(req, nullptr);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code(), ErrorCode::kNotFound) << missing.error().toString();
}

TEST_F(VmGuestTest, StdinFromDataAndFromFd) {
  ExecRequest r;
  r.argv = {"cat"};
  r.stdin_data = "hello stdin";
  r.timeout_seconds = 60;
  auto small = channel_->exec(r, nullptr);
  ASSERT_OK(small);
  EXPECT_EQ(small->stdout_data, "hello stdin");
  r.argv = {"wc", "-c"};
  r.stdin_data = std::string(300 << 10, 'x');  // more than goes inline: sent as stdin frames
  auto big = channel_->exec(r, nullptr);
  ASSERT_OK(big);
  EXPECT_EQ(std::stoll(big->stdout_data), 300 << 10);

  int p[2];
  ASSERT_EQ(pipe(p), 0);
  std::thread writer([fd = p[1]] {
    std::string block(64 << 10, 'y');
    for (int i = 0; i < 32; ++i) (void)!::write(fd, block.data(), block.size());
    close(fd);
  });
  r.stdin_data.clear();
  r.stdin_fd = p[0];
  auto streamed = channel_->exec(r, nullptr);
  writer.join();
  // The caller keeps its fd.
  EXPECT_GE(fcntl(p[0], F_GETFD), 0);
  close(p[0]);
  ASSERT_OK(streamed);
  EXPECT_EQ(std::stoll(streamed->stdout_data), 32 * (64 << 10));
}

class CountingSink : public ExecSink {
 public:
  bool onStarted(const std::shared_ptr<ExecControl>& control) override {
    control_ = control;
    started = true;
    return true;
  }
  bool onStdout(const char* data, size_t size) override {
    out_bytes += size;
    if (keep) out.append(data, size);
    return stop_after == 0 || out_bytes < stop_after;
  }
  bool onStderr(const char*, size_t size) override {
    err_bytes += size;
    return true;
  }
  std::shared_ptr<ExecControl> control() {
    while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return control_;
  }
  std::atomic<bool> started{false};
  std::atomic<size_t> out_bytes{0}, err_bytes{0};
  size_t stop_after = 0;
  bool keep = false;
  std::string out;

 private:
  std::shared_ptr<ExecControl> control_;
};

TEST_F(VmGuestTest, StreamsLargeOutputThroughASinkAndCapsIt) {
  CountingSink sink;
  ExecRequest r;
  r.argv = {"sh", "-c", "dd if=/dev/zero bs=65536 count=96 2>/dev/null; echo done >&2"};
  r.timeout_seconds = 120;
  auto start = Clock::now();
  auto streamed = channel_->exec(r, &sink);
  ASSERT_OK(streamed);
  EXPECT_EQ(sink.out_bytes, 96u * 65536);
  EXPECT_EQ(sink.err_bytes, 5u);
  EXPECT_TRUE(streamed->stdout_data.empty());
  EXPECT_FALSE(streamed->truncated);
  std::cerr << "6 MiB streamed in " << secondsSince(start) << " s\n";

  r.argv = {"sh", "-c", "yes | head -c 1000000; echo tail"};
  r.output_cap = 1000;
  auto capped = channel_->exec(r, nullptr);
  ASSERT_OK(capped);
  EXPECT_EQ(capped->stdout_data.size(), 1000u);
  EXPECT_TRUE(capped->truncated);
  EXPECT_EQ(capped->exit_code, 0);

  // A sink that returns false stops the command.
  CountingSink stopper;
  stopper.stop_after = 1;
  r.argv = {"yes"};
  r.output_cap = 16 << 20;
  auto t0 = Clock::now();
  auto stopped = channel_->exec(r, &stopper);
  ASSERT_OK(stopped);
  EXPECT_EQ(stopped->signal, SIGKILL);
  EXPECT_LT(secondsSince(t0), 30);
}

TEST_F(VmGuestTest, TimeoutKillsTheProcessGroupAndSignalsArriveThroughControl) {
  ExecRequest r;
  r.argv = {"sh", "-c", "sleep 100 & sleep 100"};
  r.timeout_seconds = 1;
  auto t0 = Clock::now();
  auto timed = channel_->exec(r, nullptr);
  ASSERT_OK(timed);
  EXPECT_TRUE(timed->timed_out);
  EXPECT_EQ(timed->signal, SIGKILL);
  EXPECT_LT(secondsSince(t0), 15);

  CountingSink sink;
  r.argv = {"sh", "-c", "trap 'echo got TERM; exit 7' TERM; echo ready; while true; do sleep 0.1; done"};
  r.timeout_seconds = 60;
  sink.keep = true;
  std::thread signaller([&] {
    auto control = sink.control();
    while (sink.out_bytes == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_OK(control->signal(SIGTERM));
    EXPECT_FALSE(control->resize(10, 10).ok());  // no terminal
  });
  auto signalled = channel_->exec(r, &sink);
  signaller.join();
  ASSERT_OK(signalled);
  EXPECT_EQ(signalled->exit_code, 7);
  EXPECT_EQ(sink.out, "ready\ngot TERM\n");
  // Once the exec ended, its control answers kNotFound.
  auto after = sink.control()->signal(SIGTERM);
  ASSERT_FALSE(after.ok());
  EXPECT_EQ(after.error().code(), ErrorCode::kNotFound);
  // Nothing of the timed-out command survived (the group was killed, the agent reaped it).
  EXPECT_EQ(sh("ps -o pid,args | grep -c '[s]leep 100'").stdout_data, "0\n");
}

TEST_F(VmGuestTest, TerminalWithSizeResizeAndEof) {
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  CountingSink sink;
  sink.keep = true;
  ExecRequest r;
  r.argv = {"sh", "-c", "test -t 0 && echo isatty; stty size; read line; stty size; cat; echo after-eof"};
  r.tty = true;
  r.tty_rows = 40;
  r.tty_cols = 120;
  r.stdin_fd = p[0];
  r.timeout_seconds = 60;
  std::thread typist([&] {
    auto control = sink.control();
    auto deadline = Clock::now() + std::chrono::seconds(30);
    while (sink.out.find("40 120") == std::string::npos && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_OK(control->resize(50, 100));
    (void)!::write(p[1], "go\n", 3);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    close(p[1]);  // EOF types ^D: cat ends
  });
  auto done = channel_->exec(r, &sink);
  typist.join();
  close(p[0]);
  ASSERT_OK(done);
  EXPECT_EQ(done->exit_code, 0) << sink.out;
  EXPECT_NE(sink.out.find("isatty"), std::string::npos) << sink.out;
  EXPECT_NE(sink.out.find("40 120"), std::string::npos) << sink.out;
  EXPECT_NE(sink.out.find("50 100"), std::string::npos) << sink.out;
  EXPECT_NE(sink.out.find("after-eof"), std::string::npos) << sink.out;
  // Without a terminal, resize is refused.
  CountingSink plain;
  ExecRequest q;
  q.argv = {"true"};
  q.timeout_seconds = 30;
  std::thread check([&] {
    auto c = plain.control();
    EXPECT_FALSE(c->resize(10, 10).ok());
  });
  ASSERT_OK(channel_->exec(q, &plain));
  check.join();
}

std::string readAll(int fd) {
  std::string out;
  char buf[65536];
  lseek(fd, 0, SEEK_SET);
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

TEST_F(VmGuestTest, FilesWriteReadStatListRemove) {
  TempDir tmp;
  std::string content;
  for (int i = 0; i < 200000; ++i) content += std::to_string(i) + "\n";
  std::string src = tmp.path() + "/src";
  ASSERT_OK(writeFile(src, content));
  int in = open(src.c_str(), O_RDONLY);
  ASSERT_GE(in, 0);
  ASSERT_OK(channel_->writeFile("/work/deep/dir/numbers.txt", 0640, in));
  close(in);
  EXPECT_EQ(sh("wc -c < /work/deep/dir/numbers.txt").stdout_data, std::to_string(content.size()) + "\n");
  int out = open((tmp.path() + "/back").c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(out, 0);
  ASSERT_OK(channel_->readFile("/work/deep/dir/numbers.txt", out));
  EXPECT_TRUE(readAll(out) == content);
  close(out);

  auto st = channel_->stat("/work/deep/dir/numbers.txt");
  ASSERT_OK(st);
  EXPECT_EQ(st->type, "file");
  EXPECT_EQ(st->size, static_cast<int64_t>(content.size()));
  EXPECT_EQ(st->mode, 0640u);
  EXPECT_EQ(st->name, "numbers.txt");
  ASSERT_EQ(sh("ln -s /../../../etc /work/deep/esc && mkdir /work/deep/sub").exit_code, 0);
  auto list = channel_->listDir("/work/deep");
  ASSERT_OK(list);
  std::map<std::string, std::string> types;
  for (const auto& e : *list) types[e.name] = e.type;
  EXPECT_EQ(types, (std::map<std::string, std::string>{{"dir", "dir"}, {"esc", "symlink"}, {"sub", "dir"}}));
  // A symlink resolves inside the sandbox root: "/../../../etc" is the sandbox's /etc.
  out = open((tmp.path() + "/passwd").c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  ASSERT_OK(channel_->readFile("/work/deep/esc/passwd", out));
  EXPECT_EQ(readAll(out), "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n");
  close(out);

  ASSERT_ERROR(channel_->readFile("/work/nope", 1), ErrorCode::kNotFound);
  ASSERT_ERROR(channel_->readFile("/work/deep", 1), ErrorCode::kInvalidArgument);
  ASSERT_ERROR(channel_->remove("/work/deep", false), ErrorCode::kConflict);
  ASSERT_OK(channel_->remove("/work/deep/esc", false));
  EXPECT_EQ(sh("test -d /etc && echo kept").stdout_data, "kept\n");
  ASSERT_OK(channel_->remove("/work/deep", true));
  ASSERT_ERROR(channel_->stat("/work/deep"), ErrorCode::kNotFound);
  ASSERT_ERROR(channel_->remove("/", true), ErrorCode::kConflict);
}

TEST_F(VmGuestTest, PidsLimitHoldsAndOrphansAreReaped) {
  // Far more background processes than the limit: the shell stops (busybox sh exits) at the first fork refused.
  ExecResult r = sh("i=0; while [ $i -lt 150 ]; do sleep 300 & i=$((i+1)); done; echo all 150 started", 120);
  EXPECT_EQ(r.stdout_data, "");
  EXPECT_NE(r.exit_code, 0);
  auto usage = channel_->usage();
  ASSERT_OK(usage);
  // The sleeps hold the cgroup's slots: counted, it is the limit (the shell that started them is gone).
  EXPECT_LE(usage->pids, kPidsLimit);
  EXPECT_GE(usage->pids, kPidsLimit - 3);
  EXPECT_GT(usage->memory_used_bytes, 1 << 20);
  EXPECT_LT(usage->memory_used_bytes, int64_t{512} << 20);
  ASSERT_OK(channel_->reclaim());
  // Killed, the orphans are reaped by PID 1: nothing of the sandbox is left.
  // One slot is left (the shell's): killall runs in it.
  ExecRequest killall;
  killall.argv = {"killall", "-9", "sleep"};
  killall.timeout_seconds = 60;
  ASSERT_OK(channel_->exec(killall, nullptr));
  auto deadline = Clock::now() + std::chrono::seconds(30);
  int64_t pids = -1;
  while (Clock::now() < deadline) {
    auto u = channel_->usage();
    ASSERT_OK(u);
    pids = u->pids;
    if (pids == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(pids, 0);
  EXPECT_EQ(sh("ps -o stat | grep -c '^Z'").stdout_data, "0\n");
}

TEST_F(VmGuestTest, ConcurrentRequestsAndASecondConnectResetsWhatTheFirstLeft) {
  // More requests at once than ports: they queue for a free port.
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      ExecRequest r;
      r.argv = {"sh", "-c", "sleep 0.2; echo " + std::to_string(i)};
      r.timeout_seconds = 60;
      auto res = channel_->exec(r, nullptr);
      if (res.ok() && res->stdout_data == std::to_string(i) + "\n") ++ok;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok, 8);

  // A command left running by a peer that goes away (a restarted node agent)...
  CountingSink sink;
  std::thread first([&] {
    ExecRequest r;
    r.argv = {"sh", "-c", "echo started; sleep 300"};
    r.timeout_seconds = 600;
    auto res = channel_->exec(r, &sink);
    EXPECT_FALSE(res.ok());
    if (!res.ok()) {
      EXPECT_EQ(res.error().code(), ErrorCode::kUnavailable);
    }
  });
  while (sink.out_bytes == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  auto t0 = Clock::now();
  channel_->close();
  first.join();
  EXPECT_LT(secondsSince(t0), 5);
  channel_.reset();
  // ...is killed once a new peer says hello on those ports.
  auto again = vm_->connectChannel(60);
  ASSERT_OK(again);
  channel_ = std::move(again).value();
  auto deadline = Clock::now() + std::chrono::seconds(30);
  std::string left;
  while (Clock::now() < deadline) {
    left = sh("ps | grep -c '[s]leep 300'").stdout_data;
    if (left == "0\n") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(left, "0\n");
  ASSERT_ERROR(channel_->setup(backends::vm::GuestSetup{}, 30), ErrorCode::kAlreadyExists);
}

TEST_F(VmGuestTest, AGuestKilledMidRequestFailsTheCallPromptly) {
  CountingSink sink;
  std::thread killer([&] {
    while (sink.out_bytes == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    vm_->kill();
  });
  ExecRequest r;
  r.argv = {"sh", "-c", "echo started; sleep 300"};
  r.timeout_seconds = 600;
  auto t0 = Clock::now();
  auto res = channel_->exec(r, &sink);
  killer.join();
  ASSERT_FALSE(res.ok());
  EXPECT_EQ(res.error().code(), ErrorCode::kUnavailable) << res.error().toString();
  EXPECT_LT(secondsSince(t0), 10);
  ASSERT_ERROR(channel_->usage(), ErrorCode::kUnavailable);
}

class VmGuestQ35Test : public VmGuestTest {
 protected:
  void SetUp() override { boot(TestVmOptions{.q35 = true, .ports = backends::vm::kAgentPorts}); }
};

// With every port the node uses: each answers hello (q35 loses a port's open event past 15 ports).
TEST_F(VmGuestQ35Test, BootsWithPciDevices) {
  ExecResult r = sh("cat /layer-file; hostname");
  EXPECT_EQ(r.stdout_data, "from the layer\nguest-test\n");
}

}  // namespace
}  // namespace dsec::testing
