// Attack: a sandbox with a network link going where its egress policy does not let it (reward hacking: fetching
// the fix, probing the node), and keeping a connection open across a stage that forbids it. The policy is
// enforced by BPF programs on connect() and sendmsg(); every refusal shows up in violations().
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "WorldNetwork.h"

namespace dsec::testing {
namespace {

// A TCP service that accepts connections and holds them open (never writes, never closes) until stopped.
class HoldService {
 public:
  explicit HoldService(UniqueFd listener) : fd_(std::move(listener)) {
    thread_ = std::thread([this] {
      while (!stop_) {
        int c = ::accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0) continue;
        held_.emplace_back(c);
        ++accepted;
      }
    });
  }
  ~HoldService() {
    stop_ = true;
    ::shutdown(fd_.get(), SHUT_RDWR);
    thread_.join();
  }
  HoldService(const HoldService&) = delete;
  HoldService& operator=(const HoldService&) = delete;
  std::atomic<int> accepted{0};

 private:
  UniqueFd fd_;
  std::vector<UniqueFd> held_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class EgressPolicyTest : public NetworkTest {
 protected:
  // The refusals of kind connect whose target is addr:port.
  static size_t refusals(backends::Sandbox& sb, const std::string& addr, int port) {
    auto v = sb.violations();
    EXPECT_TRUE(v.ok()) << v.error().toString();
    if (!v.ok()) return 0;
    size_t n = 0;
    for (const auto& one : *v) {
      if (one.kind == backends::ViolationKind::kConnect && one.target == addr + ":" + std::to_string(port)) ++n;
    }
    return n;
  }
  // Refusals are delivered by the agent's event thread: wait for the one expected.
  static bool refusalArrives(backends::Sandbox& sb, const std::string& addr, int port) {
    for (int i = 0; i < 200; ++i) {
      if (refusals(sb, addr, port) > 0) return true;
      usleep(25000);
    }
    return false;
  }
};

TEST_F(EgressPolicyTest, TheListedServerIsReachedAndTheRestOfItsNetworkIsRefusedAndRecorded) {
  auto& sb = createNet(backends::NetworkMode::kEgress, {world_ + ":" + std::to_string(port_)});
  EXPECT_EQ(connect(sb, world_, port_), "hi") << "the one listed destination was not reached";
  EXPECT_NE(connect(sb, other_, port_), "hi") << "a server not in the policy was reached";
  EXPECT_TRUE(refusalArrives(sb, other_, port_)) << "the refused connect is not in violations()";
  // The port is part of the rule: the listed address on another port is refused too.
  EXPECT_NE(connect(sb, world_, port_ + 1), "hi");
  EXPECT_TRUE(refusalArrives(sb, world_, port_ + 1));
  // UDP is held to the same policy (a datagram to an unlisted address).
  sh(sb, "timeout 5 nslookup x.example " + other_ + " >/dev/null 2>&1; true");
  EXPECT_TRUE(refusalArrives(sb, other_, 53)) << "a UDP send outside the policy was not refused";
  // Nothing is refused for the allowed connection.
  EXPECT_EQ(refusals(sb, world_, port_), 0u);
}

TEST_F(EgressPolicyTest, NoRulesMeansNoEgress) {
  auto& sb = createNet(backends::NetworkMode::kEgress, {});
  EXPECT_NE(connect(sb, world_, port_), "hi") << "a sandbox with an empty policy reached the world";
  EXPECT_TRUE(refusalArrives(sb, world_, port_));
  // Its own loopback is its own: still usable.
  sh(sb,
     "(echo hi | nc -l -p 7777 >/dev/null 2>&1 &) ; "
     "for i in $(seq 400); do grep -qs ':1E61 [0-9A-F]*:0000 0A' /proc/net/tcp /proc/net/tcp6 && break; "
     "sleep 0.05; done");
  EXPECT_EQ(connect(sb, "127.0.0.1", 7777), "hi") << "the sandbox's own loopback was refused";
}

// Raw and packet sockets name no destination the connect and send hooks judge: a sandbox holds no CAP_NET_RAW, so
// it cannot open them (ping, a raw-socket sender, reaches the world in the positive control only through the
// node's own namespace, which is not a sandbox).
TEST_F(EgressPolicyTest, RawSocketsCannotGoAroundThePolicy) {
  auto& sb = createNet(backends::NetworkMode::kEgress, {});
  auto r = sh(sb, "ping -c 1 -W 2 " + world_ + " 2>&1; echo rc=$?");
  EXPECT_EQ(r.stdout_data.find("rc=0"), std::string::npos) << r.stdout_data;
  EXPECT_EQ(r.stdout_data.find("1 packets received"), std::string::npos)
      << "a raw socket reached the world: " << r.stdout_data;
  auto caps = sh(sb, "grep CapEff /proc/self/status");
  const std::string hex = trim(caps.stdout_data.substr(caps.stdout_data.find(':') + 1));
  ASSERT_FALSE(hex.empty()) << caps.stdout_data;
  EXPECT_EQ(std::stoull(hex, nullptr, 16) & (1ULL << 13), 0u) << "CAP_NET_RAW is in the sandbox's set: " << hex;
  // Control: the world answers pings (from the node), so the sandbox's ping failed for want of a raw socket.
  auto control = runCommand({"/bin/busybox", "ping", "-c", "1", "-W", "5", world_});
  ASSERT_OK(control);
  EXPECT_EQ(control->exit_code, 0) << "the world does not answer pings, so the check above proves nothing";
}

TEST_F(EgressPolicyTest, TheNodeAndMetadataAreRefusedEvenToABroadPolicy) {
  auto& sb = createNet(backends::NetworkMode::kEgress, {"0.0.0.0/0"});
  auto link = sh(sb, "ip route | awk '/default/ {print $3}'");
  const std::string gateway = trim(link.stdout_data);
  ASSERT_FALSE(gateway.empty()) << link.stdout_data << link.stderr_data;
  EXPECT_NE(connect(sb, gateway, port_), "hi");
  EXPECT_TRUE(refusalArrives(sb, gateway, port_)) << "the node's side of the link was not refused by the policy";
  EXPECT_NE(connect(sb, node_side_, port_), "hi");
  EXPECT_TRUE(refusalArrives(sb, node_side_, port_)) << "a node address was not refused by the policy";
  EXPECT_NE(connect(sb, metadata_, port_), "hi");
  EXPECT_TRUE(refusalArrives(sb, metadata_, port_)) << "a link-local (metadata) address was not refused";
  EXPECT_NE(connect(sb, "169.254.169.254", 80), "hi");
  EXPECT_TRUE(refusalArrives(sb, "169.254.169.254", 80));
  EXPECT_EQ(connect(sb, world_, port_), "hi") << "the broad policy does reach the world";
}

// The fleet's gateways (and any address the operator names) are out of reach as the node is, unless a rule names
// that very address.
class EgressNeverTest : public EgressPolicyTest {
 protected:
  void SetUp() override {
    // other_ is chosen in NetworkTest::SetUp; a fixed block of the same range stands in for "the gateways" here.
    egress_never_ = {"198.19.0.0/16"};
    EgressPolicyTest::SetUp();
  }
};

TEST_F(EgressNeverTest, AnOperatorsNeverBlockIsRefusedToABroadPolicyButNotToAnExactRule) {
  auto& broad = createNet(backends::NetworkMode::kEgress, {"0.0.0.0/0"});
  EXPECT_NE(connect(broad, other_, port_), "hi") << "0.0.0.0/0 opened an address the operator closed";
  EXPECT_TRUE(refusalArrives(broad, other_, port_));
  auto& exact = createNet(backends::NetworkMode::kEgress, {other_});
  EXPECT_EQ(connect(exact, other_, port_), "hi") << "a rule naming the address exactly did not open it";
}

// Attack: a sandbox with 0.0.0.0/0 hammers an address the operator closed while the node churns under it: other
// sandboxes created and destroyed, stage changes on another one, node addresses added and removed (each of which
// rewrites the never-reachable set). A refresh that deleted before it inserted left the address open for a moment;
// not one try may get through.
TEST_F(EgressNeverTest, ANeverBlockStaysClosedWhileTheNodeChurns) {
  if (findProgram("ip").empty()) GTEST_SKIP() << "iproute2 (ip) is needed to churn the node's addresses";
  auto& broad = createNet(backends::NetworkMode::kEgress, {"0.0.0.0/0"});
  auto& staged = createNet(backends::NetworkMode::kEgress, {world_});
  {
    auto bytes = readFile(DSEC_TEST_CONNECT_LOOP);
    ASSERT_OK(bytes);
    auto fd = broad.openForWrite("/tmp/connloop", 0755);
    ASSERT_OK(fd);
    ASSERT_EQ(::write(fd->get(), bytes->data(), bytes->size()), static_cast<ssize_t>(bytes->size()));
  }
  constexpr int kSeconds = 6;
  backends::ExecResult attack;
  std::thread attacker([&] {
    attack = sh(broad, "/tmp/connloop " + other_ + " " + std::to_string(port_) + " " + std::to_string(kSeconds), 60);
  });
  auto wide = backends::parseEgressPolicy({"0.0.0.0/0"});
  auto narrow = backends::parseEgressPolicy({world_});
  ASSERT_OK(wide);
  ASSERT_OK(narrow);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(kSeconds - 1);
  int rounds = 0;
  for (; std::chrono::steady_clock::now() < end; ++rounds) {
    auto spec = makeSpec();
    spec.network = backends::NetworkMode::kEgress;
    spec.egress = *wide;
    auto churn = backend_->create(spec);
    EXPECT_OK(churn);
    EXPECT_OK(staged.setEgress(rounds % 2 == 0 ? *wide : *narrow));
    const std::string address = "192.0.2." + std::to_string(200 + rounds % 50) + "/32";  // TEST-NET-1
    EXPECT_OK(runCommandChecked({"ip", "addr", "add", address, "dev", "lo"}));
    EXPECT_OK(runCommandChecked({"ip", "addr", "del", address, "dev", "lo"}));
    if (churn.ok()) EXPECT_OK((*churn)->destroy());
  }
  attacker.join();
  long tries = 0, through = 0;
  int err = 0;
  ASSERT_EQ(sscanf(attack.stdout_data.c_str(), "tries %ld through %ld errno %d", &tries, &through, &err), 3)
      << attack.stdout_data << attack.stderr_data;
  EXPECT_GE(rounds, 3) << "the node hardly churned: the attack proves little";
  EXPECT_GT(tries, 1000) << "the attacker hardly tried";
  EXPECT_EQ(through, 0) << through << " of " << tries << " connects to the closed " << other_ << " got past the "
                        << "egress programs (first errno " << err << ") during " << rounds << " rounds of churn";
}

TEST_F(EgressPolicyTest, AStageChangeRefusesNewConnectionsAndCutsOpenOnes) {
  const int hold_port = port_ + 2;
  HoldService hold(listenIn("/run/netns/" + netns_, hold_port));
  auto& sb = createNet(backends::NetworkMode::kEgress, {world_});
  // Setup stage: a long-lived connection out, kept open by a reader that never ends.
  sh(sb, "(sleep 1000 | (nc " + world_ + " " + std::to_string(hold_port) +
             "; echo ended > /tmp/nc-ended)) >/dev/null 2>&1 &");
  for (int i = 0; i < 400 && hold.accepted == 0; ++i) usleep(25000);
  ASSERT_EQ(hold.accepted, 1) << "the long-lived connection was never opened";
  EXPECT_EQ(connect(sb, world_, port_), "hi");
  EXPECT_NE(sh(sb, "cat /tmp/nc-ended 2>/dev/null").stdout_data, "ended\n") << "the connection ended by itself";

  // Agent stage: nothing.
  ASSERT_OK(sb.setEgress(backends::EgressPolicy{}));
  EXPECT_NE(connect(sb, world_, port_), "hi") << "a new connection got through after the policy was emptied";
  EXPECT_TRUE(refusalArrives(sb, world_, port_));
  bool ended = false;
  for (int i = 0; i < 400 && !ended; ++i) {
    ended = sh(sb, "cat /tmp/nc-ended 2>/dev/null").stdout_data == "ended\n";
    if (!ended) usleep(25000);
  }
  EXPECT_TRUE(ended) << "the connection opened before the change is still open";

  // A later stage may open it again.
  auto again = backends::parseEgressPolicy({world_});
  ASSERT_OK(again);
  ASSERT_OK(sb.setEgress(*again));
  EXPECT_EQ(connect(sb, world_, port_), "hi");
}

TEST_F(EgressPolicyTest, ASandboxWithoutALinkCannotBeGivenAPolicy) {
  auto& none = createNet(backends::NetworkMode::kNone);
  auto policy = backends::parseEgressPolicy({"0.0.0.0/0"});
  ASSERT_OK(policy);
  auto st = none.setEgress(*policy);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kConflict) << st.error().toString();
  EXPECT_NE(connect(none, world_, port_), "hi");
}

}  // namespace
}  // namespace dsec::testing
