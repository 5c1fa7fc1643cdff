// Attack: a sandbox whose egress policy names domains going elsewhere: asking for names the policy does not list,
// connecting to addresses no allowed name resolved to, using an allowed name's address on another port, a name
// whose answer points at the node or a metadata address (DNS rebinding), and the resolver's own address as a way
// into the node. The node's resolver (backends/container/src/NodeResolver.h) asks a DNS server the test runs in
// "the world" (dns_upstream).
#include <poll.h>

#include <atomic>
#include <map>
#include <thread>

#include "DnsMessage.h"
#include "WorldNetwork.h"

namespace dsec::testing {
namespace {

namespace dns = backends::dns;

// A tiny authoritative server: A records from a table, CNAMEs from another, NXDOMAIN for the rest.
class TinyDnsServer {
 public:
  TinyDnsServer(UniqueFd socket, std::map<std::string, std::string> a, std::map<std::string, std::string> cname)
      : fd_(std::move(socket)), a_(std::move(a)), cname_(std::move(cname)) {
    thread_ = std::thread([this] { serve(); });
  }
  ~TinyDnsServer() {
    stop_ = true;
    thread_.join();
  }
  TinyDnsServer(const TinyDnsServer&) = delete;
  TinyDnsServer& operator=(const TinyDnsServer&) = delete;
  std::atomic<int> queries{0};

 private:
  void serve() {
    while (!stop_) {
      pollfd p{fd_.get(), POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      uint8_t buf[1500];
      sockaddr_in from{};
      socklen_t len = sizeof from;
      ssize_t n = ::recvfrom(fd_.get(), buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&from), &len);
      if (n <= 0) continue;
      ++queries;
      auto answer = answerTo(dns::Bytes(buf, static_cast<size_t>(n)));
      if (!answer.empty()) {
        (void)::sendto(fd_.get(), answer.data(), answer.size(), 0, reinterpret_cast<sockaddr*>(&from), len);
      }
    }
  }
  std::vector<uint8_t> answerTo(dns::Bytes query) {
    auto q = dns::parseQuery(query);
    if (!q.ok()) return {};
    std::vector<uint8_t> records;
    int count = 0;
    std::string name = q->name;
    for (int hops = 0; hops < 8 && cname_.count(name); ++hops, ++count) {
      std::vector<uint8_t> target;
      dns::appendName(target, cname_[name]);
      dns::appendRecord(records, name, dns::kTypeCname, 60, target);
      name = cname_[name];
    }
    bool known = count > 0;
    if (a_.count(name)) {
      known = true;
      if (q->type == dns::kTypeA) {
        in_addr addr{};
        inet_pton(AF_INET, a_[name].c_str(), &addr);
        const auto* b = reinterpret_cast<const uint8_t*>(&addr.s_addr);
        dns::appendRecord(records, name, dns::kTypeA, 60, {b[0], b[1], b[2], b[3]});
        ++count;
      }
    }
    std::vector<uint8_t> out = dns::replyTo(query, *q, known ? dns::kNoError : dns::kNxDomain);
    out[2] |= 0x04;  // AA
    out[7] = static_cast<uint8_t>(count);
    out.insert(out.end(), records.begin(), records.end());
    return out;
  }

