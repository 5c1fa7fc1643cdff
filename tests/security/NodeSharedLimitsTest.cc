// Attack: starve the node and the other sandboxes through kernel limits that are one for the whole node (not per
// namespace, user or cgroup). A hog inside takes all it can; the test fails if the node (host root here) or another
// sandbox is then refused what it asks for.
//   - native AIO contexts (fs.aio-max-nr): a sandbox took the whole budget and io_setup failed with EAGAIN
//     everywhere else on the node, host root included;
//   - pseudo-terminals (kernel.pty.max less kernel.pty.reserve, shared by every devpts instance but the host's):
//     a sandbox took all 3071 and no other sandbox could open a terminal;
//   - TCP memory (net.ipv4.tcp_mem, one budget for every socket of the node): on cgroup v1 socket buffers were not
//     charged to the sandbox, so a sandbox of 64 MiB pinned hundreds of MiB over its own loopback, on its way to
//     starving every TCP socket of the node (the agent's API, Slurm, ssh).
#include <linux/aio_abi.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <functional>
#include <string>

#include "../backends/container/ContainerTestSupport.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {
namespace {

// Copies a static attacker into the sandbox as an executable.
void install(backends::Sandbox& sb, const char* host_path, const std::string& path) {
  auto bytes = readFile(host_path);
  ASSERT_OK(bytes);
  auto fd = sb.openForWrite(path, 0755);
  ASSERT_OK(fd);
  ASSERT_EQ(::write(fd->get(), bytes->data(), bytes->size()), static_cast<ssize_t>(bytes->size()));
}

using Shell = std::function<backends::ExecResult(const std::string&, double)>;

// Starts a hog in the background and returns its "held N errno E" line once it has taken all it can.
std::string startHog(const Shell& sh, const std::string& cmd) {
  auto r = sh(cmd + " > /tmp/hog.out 2>&1 </dev/null & n=0; while [ ! -s /tmp/hog.out ] && [ $n -lt 600 ]; do " +
                  "usleep 100000; n=$((n+1)); done; cat /tmp/hog.out",
              90);
  return trim(r.stdout_data + r.stderr_data);
}

bool hostCanSetUpAio() {
  aio_context_t ctx = 0;
  if (syscall(SYS_io_setup, 1, &ctx) != 0) return false;
  syscall(SYS_io_destroy, ctx);
  return true;
}

TEST_F(ContainerTest, ASandboxCannotTakeTheNodesAioBudget) {
  if (!hostCanSetUpAio()) GTEST_SKIP() << "io_setup fails on this host before any sandbox: " << strerror(errno);
  auto& sb = create();
  install(sb, DSEC_TEST_AIO_HOG, "/tmp/aiohog");
  std::string line = startHog([&](const std::string& c, double t) { return sh(sb, c, t); }, "/tmp/aiohog");
  long held = -1;
  int err = 0;
  ASSERT_EQ(sscanf(line.c_str(), "held %ld errno %d", &held, &err), 2) << line;
  EXPECT_TRUE(hostCanSetUpAio()) << "host root lost native AIO to a sandbox holding " << held
                                 << " events: io_setup: " << strerror(errno);
}

TEST_F(ContainerTest, ASandboxCannotTakeEveryOtherSandboxsTerminals) {
  auto& hog = create();
  auto& victim = create();
  install(hog, DSEC_TEST_PTY_HOG, "/tmp/ptyhog");
  install(victim, DSEC_TEST_PTY_HOG, "/tmp/ptyhog");
  // The victim can open terminals before the attack (so a refusal later is the hog's doing).
  auto before = sh(victim, "/tmp/ptyhog try 4");
  ASSERT_EQ(trim(before.stdout_data), "held 4 errno 0") << before.stdout_data << before.stderr_data;
  std::string line = startHog([&](const std::string& c, double t) { return sh(hog, c, t); }, "/tmp/ptyhog");
  int held = -1, err = 0;
  ASSERT_EQ(sscanf(line.c_str(), "held %d errno %d", &held, &err), 2) << line;
  EXPECT_GT(held, 0) << "the hog could not open a single terminal of its own: " << line;
  auto after = sh(victim, "/tmp/ptyhog try 4");
  EXPECT_EQ(trim(after.stdout_data), "held 4 errno 0")
      << "a sandbox holding " << held << " terminals left none for another: " << after.stdout_data << after.stderr_data;
}

TEST_F(ContainerTest, ASandboxsSocketBuffersStayWithinItsMemoryLimit) {
  constexpr long kLimitMiB = 64;
  auto spec = makeSpec();
  spec.memory_bytes = kLimitMiB << 20;
  auto& sb = create(spec);
  install(sb, DSEC_TEST_SOCKET_MEMORY_HOG, "/tmp/sockhog");
  // It asks for four times its memory limit; a hole lets it have all of it (the node's tcp_mem is far larger).
  std::string line = startHog([&](const std::string& c, double t) { return sh(sb, c, t); },
                              "/tmp/sockhog " + std::to_string(4 * kLimitMiB));
  long queued_mib = -1, conns = 0;
  int err = 0;
  ASSERT_EQ(sscanf(line.c_str(), "queued_mb %ld conns %ld errno %d", &queued_mib, &conns, &err), 3) << line;
  EXPECT_GT(conns, 0) << "the hog could not open a connection of its own: " << line;
  EXPECT_LE(queued_mib, kLimitMiB * 3 / 2) << "a sandbox limited to " << kLimitMiB << " MiB pinned " << queued_mib
                                           << " MiB of the node's TCP memory in socket buffers";
}

}  // namespace
}  // namespace dsec::testing
