// A sandbox's terminal (a tty exec: what `dsec shell` and Sandbox.terminal() run on) is a pty of the sandbox's
// own devpts instance, never one of the host's: the attacker inside pushes input (TIOCSTI) into every terminal
// it can reach, and the host's terminals, among them the one a user's `dsec shell` would be on, get nothing.
#include <fcntl.h>
#include <linux/magic.h>
#include <pty.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

#include "../backends/container/ContainerTestSupport.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {
namespace {

void install(backends::Sandbox& sb, const char* host_path, const std::string& path) {
  auto bytes = readFile(host_path);
  ASSERT_OK(bytes);
  auto fd = sb.openForWrite(path, 0755);
  ASSERT_OK(fd);
  ASSERT_EQ(::write(fd->get(), bytes->data(), bytes->size()), static_cast<ssize_t>(bytes->size()));
}

class Collect : public backends::ExecSink {
 public:
  bool onStdout(const char* data, size_t size) override {
    out.append(data, size);
    return true;
  }
  bool onStderr(const char* data, size_t size) override { return onStdout(data, size); }
  std::string out;
};

int pendingInput(int fd) {
  int n = -1;
  ioctl(fd, FIONREAD, &n);
  return n;
}

TEST_F(ContainerTest, ASandboxsTerminalCannotReachAHostTerminal) {
  auto& sb = create();
  install(sb, DSEC_TEST_TTY_INJECTOR, "/tmp/injector");
  // A host terminal, as the one `dsec shell` runs on: its input queue must stay empty whatever the sandbox does.
  int master = -1, slave = -1;
  ASSERT_EQ(openpty(&master, &slave, nullptr, nullptr, nullptr), 0);
  UniqueFd host_master(master), host_slave(slave);
  struct stat host_pts {};
  ASSERT_EQ(fstat(slave, &host_pts), 0);

  backends::ExecRequest req;
  req.argv = {"/tmp/injector", "touch /tmp/escaped\n"};
  req.tty = true;
  req.timeout_seconds = 30;
  Collect sink;
  auto r = sb.execStream(req, sink);
  ASSERT_OK(r);
  ASSERT_EQ(r->exit_code, 0) << sink.out;
  unsigned long dev = 0, rdev = 0, fs = 0;
  int injected = -1, refused = -1;
  auto at = sink.out.find("dev ");
  ASSERT_NE(at, std::string::npos) << sink.out;
  ASSERT_EQ(sscanf(sink.out.c_str() + at, "dev %lu rdev %lu fs %lx injected %d refused %d", &dev, &rdev, &fs, &injected,
                   &refused),
            5)
      << sink.out;
  EXPECT_EQ(fs, static_cast<unsigned long>(DEVPTS_SUPER_MAGIC)) << "its terminal is not a pty";
  EXPECT_NE(dev, static_cast<unsigned long>(host_pts.st_dev)) << "its terminal is in the host's devpts instance";
  // (st_rdev says nothing: every devpts instance numbers its terminals from 0.)
  EXPECT_GT(injected, 0) << "the attacker could not even type into its own terminal: " << sink.out;
  EXPECT_EQ(pendingInput(slave), 0) << "input pushed inside the sandbox reached a host terminal";
  // What it typed went to its own terminal, read by nothing after it exited: no file appeared on the host side.
  EXPECT_NE(access("/tmp/escaped", F_OK), 0);
}

}  // namespace
}  // namespace dsec::testing
