// Exec into container sandboxes: argv and shell, env, cwd, stdin, exit codes, timeouts, output caps,
// streaming, and processes that outlive the exec that started them.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <thread>

#include "ContainerTestSupport.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {
namespace {

using backends::ExecRequest;

TEST_F(ContainerTest, CreateExecDestroy) {
  auto& sb = create();
  auto r = sh(sb, "echo hello; echo oops >&2");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.stdout_data, "hello\n");
  EXPECT_EQ(r.stderr_data, "oops\n");
  EXPECT_FALSE(r.timed_out);
  EXPECT_GT(r.duration_seconds, 0);
  EXPECT_EQ(sb.state(), backends::SandboxState::kRunning);
  EXPECT_EQ(sb.backendName(), "container");
  ASSERT_OK(sb.destroy());
  EXPECT_EQ(sb.state(), backends::SandboxState::kStopped);
  ASSERT_OK(sb.destroy());  // idempotent
  ExecRequest req;
  req.argv = {"true"};
  ASSERT_ERROR(sb.exec(req), ErrorCode::kNotFound);
}

TEST_F(ContainerTest, ArgvEnvCwdStdinAndExitCodes) {
  auto spec = makeSpec();
  spec.env = {{"FROM_SPEC", "s"}, {"OVERRIDE", "spec"}};
  auto& sb = create(spec);

  ExecRequest argv;
  argv.argv = {"echo", "a  b", "$HOME"};  // no shell: nothing is split or expanded
  auto r = sb.exec(argv);
  ASSERT_OK(r);
  EXPECT_EQ(r->stdout_data, "a  b $HOME\n");

  ExecRequest env;
  env.argv = {"/bin/sh", "-c", "echo $FROM_SPEC $OVERRIDE $EXTRA $HOME $PATH"};
  env.env = {{"OVERRIDE", "req"}, {"EXTRA", "x"}};
  r = sb.exec(env);
  ASSERT_OK(r);
  EXPECT_EQ(r->stdout_data, "s req x /root /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n");

  ExecRequest cwd;
  cwd.argv = {"pwd"};
  cwd.cwd = "/tmp";
  r = sb.exec(cwd);
  ASSERT_OK(r);
  EXPECT_EQ(r->stdout_data, "/tmp\n");
  cwd.cwd = "/does/not/exist";
  ASSERT_ERROR(sb.exec(cwd), ErrorCode::kInvalidArgument);

  ExecRequest in;
  in.argv = {"cat"};
  in.stdin_data = std::string(300000, 'z') + "end";  // bigger than a pipe buffer
  r = sb.exec(in);
  ASSERT_OK(r);
  EXPECT_EQ(r->stdout_data, in.stdin_data);

  EXPECT_EQ(sh(sb, "exit 3").exit_code, 3);
  auto killed = sh(sb, "kill -TERM $$; sleep 5");
  EXPECT_EQ(killed.signal, 15);
  EXPECT_EQ(killed.exit_code, 128 + 15);

  ExecRequest missing;
  missing.argv = {"no-such-command"};
  r = sb.exec(missing);
  ASSERT_OK(r);
  EXPECT_EQ(r->exit_code, 127);
  EXPECT_NE(r->stderr_data.find("no-such-command"), std::string::npos);

  ASSERT_ERROR(sb.exec(ExecRequest{}), ErrorCode::kInvalidArgument);
  ExecRequest relative;
  relative.argv = {"true"};
  relative.cwd = "tmp";
  ASSERT_ERROR(sb.exec(relative), ErrorCode::kInvalidArgument);
}

// Writes `total` bytes (or what `source` produces, when given) into the pipe, then closes its write end.
std::thread feedPipe(int write_fd, size_t total, FILE* source = nullptr) {
  return std::thread([write_fd, total, source] {
    std::string chunk(1 << 16, 'x');
    size_t sent = 0;
    for (;;) {
      size_t n =
          source != nullptr ? fread(chunk.data(), 1, chunk.size(), source) : std::min(chunk.size(), total - sent);
      if (n == 0) break;
      size_t off = 0;
      while (off < n) {
        ssize_t w = write(write_fd, chunk.data() + off, n - off);
        if (w <= 0) break;
        off += static_cast<size_t>(w);
      }
      if (off < n) break;  // the reader went away
      sent += n;
    }
    close(write_fd);
  });
}

