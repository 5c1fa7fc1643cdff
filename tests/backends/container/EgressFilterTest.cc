// The egress filter on the real kernel, without a sandbox: a child process in a network namespace of its own, in
// a cgroup the programs are attached to, tries a table of destinations. What the kernel refused must be what the
// agent's allows() says (it cuts connections by that answer) and what the policy means; the never-reachable set
// must follow the node's addresses as they change.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/magic.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "EgressFilter.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Process.h"

namespace dsec::backends {
namespace {

uint32_t ip(const char* dotted) {
  in_addr a{};
  inet_pton(AF_INET, dotted, &a);
  return ntohl(a.s_addr);
}

struct Destination {
  const char* address;
  uint16_t port;
  bool allowed;  // what the policy below means
};

// The policy: two blocks (one any port, one port 80), one exact address and port, one exact address inside a
// never block, plus resolver answers. Never: 192.0.2.0/24 and 203.0.113.0/24 besides the node and link-local.
const std::vector<std::string> kRules = {"10.1.0.0/16", "10.2.3.4:443", "192.0.2.7", "198.51.100.0/24:80"};
const char* const kResolver = "100.64.0.1";
const char* const kOwn = "192.0.2.66";  // its own link address, inside a never block
const Destination kTable[] = {
    {"10.1.5.5", 22, true},         {"10.1.255.1", 9, true},     {"10.2.3.4", 443, true},
    {"10.2.3.4", 80, false},        {"10.3.0.1", 443, false},    {"192.0.2.7", 1, true},
    {"192.0.2.8", 1, false},        {"203.0.113.5", 80, false},  {"198.51.100.9", 80, true},
    {"198.51.100.9", 81, false},    {"127.0.0.1", 5, true},      {"100.64.0.1", 53, true},
    {"100.64.0.1", 54, false},      {"100.100.1.1", 8080, true}, {"100.100.1.1", 8081, false},
    {"100.100.1.2", 9999, true},    {"100.100.1.3", 80, false},  {"8.8.8.8", 53, false},
    {"169.254.169.254", 80, false}, {"224.0.0.1", 80, false},    {"192.0.2.66", 8080, true},
};

// A process in a new network namespace, inside cgroup_dir, that connects when asked and reports errno per try.
class Prober {
 public:
  static std::unique_ptr<Prober> start(const std::string& cgroup_dir) {
    int to_child[2], from_child[2];
    if (::pipe2(to_child, O_CLOEXEC) != 0 || ::pipe2(from_child, O_CLOEXEC) != 0) return nullptr;
    const pid_t pid = ::fork();
    if (pid < 0) return nullptr;
    if (pid == 0) {
      ::close(to_child[1]);
      ::close(from_child[0]);
      childMain(cgroup_dir.c_str(), to_child[0], from_child[1]);
      ::_exit(0);
    }
    ::close(to_child[0]);
    ::close(from_child[1]);
    auto prober = std::unique_ptr<Prober>(new Prober(pid, UniqueFd(to_child[1]), UniqueFd(from_child[0])));
    if (::read(prober->from_.get(), &prober->cookie_, sizeof prober->cookie_) != sizeof prober->cookie_) {
      return nullptr;
    }
    return prober;
  }
  ~Prober() {
    to_.reset();  // EOF: the child exits
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  uint64_t cookie() const { return cookie_; }
  // The errno of a non-blocking connect from the namespace (0: it connected at once).
  int connectErrno(uint32_t address, uint16_t port) {
    uint32_t request[2] = {htonl(address), port};
    if (::write(to_.get(), request, sizeof request) != sizeof request) return -1;
    int err = -1;
    if (::read(from_.get(), &err, sizeof err) != sizeof err) return -1;
    return err;
  }

 private:
  Prober(pid_t pid, UniqueFd to, UniqueFd from) : pid_(pid), to_(std::move(to)), from_(std::move(from)) {}
  // After fork in a threaded process: plain system calls only.
  static void childMain(const char* cgroup_dir, int in, int out) {
    uint64_t cookie = 0;
    char path[512];
    std::snprintf(path, sizeof path, "%s/cgroup.procs", cgroup_dir);
    const int procs = ::open(path, O_WRONLY | O_CLOEXEC);
    if (::unshare(CLONE_NEWNET) != 0 || procs < 0 || ::write(procs, "0", 1) != 1) ::_exit(2);
    ::close(procs);
    const int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    socklen_t len = sizeof cookie;
    if (s < 0 || ::getsockopt(s, SOL_SOCKET, SO_NETNS_COOKIE, &cookie, &len) != 0) ::_exit(3);
    ::close(s);
    if (::write(out, &cookie, sizeof cookie) != sizeof cookie) ::_exit(4);
    uint32_t request[2];
    while (::read(in, request, sizeof request) == sizeof request) {
      sockaddr_in to{};
      to.sin_family = AF_INET;
      to.sin_addr.s_addr = request[0];
      to.sin_port = htons(static_cast<uint16_t>(request[1]));
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      int err = ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0 ? 0 : errno;
      ::close(fd);
      if (::write(out, &err, sizeof err) != sizeof err) ::_exit(5);
    }
  }

  pid_t pid_;
  UniqueFd to_, from_;
  uint64_t cookie_ = 0;
};

class EgressFilterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (BPF programs, cgroups, network namespaces)";
    struct statfs fs {};
    const int version = ::statfs("/sys/fs/cgroup", &fs) == 0 && fs.f_type == CGROUP2_SUPER_MAGIC ? 2 : 1;
    auto dir = EgressFilter::cgroup2DirFor(version, "dsec-egress-filter-test-" + std::to_string(::getpid()));
    if (!dir.ok()) GTEST_SKIP() << dir.error().toString();
    dir_ = *dir;
    auto filter = EgressFilter::start([](uint64_t, Violation) {});
    if (!filter.ok()) GTEST_SKIP() << filter.error().toString();
    filter_ = std::move(*filter);
    ASSERT_TRUE(filter_->attachTo(dir_).ok());
    prober_ = Prober::start(dir_);
    ASSERT_NE(prober_, nullptr) << "the probe process did not start";
    ASSERT_TRUE(filter_->setNever({{ip("192.0.2.0"), 24}, {ip("203.0.113.0"), 24}}).ok());
    auto policy = parseEgressPolicy(kRules);
    ASSERT_TRUE(policy.ok()) << policy.error().toString();
    ASSERT_TRUE(filter_->setPolicy(prober_->cookie(), *policy, ip(kResolver), ip(kOwn)).ok());
    ASSERT_TRUE(filter_->allowResolved(prober_->cookie(), ip("100.100.1.1"), 8080, 600).ok());
    ASSERT_TRUE(filter_->allowResolved(prober_->cookie(), ip("100.100.1.2"), 0, 600).ok());
    ASSERT_TRUE(filter_->allowResolved(prober_->cookie(), ip("100.100.1.3"), 80, 0).ok());  // expired at once
  }
  void TearDown() override {
    prober_.reset();
    filter_.reset();
    if (!dir_.empty()) EgressFilter::removeIfEmpty(dir_);
  }

