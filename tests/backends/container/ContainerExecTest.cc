// Exec into container sandboxes: argv and shell, env, cwd, stdin, exit codes, timeouts, output caps,
// streaming, and processes that outlive the exec that started them.
#include <gtest/gtest.h>

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

TEST_F(ContainerTest, TimeoutKillsTheProcessGroup) {
  auto& sb = create();
  double t0 = monotonicSeconds();
  auto r = sh(sb, "sleep 100 & sleep 100", 0.5);
  double took = monotonicSeconds() - t0;
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.exit_code, 137);
  EXPECT_LT(took, 5.0);
  // The background sleep was in the same process group: gone too.
  auto ps = sh(sb, "ps -o comm | grep -c sleep");
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

}  // namespace
}  // namespace dsec::testing
