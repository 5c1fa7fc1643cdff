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

#include "../backends/container/ContainerTestSupport.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {
namespace {

// A TCP service answering "hi\n" to every connection, on a socket made in some network namespace.
class HiService {
 public:
  explicit HiService(UniqueFd listener) : fd_(std::move(listener)) {
    thread_ = std::thread([this] {
      while (!stop_) {
        int c = ::accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0) continue;
        (void)!::write(c, "hi\n", 3);
        ::close(c);
      }
    });
  }
  ~HiService() {
    stop_ = true;
    ::shutdown(fd_.get(), SHUT_RDWR);
    thread_.join();
  }
  HiService(const HiService&) = delete;
  HiService& operator=(const HiService&) = delete;

 private:
  UniqueFd fd_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// A listening socket on 0.0.0.0:port in the network namespace at netns_path ("" = ours).
UniqueFd listenIn(const std::string& netns_path, int port) {
  UniqueFd result;
  std::thread([&] {
    UniqueFd home(::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
    if (!netns_path.empty()) {
      UniqueFd ns(::open(netns_path.c_str(), O_RDONLY | O_CLOEXEC));
      if (!ns || ::setns(ns.get(), CLONE_NEWNET) != 0) return;
    }
    UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    int one = 1;
    ::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    if (::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(s.get(), 64) == 0) {
      result = std::move(s);
    }
    (void)::setns(home.get(), CLONE_NEWNET);
  }).join();
  return result;
}

class NetworkTest : public ContainerTest {
 protected:
  void SetUp() override {
    ContainerTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (findProgram("ip").empty()) GTEST_SKIP() << "iproute2 (ip) is needed to build the test's outside network";
    std::mt19937 rng(std::random_device{}());
    tag_ = std::to_string(rng() % 100000);
    // Test cases run in parallel: each takes its own /30 of 198.18.0.0/15 and its own link-local address.
    const uint32_t block = (rng() % (1u << 15)) * 4;
    auto ip = [](uint32_t host_order) {
      in_addr a{htonl(host_order)};
      char buf[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &a, buf, sizeof buf);
      return std::string(buf);
    };
    world_ = ip((198u << 24) + (18u << 16) + block + 2);
    node_side_ = ip((198u << 24) + (18u << 16) + block + 1);
    metadata_ = ip((169u << 24) + (254u << 16) + 1 + rng() % 65000);
    port_ = 20000 + static_cast<int>(rng() % 20000);
    netns_ = "dsec-world-" + tag_;
    const std::string host_if = "dswh" + tag_, world_if = "dsww" + tag_;
    for (const auto& cmd : std::vector<std::vector<std::string>>{
             {"ip", "netns", "add", netns_},
             {"ip", "link", "add", host_if, "type", "veth", "peer", "name", world_if, "netns", netns_},
             {"ip", "addr", "add", node_side_ + "/30", "dev", host_if},
             {"ip", "link", "set", host_if, "up"},
             {"ip", "-n", netns_, "addr", "add", world_ + "/30", "dev", world_if},
             {"ip", "-n", netns_, "addr", "add", metadata_ + "/32", "dev", world_if},
             {"ip", "-n", netns_, "link", "set", world_if, "up"},
             {"ip", "-n", netns_, "link", "set", "lo", "up"},
             {"ip", "-n", netns_, "route", "add", "default", "via", node_side_},
             {"ip", "route", "add", metadata_ + "/32", "via", world_}}) {
      auto r = runCommandChecked(cmd);
      ASSERT_OK(r);
    }
    world_service_ = std::make_unique<HiService>(listenIn("/run/netns/" + netns_, port_));
    node_service_ = std::make_unique<HiService>(listenIn("", port_));
  }
  void TearDown() override {
    world_service_.reset();
    node_service_.reset();
    if (!netns_.empty()) {
      (void)runCommand({"ip", "route", "del", metadata_ + "/32"});
      (void)runCommand({"ip", "netns", "del", netns_});  // the veth goes with it
    }
    ContainerTest::TearDown();
  }

  backends::Sandbox& createNet(backends::NetworkMode mode) {
    auto spec = makeSpec();
    spec.network = mode;
    return create(spec);
  }
  // "hi" if the sandbox reached addr:port, else what nc said.
  std::string connect(backends::Sandbox& sb, const std::string& addr, int port) {
    auto r = sh(sb, "echo | nc -w 3 " + addr + " " + std::to_string(port) + " 2>&1", 30);
    return trim(r.stdout_data);
  }

  std::string tag_, netns_, world_, node_side_, metadata_;
  int port_ = 0;
  std::unique_ptr<HiService> world_service_, node_service_;
};

std::string nodeAddress() {
  auto r = runCommandChecked({"ip", "-4", "-o", "route", "get", "192.0.2.123"});
  if (!r.ok()) return "";
  auto parts = split(trim(*r), ' ');
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (parts[i] == "src") return parts[i + 1];
  }
  return "";
}

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