  // What the kernel did with a connect: refused by the programs (EPERM), or let on (any other outcome: there
  // is no route out of the namespace, so nothing actually leaves).
  bool kernelAllows(uint32_t address, uint16_t port) {
    const int err = prober_->connectErrno(address, port);
    EXPECT_NE(err, -1) << "the probe process is gone";
    return err != EPERM;
  }

  std::string dir_;
  std::unique_ptr<EgressFilter> filter_;
  std::unique_ptr<Prober> prober_;
};

TEST_F(EgressFilterTest, TheAgentsAnswerIsTheKernelsAndThePolicysForEveryDestination) {
  for (const auto& d : kTable) {
    const bool kernel = kernelAllows(ip(d.address), d.port);
    const bool agent = filter_->allows(prober_->cookie(), ip(d.address), d.port);
    EXPECT_EQ(kernel, d.allowed) << d.address << ":" << d.port << ": the kernel's verdict is not the policy's";
    EXPECT_EQ(agent, kernel) << d.address << ":" << d.port << ": allows() and the programs disagree";
  }
}

TEST_F(EgressFilterTest, APolicyChangeIsSeenAtOnceByBoth) {
  auto narrow = parseEgressPolicy({"10.2.3.4:443"});
  ASSERT_TRUE(narrow.ok());
  ASSERT_TRUE(filter_->setPolicy(prober_->cookie(), *narrow, 0, 0).ok());
  for (const auto& d : kTable) {
    const bool kernel = kernelAllows(ip(d.address), d.port);
    EXPECT_EQ(filter_->allows(prober_->cookie(), ip(d.address), d.port), kernel) << d.address << ":" << d.port;
  }
  EXPECT_TRUE(kernelAllows(ip("10.2.3.4"), 443));
  EXPECT_FALSE(kernelAllows(ip("10.1.5.5"), 22)) << "the old policy's block still opens";
  EXPECT_FALSE(kernelAllows(ip("100.100.1.1"), 8080)) << "the old policy's resolved answer still opens";
  EXPECT_FALSE(kernelAllows(ip(kResolver), 53)) << "a policy without a resolver still reaches one";
  EXPECT_FALSE(kernelAllows(ip(kOwn), 8080)) << "an address that is no longer its own is still open";
}

// An address the node takes becomes unreachable to a policy that covered it, without any policy change, and
// reachable again when the node lets it go.
TEST_F(EgressFilterTest, TheNeverSetFollowsTheNodesAddresses) {
  if (findProgram("ip").empty()) GTEST_SKIP() << "iproute2 (ip) is needed to add a node address";
  std::mt19937 rng(std::random_device{}());
  const std::string address = "198.51.100." + std::to_string(100 + rng() % 150);
  ASSERT_TRUE(kernelAllows(ip(address.c_str()), 80)) << "the policy's block does not cover " << address;
  ASSERT_TRUE(runCommandChecked({"ip", "addr", "add", address + "/32", "dev", "lo"}).ok());
  auto until = [&](bool allowed) {
    for (int i = 0; i < 200; ++i) {
      if (kernelAllows(ip(address.c_str()), 80) == allowed) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    return false;
  };
  const bool closed = until(false);
  const bool agent_closed = !filter_->allows(prober_->cookie(), ip(address.c_str()), 80);
  (void)runCommand({"ip", "addr", "del", address + "/32", "dev", "lo"});
  EXPECT_TRUE(closed) << "a node address added after start stayed reachable under a broad rule";
  EXPECT_TRUE(agent_closed) << "allows() still opens the node's new address";
  EXPECT_TRUE(until(true)) << "the address was left closed after the node let it go";
  // The other never entries stayed in force through both refreshes.
  EXPECT_FALSE(kernelAllows(ip("192.0.2.8"), 1));
  EXPECT_FALSE(kernelAllows(ip("169.254.169.254"), 80));
}

// A sandbox resolving ever new names (a wildcard over a domain it controls) holds at most
// kMaxResolvedPerSandbox addresses open: the ones that run out first make room, and the node's map is not filled
// for the others.
TEST_F(EgressFilterTest, ResolvedAddressesAreCappedPerSandbox) {
  const size_t cap = EgressFilter::kMaxResolvedPerSandbox;
  auto address = [](size_t i) { return ip("100.101.0.0") + static_cast<uint32_t>(i); };
  for (size_t i = 0; i < cap + 44; ++i) {
    // Later answers live longer, so the earliest are the first to go.
    ASSERT_TRUE(filter_->allowResolved(prober_->cookie(), address(i), 80, 600 + static_cast<double>(i)).ok()) << i;
  }
  size_t open = 0;
  for (size_t i = 0; i < cap + 44; ++i) open += filter_->allows(prober_->cookie(), address(i), 80) ? 1 : 0;
  EXPECT_EQ(open, cap) << "resolved addresses held open";
  EXPECT_FALSE(filter_->allows(prober_->cookie(), address(0), 80)) << "the first to run out was kept";
  EXPECT_FALSE(kernelAllows(address(0), 80));
  EXPECT_TRUE(kernelAllows(address(cap + 43), 80)) << "the newest answer was dropped";
  // The answers from the set-up expire before all of these, so they made room too (the expired one first).
  EXPECT_FALSE(kernelAllows(ip("100.100.1.1"), 8080));
}

}  // namespace
}  // namespace dsec::backends
