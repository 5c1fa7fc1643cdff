// Attack: a sandbox reaching what it must not through the network. No sandbox shares the node's network namespace;
// a sandbox with egress reaches the world through the node, but never the node itself (its addresses, its
// loopback services), another sandbox, or a link-local (metadata) address.
//
// "The world" is a network namespace this test makes on the node: a veth routed from the node (198.18.N.0/30, a
// benchmarking range), with a TCP service on it that answers "hi", and the same service on a link-local address
// routed the same way. The node runs the same service on all its addresses.
#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <random>
#include <string>
#include <thread>

#include "WorldNetwork.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {
namespace {

TEST_F(NetworkTest, HostNetworkIsRefused) {
  auto spec = makeSpec();
  spec.network = backends::NetworkMode::kHost;
  auto made = backend_->create(spec);
  ASSERT_FALSE(made.ok()) << "a sandbox got the node's network namespace";
  EXPECT_EQ(made.error().code(), ErrorCode::kInvalidArgument) << made.error().toString();
}

TEST_F(NetworkTest, EgressReachesTheWorldButNotTheNodeOtherSandboxesOrMetadata) {
  auto& a = createNet(backends::NetworkMode::kEgress);
  auto& b = createNet(backends::NetworkMode::kEgress);
  // The world answers: the route out works (masqueraded by the node).
  EXPECT_EQ(connect(a, world_, port_), "hi") << "egress did not reach the outside network";
  // The node does not, on any of its addresses: its side of the link, its uplink address, its loopback.
  auto link = sh(a, "ip route | awk '/default/ {print $3}'");
  const std::string gateway = trim(link.stdout_data);
  ASSERT_FALSE(gateway.empty()) << link.stdout_data << link.stderr_data;
  EXPECT_NE(connect(a, gateway, port_), "hi") << "the sandbox reached a service on the node through its link";
  EXPECT_NE(connect(a, node_side_, port_), "hi") << "the sandbox reached a service on a node address";
  const std::string uplink = nodeAddress();
  if (!uplink.empty()) {
    EXPECT_NE(connect(a, uplink, port_), "hi") << "the sandbox reached the node's uplink address";
  }
  EXPECT_NE(connect(a, "127.0.0.1", port_), "hi") << "loopback inside is not the node's";
  // A link-local (metadata) address beyond the node is dropped, though the world serves it.
  EXPECT_NE(connect(a, metadata_, port_), "hi") << "the sandbox reached a link-local address";
  // Another sandbox is out of reach, even with a service listening.
  auto b_addr = trim(sh(b, "ip addr show eth0 | grep 'inet ' | awk '{print $2}' | cut -d/ -f1").stdout_data);
  ASSERT_FALSE(b_addr.empty());
  // Wait until it listens (port 7777 = 0x1E61 in state LISTEN, 0A, in /proc/net/tcp or tcp6: nc listens
  // dual-stack): a loaded machine may take longer than any fixed sleep.
  sh(b,
     "(while true; do echo hi | nc -l -p 7777; done) >/dev/null 2>&1 & "
     "for i in $(seq 400); do grep -qs ':1E61 [0-9A-F]*:0000 0A' /proc/net/tcp /proc/net/tcp6 && break; "
     "sleep 0.05; done");
  EXPECT_NE(connect(a, b_addr, 7777), "hi") << "one sandbox reached another";
  EXPECT_EQ(connect(b, "127.0.0.1", 7777), "hi") << "the service in b is not up, so the check above proves nothing";
}

// IPv4 packets the sandbox's network namespace received (InReceives of its /proc/net/snmp).
long ipArrivals(const std::function<backends::ExecResult(const std::string&)>& sh) {
  auto r = sh("grep '^Ip:' /proc/net/snmp | tail -1");
  std::vector<std::string> values;
  for (auto& f : split(trim(r.stdout_data), ' ')) {
    if (!f.empty()) values.push_back(f);
  }
  if (values.size() < 4) return -1;
  return std::stol(values[3]);
}

// Attack from the node: a node user (uid 65534 here) sends datagrams to a sandbox's address. The node routes its own
// packets straight onto the sandbox's link; nothing from outside may come in, the node's users included.
TEST_F(NetworkTest, TheNodesUsersCannotSendIntoASandbox) {
  auto& sb = createNet(backends::NetworkMode::kEgress);
  auto count = [&] { return ipArrivals([&](const std::string& c) { return sh(sb, c); }); };
  const std::string addr =
      trim(sh(sb, "ip addr show eth0 | grep 'inet ' | awk '{print $2}' | cut -d/ -f1").stdout_data);
  ASSERT_FALSE(addr.empty());
  // The count works: a connection the sandbox tries to its own address (refused) shows up.
  const long start = count();
  ASSERT_GE(start, 0);
  sh(sb, "echo x | nc -w 1 " + addr + " 1 >/dev/null 2>&1; true");
  const long control = count();
  ASSERT_GT(control, start) << "the sandbox's packet count does not move, so it proves nothing";
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (setgroups(0, nullptr) != 0 || setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0) {
      _exit(2);
    }
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<uint16_t>(port_));
    if (fd < 0 || inet_pton(AF_INET, addr.c_str(), &to.sin_addr) != 1) _exit(3);
    for (int i = 0; i < 20; ++i) {
      (void)sendto(fd, "from the node", 13, 0, reinterpret_cast<sockaddr*>(&to), sizeof to);
    }
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  // A packet on a veth is delivered within the sender's system call; look a few times anyway.
  long after = control;
  for (int i = 0; i < 10 && after == control; ++i) after = count();
  EXPECT_EQ(after, control) << after - control << " datagrams a node user sent reached the sandbox";
}

TEST_F(NetworkTest, SandboxesSeeOnlyTheirOwnNetwork) {
  auto& none = createNet(backends::NetworkMode::kNone);
  auto& egress = createNet(backends::NetworkMode::kEgress);
  // Only loopback (and the sandbox's own link): no interface of the node to sniff or configure.
  auto r = sh(none, "ls /sys/class/net 2>/dev/null || cat /proc/net/dev | tail -n +3 | cut -d: -f1");
  EXPECT_EQ(trim(r.stdout_data), "lo") << r.stdout_data;
  r = sh(egress, "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' ' | sort | tr '\\n' ' '");
  EXPECT_EQ(trim(r.stdout_data), "eth0 lo") << r.stdout_data;
  EXPECT_NE(connect(none, world_, port_), "hi") << "a sandbox without a network reached the outside";
  // Even a packet socket sees only the sandbox's own interfaces; and configuring them is refused (no NET_ADMIN).
  r = sh(egress, "ip link set eth0 down 2>&1; ip link add x type dummy 2>&1; ip addr add 10.9.9.9/32 dev eth0 2>&1");
  EXPECT_EQ(connect(egress, world_, port_), "hi") << "the sandbox reconfigured its link: " << r.stdout_data;
}

}  // namespace
}  // namespace dsec::testing
