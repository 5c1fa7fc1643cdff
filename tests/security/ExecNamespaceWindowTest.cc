// Attack: read the node's network and mount tables through a command the node is starting. Every command is born
// in the sandbox's pid namespace, so root inside sees it at once; /proc/N/net/* and /proc/N/mountinfo need no
// ptrace access, only a visible pid, and show the namespaces the process is in at that moment. A probe inside
// predicts the next pid and keeps opening those files while the test starts commands from outside; if a command
// is visible while still in the node's network or mount namespace, the probe sees the node's interfaces, mounts
// and unix sockets. The test fails if it ever reports one, and checks that the probe did catch the commands (so
// it would have seen them).
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "../backends/container/ContainerTestSupport.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {
namespace {

TEST_F(ContainerTest, StartingCommandsShowNothingOfTheNodesNamespaces) {
  // A marker only the node's mount namespace has: a tmpfs at a path of our own.
  char tmpl[] = "/tmp/dsec-node-marker-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string marker = tmpl;
  ASSERT_EQ(mount("tmpfs", marker.c_str(), "tmpfs", 0, "size=64k"), 0) << strerror(errno);
  struct Unmount {
    std::string dir;
    ~Unmount() {
      umount2(dir.c_str(), MNT_DETACH);
      rmdir(dir.c_str());
    }
  } unmount{marker};

  for (auto network : {backends::NetworkMode::kNone, backends::NetworkMode::kEgress}) {
    SCOPED_TRACE(backends::networkModeName(network));
    auto spec = makeSpec();
    spec.network = network;
    auto& sb = create(spec);
    auto probe = readFile(DSEC_TEST_PROC_WINDOW_PROBE);
    ASSERT_OK(probe);
    {
      auto fd = sb.openForWrite("/tmp/probe", 0755);
      ASSERT_OK(fd);
      ASSERT_EQ(::write(fd->get(), probe->data(), probe->size()), static_cast<ssize_t>(probe->size()));
    }
    auto started = sh(sb, "/tmp/probe /tmp/stop >/tmp/probe.log 2>&1 </dev/null &");
    ASSERT_EQ(started.exit_code, 0) << started.stderr_data;
    constexpr int kCommands = 300;
    for (int i = 0; i < kCommands; ++i) {
      backends::ExecRequest request;
      request.argv = {"/bin/usleep", "3000"};  // alive long enough for the probe to catch most of them
      request.timeout_seconds = 10;
      auto r = sb.exec(request);
      ASSERT_OK(r);
    }
    auto out =
        sh(sb, "touch /tmp/stop; while ! grep -q '^tries' /tmp/probe.log; do usleep 10000; done; cat /tmp/probe.log");
    long tries = 0, caught = 0;
    for (const auto& line : split(trim(out.stdout_data), '\n')) {
      if (startsWith(line, "tries ")) {
        sscanf(line.c_str(), "tries %ld caught %ld", &tries, &caught);
        continue;
      }
      ADD_FAILURE() << "a command starting in the sandbox showed the node's " << line;
      if (line == "mount " + marker) ADD_FAILURE() << "(the test's own marker mount on the node)";
    }
    // The probe caught the commands it was after: it opened their /proc files.
    EXPECT_GE(caught, kCommands / 2) << out.stdout_data << out.stderr_data;
    EXPECT_GT(tries, 0);
  }
}

}  // namespace
}  // namespace dsec::testing