TEST_F(ContainerTest, StdinFdStreamsFromTheCallersPipe) {
  auto& sb = create();
  ASSERT_TRUE(sb.supportsStdinFd());
  signal(SIGPIPE, SIG_IGN);             // a writer whose reader quit gets EPIPE instead of killing the test
  constexpr size_t kBytes = 30u << 20;  // far more than any pipe buffer: only streaming can pass it
  int fds[2];
  ASSERT_EQ(pipe2(fds, O_CLOEXEC), 0);
  std::thread writer = feedPipe(fds[1], kBytes);
  ExecRequest req;
  req.argv = {"wc", "-c"};
  req.stdin_fd = fds[0];
  req.stdin_data = "ignored when stdin_fd is set";
  auto r = sb.exec(req);
  if (!r.ok() || r->exit_code != 0) close(fds[0]);  // unblock the writer before failing
  writer.join();
  ASSERT_OK(r);
  EXPECT_EQ(r->exit_code, 0) << r->stderr_data;
  EXPECT_EQ(trim(r->stdout_data), std::to_string(kBytes));
  // The caller keeps its fd: still open, and at EOF now.
  EXPECT_GE(fcntl(fds[0], F_GETFD), 0);
  char c;
  EXPECT_EQ(read(fds[0], &c, 1), 0);
  close(fds[0]);

  // A tar stream from the host unpacked inside, as the API server streams uploads.
  TempDir src;
  {
    std::string big(12u << 20, 'y');
    ASSERT_OK(writeFileAtomic(src.path() + "/big.bin", big, 0644));
    ASSERT_OK(makeDirs(src.path() + "/sub", 0755));
    ASSERT_OK(writeFileAtomic(src.path() + "/sub/small.txt", "hello\n", 0644));
  }
  FILE* tar = popen(("tar -C " + src.path() + " -cf - .").c_str(), "r");
  ASSERT_NE(tar, nullptr);
  ASSERT_EQ(pipe2(fds, O_CLOEXEC), 0);
  writer = feedPipe(fds[1], 0, tar);
  ASSERT_EQ(sh(sb, "mkdir -p /tmp/up").exit_code, 0);
  ExecRequest untar;
  untar.argv = {"busybox", "tar", "-x", "-f", "-", "-C", "/tmp/up"};
  untar.stdin_fd = fds[0];
  r = sb.exec(untar);
  close(fds[0]);  // a command that quit early must not leave the writer blocked
  writer.join();
  EXPECT_EQ(pclose(tar), 0);
  ASSERT_OK(r);
  EXPECT_EQ(r->exit_code, 0) << r->stderr_data;
  auto st = sb.stat("/tmp/up/big.bin");
  ASSERT_OK(st);
  EXPECT_EQ(st->size, int64_t{12} << 20);
  EXPECT_EQ(sh(sb, "cat /tmp/up/sub/small.txt").stdout_data, "hello\n");

  ExecRequest closed;
  closed.argv = {"true"};
  closed.stdin_fd = 1000;  // not open
  ASSERT_ERROR(sb.exec(closed), ErrorCode::kInvalidArgument);
}

TEST_F(ContainerTest, TimeoutKillsTheProcessGroup) {
  auto& sb = create();
  double t0 = monotonicSeconds();
  auto r = sh(sb, "sleep 100 & sleep 100", 0.5);
  double took = monotonicSeconds() - t0;
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.exit_code, 137);
  EXPECT_LT(took, 5.0);
  // The background sleep was in the same process group: gone too (once the kernel has delivered the SIGKILL and
  // init reaped it, which a loaded machine may not have done by the time exec returns).
  auto ps = sh(sb,
               "for i in $(seq 100); do [ $(ps -o comm | grep -c sleep) = 0 ] && break; sleep 0.05; done; "
               "ps -o comm | grep -c sleep");
  EXPECT_EQ(trim(ps.stdout_data), "0") << ps.stdout_data;
}

TEST_F(ContainerTest, OutputCapStopsYes) {
  auto& sb = create();
  ExecRequest req;
  req.argv = {"yes"};
  req.output_cap = 1 << 20;
  req.timeout_seconds = 1.5;
  double t0 = monotonicSeconds();
  auto r = sb.exec(req);
  ASSERT_OK(r);
  EXPECT_LT(monotonicSeconds() - t0, 10.0);
  EXPECT_TRUE(r->truncated);
  EXPECT_TRUE(r->timed_out);
  EXPECT_EQ(r->stdout_data.size(), size_t{1} << 20);
  // Output past the cap is drained, not fatal: a chatty command still finishes with its own exit code.
  req.argv = {"/bin/sh", "-c", "yes | head -c 30000000; echo done >&2; exit 4"};
  req.timeout_seconds = 30;
  r = sb.exec(req);
  ASSERT_OK(r);
  EXPECT_TRUE(r->truncated);
  EXPECT_FALSE(r->timed_out);
  EXPECT_EQ(r->exit_code, 4);
  EXPECT_EQ(r->stdout_data.size(), size_t{1} << 20);
  EXPECT_EQ(r->stderr_data, "done\n");
  EXPECT_EQ(sh(sb, "echo alive").stdout_data, "alive\n");
}

TEST_F(ContainerTest, BackgroundProcessSurvivesBetweenExecs) {
  auto& sb = create();
  double t0 = monotonicSeconds();
  auto r = sh(sb, "sleep 1000 & echo started");
  EXPECT_LT(monotonicSeconds() - t0, 2.0) << "exec waited for the background process";
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.stdout_data, "started\n");
  auto ps = sh(sb, "ps -o args | grep -v grep | grep -c 'sleep 1000'");
  EXPECT_EQ(trim(ps.stdout_data), "1");
}

