// "The world" for network tests: a network namespace the test makes on the node, a veth routed from the node
// (198.18.N.0/30, a benchmarking range), with a TCP service on it that answers "hi", the same service on a
// link-local address and on a second world address (198.19.x.y) routed the same way. The node runs the same
// service on all its addresses.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../backends/container/ContainerTestSupport.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {

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
inline UniqueFd listenIn(const std::string& netns_path, int port) {
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
    other_ = ip((198u << 24) + (19u << 16) + 1 + rng() % 65000);
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
             {"ip", "-n", netns_, "addr", "add", other_ + "/32", "dev", world_if},
             {"ip", "-n", netns_, "link", "set", world_if, "up"},
             {"ip", "-n", netns_, "link", "set", "lo", "up"},
             {"ip", "-n", netns_, "route", "add", "default", "via", node_side_},
             {"ip", "route", "add", metadata_ + "/32", "via", world_},
             {"ip", "route", "add", other_ + "/32", "via", world_}}) {
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
      (void)runCommand({"ip", "route", "del", other_ + "/32"});
      (void)runCommand({"ip", "netns", "del", netns_});  // the veth goes with it
    }
    ContainerTest::TearDown();
  }

  // A sandbox with the network mode; with a link, the egress policy given (default: anywhere but the node).
  backends::Sandbox& createNet(backends::NetworkMode mode, const std::vector<std::string>& egress = {"0.0.0.0/0"}) {
    auto spec = makeSpec();
    spec.network = mode;
    if (mode == backends::NetworkMode::kEgress) {
      auto policy = backends::parseEgressPolicy(egress);
      EXPECT_TRUE(policy.ok()) << policy.error().toString();
      if (policy.ok()) spec.egress = *policy;
    }
    return create(spec);
  }
  // "hi" if the sandbox reached addr:port, else what nc said.
  std::string connect(backends::Sandbox& sb, const std::string& addr, int port) {
    auto r = sh(sb, "echo | nc -w 3 " + addr + " " + std::to_string(port) + " 2>&1", 30);
    return trim(r.stdout_data);
  }

  std::string tag_, netns_, world_, node_side_, metadata_, other_;
  int port_ = 0;
  std::unique_ptr<HiService> world_service_, node_service_;
};

inline std::string nodeAddress() {
  auto r = runCommandChecked({"ip", "-4", "-o", "route", "get", "192.0.2.123"});
  if (!r.ok()) return "";
  auto parts = split(trim(*r), ' ');
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (parts[i] == "src") return parts[i + 1];
  }
  return "";
}

}  // namespace dsec::testing