  UniqueFd fd_;
  std::map<std::string, std::string> a_, cname_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

UniqueFd udpIn(const std::string& netns_path, int port) {
  UniqueFd result;
  std::thread([&] {
    UniqueFd ns(::open(netns_path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!ns || ::setns(ns.get(), CLONE_NEWNET) != 0) return;  // a thread of its own: left to die in that namespace
    UniqueFd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    if (::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) result = std::move(s);
  }).join();
  return result;
}

class EgressDnsTest : public NetworkTest {
 protected:
  void SetUp() override {
    NetworkTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    const int dns_port = port_ + 3;
    UniqueFd socket = udpIn("/run/netns/" + netns_, dns_port);
    ASSERT_TRUE(socket) << "cannot bind the world's DNS server";
    server_ = std::make_unique<TinyDnsServer>(
        std::move(socket),
        std::map<std::string, std::string>{{"allowed.test", world_},
                                           {"other.test", other_},
                                           {"target.test", other_},
                                           {"x.wild.test", other_},
                                           {"w.wild.test", world_},
                                           {"wild.test", other_},
                                           {"rebind.test", metadata_},
                                           {"node.test", node_side_}},
        std::map<std::string, std::string>{{"alias.test", "mid.test"}, {"mid.test", "target.test"}});
    // The backend the fixture made knows no upstream yet: one that asks the world's server (no sandbox yet).
    dns_upstream_ = world_ + ":" + std::to_string(dns_port);
    backend_ = newBackend();
    ASSERT_TRUE(backend_);
  }
  void TearDown() override {
    NetworkTest::TearDown();
    server_.reset();
  }

  // The addresses nslookup printed for name (none when the resolver refused it).
  std::vector<std::string> lookup(backends::Sandbox& sb, const std::string& name) {
    auto r = sh(sb, "nslookup -type=a " + name + " 2>&1", 30);
    std::vector<std::string> out;
    bool answer = false;
    for (const auto& line : split(r.stdout_data, '\n')) {
      if (startsWith(line, "Name:")) answer = true;
      if (answer && startsWith(line, "Address:")) out.push_back(trim(line.substr(8)));
    }
    last_lookup_ = r.stdout_data;
    return out;
  }
  static size_t violations(backends::Sandbox& sb, backends::ViolationKind kind, const std::string& target) {
    auto v = sb.violations();
    EXPECT_TRUE(v.ok()) << v.error().toString();
    if (!v.ok()) return 0;
    size_t n = 0;
    for (const auto& one : *v) n += one.kind == kind && one.target == target ? 1 : 0;
    return n;
  }
  // Connect refusals come from the agent's event thread: wait for the one expected.
  static bool arrives(backends::Sandbox& sb, backends::ViolationKind kind, const std::string& target) {
    for (int i = 0; i < 400; ++i) {
      if (violations(sb, kind, target) > 0) return true;
      usleep(25000);
    }
    return false;
  }
  std::string nameserverOf(backends::Sandbox& sb) {
    auto r = sh(sb, "cat /etc/resolv.conf");
    auto words = split(trim(r.stdout_data), ' ');
    return words.size() == 2 && words[0] == "nameserver" ? words[1] : "";
  }
  std::string port(int p) const { return std::to_string(p); }

  std::unique_ptr<TinyDnsServer> server_;
  std::string last_lookup_;
};

TEST_F(EgressDnsTest, AnAllowedNameIsReachedAndEverythingElseIsRefusedAndRecorded) {
  auto& sb = createNet(backends::NetworkMode::kEgress, {"allowed.test:" + port(port_)});
  const std::string resolver = nameserverOf(sb);
  ASSERT_FALSE(resolver.empty()) << "/etc/resolv.conf does not name one resolver";
  // Before the name is resolved its address is closed like any other.
  EXPECT_NE(connect(sb, world_, port_), "hi") << "an allowed name's address was open before it was resolved";
  EXPECT_EQ(lookup(sb, "allowed.test"), std::vector<std::string>{world_}) << last_lookup_;
  EXPECT_EQ(connect(sb, world_, port_), "hi") << "the allowed name's address was not opened by its answer";
  // The rule's port is part of it: the same address on another port stays closed.
  EXPECT_NE(connect(sb, world_, port_ + 1), "hi");
  EXPECT_TRUE(arrives(sb, backends::ViolationKind::kConnect, world_ + ":" + port(port_ + 1)));
  // A name not in the policy is refused by the resolver and recorded.
  const int asked = server_->queries;
  EXPECT_TRUE(lookup(sb, "other.test").empty()) << last_lookup_;
  EXPECT_NE(last_lookup_.find("REFUSED"), std::string::npos) << last_lookup_;
  EXPECT_TRUE(arrives(sb, backends::ViolationKind::kDns, "other.test"));
  EXPECT_EQ(server_->queries, asked) << "a refused name was sent upstream (a channel out)";
  // An address no allowed name resolved to is refused and recorded.
  EXPECT_NE(connect(sb, other_, port_), "hi");
  EXPECT_TRUE(arrives(sb, backends::ViolationKind::kConnect, other_ + ":" + port(port_)));
  EXPECT_EQ(violations(sb, backends::ViolationKind::kDns, "allowed.test"), 0u);
}

TEST_F(EgressDnsTest, NameResolutionFromInsideUsesTheNodesResolver) {
  auto& sb = createNet(backends::NetworkMode::kEgress, {"allowed.test:" + port(port_)});
  // A program that resolves through the libc (nc by name) gets the same: the name works, the address opens.
  auto r = sh(sb, "echo | nc -w 3 allowed.test " + port(port_) + " 2>&1", 30);
  if (trim(r.stdout_data) != "hi" && r.stdout_data.find("bad address") != std::string::npos) {
    GTEST_SKIP() << "this busybox's nc cannot resolve names (static libc without NSS): " << r.stdout_data;
  }
  EXPECT_EQ(trim(r.stdout_data), "hi");
}

TEST_F(EgressDnsTest, AWildcardCoversNamesBelowItOnly) {
  auto& sb = createNet(backends::NetworkMode::kEgress, {"*.wild.test"});
  EXPECT_EQ(lookup(sb, "x.wild.test"), std::vector<std::string>{other_}) << last_lookup_;
  EXPECT_EQ(connect(sb, other_, port_), "hi");
  EXPECT_EQ(lookup(sb, "w.wild.test"), std::vector<std::string>{world_}) << last_lookup_;
  EXPECT_EQ(connect(sb, world_, port_), "hi");
  EXPECT_TRUE(lookup(sb, "wild.test").empty()) << "*.NAME allowed NAME itself: " << last_lookup_;
  EXPECT_TRUE(arrives(sb, backends::ViolationKind::kDns, "wild.test"));
}

TEST_F(EgressDnsTest, TheEndOfACnameChainIsOpened) {
  auto& sb = createNet(backends::NetworkMode::kEgress, {"alias.test:" + port(port_)});
  auto addresses = lookup(sb, "alias.test");
  EXPECT_EQ(addresses, std::vector<std::string>{other_}) << last_lookup_;
  EXPECT_EQ(connect(sb, other_, port_), "hi") << "the address at the end of the allowed name's chain stayed closed";
  // The names on the chain are not allowed by themselves.
  EXPECT_TRUE(lookup(sb, "target.test").empty()) << last_lookup_;
  EXPECT_TRUE(arrives(sb, backends::ViolationKind::kDns, "target.test"));
}

TEST_F(EgressDnsTest, ANameThatResolvesToTheNodeOrMetadataStaysRefused) {
  auto& sb = createNet(backends::NetworkMode::kEgress, {"rebind.test", "node.test"});
  EXPECT_EQ(lookup(sb, "rebind.test"), std::vector<std::string>{metadata_}) << last_lookup_;
  EXPECT_NE(connect(sb, metadata_, port_), "hi") << "a name rebound to a link-local address opened it";
  EXPECT_TRUE(arrives(sb, backends::ViolationKind::kConnect, metadata_ + ":" + port(port_)));
  EXPECT_EQ(lookup(sb, "node.test"), std::vector<std::string>{node_side_}) << last_lookup_;
  EXPECT_NE(connect(sb, node_side_, port_), "hi") << "a name rebound to a node address opened it";
  EXPECT_TRUE(arrives(sb, backends::ViolationKind::kConnect, node_side_ + ":" + port(port_)));
}

TEST_F(EgressDnsTest, TheResolverAddressIsNoWayIntoTheNode) {
  // Even a rule naming the resolver's address exactly (which opens node addresses in the BPF policy) reaches
  // nothing there but the resolver: the node's nftables input chain lets sandboxes send it UDP port 53 only.
  auto& probe = createNet(backends::NetworkMode::kEgress, {});
  const std::string resolver = nameserverOf(probe);
  ASSERT_FALSE(resolver.empty());
  auto& sb = createNet(backends::NetworkMode::kEgress, {resolver, "allowed.test"});
  ASSERT_EQ(nameserverOf(sb), resolver);
  EXPECT_NE(connect(sb, resolver, port_), "hi") << "the node's service on the resolver address was reached";
  EXPECT_NE(connect(sb, resolver, 53), "hi");
  // The policy-less sandbox is refused by the BPF policy as well, and it is recorded.
  EXPECT_NE(connect(probe, resolver, port_), "hi");
  EXPECT_TRUE(arrives(probe, backends::ViolationKind::kConnect, resolver + ":" + port(port_)));
  // And the resolver itself still answers both.
  EXPECT_EQ(lookup(sb, "allowed.test"), std::vector<std::string>{world_}) << last_lookup_;
}

TEST_F(EgressDnsTest, WithoutDomainRulesEveryNameIsRefusedAndRecorded) {
  auto& sb = createNet(backends::NetworkMode::kEgress, {world_ + ":" + port(port_)});
  EXPECT_TRUE(lookup(sb, "allowed.test").empty()) << last_lookup_;
  EXPECT_TRUE(arrives(sb, backends::ViolationKind::kDns, "allowed.test"));
  EXPECT_EQ(connect(sb, world_, port_), "hi") << "the address rule still works";
  // A policy open to every address resolves every name (and opens nothing it does not already allow).
  auto& broad = createNet(backends::NetworkMode::kEgress, {"0.0.0.0/0"});
  EXPECT_EQ(lookup(broad, "other.test"), std::vector<std::string>{other_}) << last_lookup_;
  EXPECT_EQ(violations(broad, backends::ViolationKind::kDns, "other.test"), 0u);
}

TEST_F(EgressDnsTest, AStageChangeClosesWhatANameOpened) {
  auto& sb = createNet(backends::NetworkMode::kEgress, {"allowed.test:" + port(port_)});
  EXPECT_EQ(lookup(sb, "allowed.test"), std::vector<std::string>{world_}) << last_lookup_;
  EXPECT_EQ(connect(sb, world_, port_), "hi");
  ASSERT_OK(sb.setEgress(backends::EgressPolicy{}));
  EXPECT_NE(connect(sb, world_, port_), "hi") << "an address a name opened outlived the policy that allowed it";
  EXPECT_TRUE(lookup(sb, "allowed.test").empty()) << last_lookup_;
  EXPECT_TRUE(arrives(sb, backends::ViolationKind::kDns, "allowed.test"));
}

}  // namespace
}  // namespace dsec::testing