class CollectSink : public backends::ExecSink {
 public:
  bool onStdout(const char* d, size_t n) override {
    out.append(d, n);
    ++chunks;
    return true;
  }
  bool onStderr(const char* d, size_t n) override {
    err.append(d, n);
    return true;
  }
  std::string out, err;
  int chunks = 0;
};

TEST_F(ContainerTest, StreamingExec) {
  auto& sb = create();
  CollectSink sink;
  ExecRequest req;
  req.argv = {"/bin/sh", "-c", "for i in 1 2 3; do echo $i; usleep 50000; done; echo e >&2; exit 2"};
  auto r = sb.execStream(req, sink);
  ASSERT_OK(r);
  EXPECT_EQ(r->exit_code, 2);
  EXPECT_TRUE(r->stdout_data.empty());
  EXPECT_EQ(sink.out, "1\n2\n3\n");
  EXPECT_EQ(sink.err, "e\n");
  EXPECT_GE(sink.chunks, 2);  // delivered as it came, not at the end
}

// Tests that count the spawner: no inits are started in the background, because an init's first moments are a
// process of ours with the spawner's name (the spawner clones it for us), which would be counted too.
class ContainerSpawnerTest : public ContainerTest {
 protected:
  ContainerSpawnerTest() { init_pool_size_ = 0; }
};

// The pids of this process's children that are command spawners.
std::vector<std::string> spawnerPids() {
  std::vector<std::string> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    auto children = readFile(entry.path().string() + "/children");
    if (!children.ok()) continue;
    for (const auto& pid : split(trim(*children), ' ')) {
      auto comm = readFile("/proc/" + pid + "/comm");
      if (!pid.empty() && comm.ok() && trim(*comm) == "dsec-sandbox-sp") out.push_back(pid);
    }
  }
  return out;
}

TEST_F(ContainerSpawnerTest, SpawnerOutlivesTheThreadThatStartedIt) {
  auto& sb = create();
  // Request threads come and go; the spawner one of them started must stay for the others.
  std::thread([&] { EXPECT_EQ(sh(sb, "echo first").stdout_data, "first\n"); }).join();
  auto before = spawnerPids();
  ASSERT_EQ(before.size(), 1u);
  for (int i = 0; i < 5; ++i) {
    std::thread([&] { EXPECT_EQ(sh(sb, "echo again").stdout_data, "again\n"); }).join();
  }
  EXPECT_EQ(spawnerPids(), before) << "the spawner was replaced";
}

// Where a process is: its namespaces (those the spawner enters for a command) and its root.
std::string placeOf(const std::string& pid) {
  std::string out;
  for (const char* ns : {"mnt", "net", "uts", "ipc", "cgroup", "pid_for_children"}) {
    char link[256] = {};
    ssize_t n = readlink(("/proc/" + pid + "/ns/" + ns).c_str(), link, sizeof link - 1);
    out += std::string(ns) + "=" + (n > 0 ? std::string(link, static_cast<size_t>(n)) : "?") + " ";
  }
  struct stat root {};
  if (::stat(("/proc/" + pid + "/root/").c_str(), &root) == 0) {
    out += "root=" + std::to_string(root.st_dev) + ":" + std::to_string(root.st_ino);
  }
  return out;
}

TEST_F(ContainerSpawnerTest, TheSpawnerIsBackHomeAfterEveryCommand) {
  auto& a = create();
  auto& b = create();
  const std::string home = placeOf("self");
  EXPECT_EQ(sh(a, "echo a").stdout_data, "a\n");
  auto spawner = spawnerPids();
  ASSERT_EQ(spawner.size(), 1u);
  EXPECT_EQ(placeOf(spawner[0]), home) << "the spawner stayed in a sandbox's namespaces";
  EXPECT_EQ(sh(b, "echo b").stdout_data, "b\n");
  EXPECT_EQ(placeOf(spawner[0]), home);
  // Its way home when the child it returns through is gone: the namespaces one by one.
  auto children = readFile("/proc/" + spawner[0] + "/task/" + spawner[0] + "/children");
  ASSERT_OK(children);
  for (const auto& pid : split(trim(*children), ' ')) {
    if (!pid.empty()) ::kill(std::stoi(pid), SIGKILL);
  }
  EXPECT_EQ(sh(a, "echo a").stdout_data, "a\n");
  EXPECT_EQ(placeOf(spawner[0]), home);
  EXPECT_EQ(sh(b, "echo b").stdout_data, "b\n");
  EXPECT_EQ(placeOf(spawner[0]), home);
  EXPECT_EQ(spawnerPids(), spawner) << "the spawner was replaced";
}

}  // namespace
}  // namespace dsec::testing
