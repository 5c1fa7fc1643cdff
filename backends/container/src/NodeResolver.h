// The node-local DNS resolver of sandboxes with a network link. Each query is tied to its sandbox by its source
// address (the sandbox's eth0: strict reverse-path filtering on its link and the node's nftables rules keep a
// sandbox to its own address), checked against the sandbox's egress policy, and then:
//   - a name a domain rule covers is forwarded upstream; every A record of the answer (the name's own and those
//     at the end of its CNAME chain) is opened for the sandbox in its BPF map for the record's TTL, held between
//     kMinTtl and kMaxTtl, before the answer is relayed (so a connect right after the answer finds it open);
//   - a name no rule covers is answered REFUSED and recorded as a violation (kind dns) of the sandbox, unless an
//     address rule covers every address (0.0.0.0/0): then it is resolved and opens nothing;
//   - AAAA questions of names that may be resolved get an empty answer (NOERROR, no records): sandboxes have no
//     IPv6 route, and clients then use the A answer at once.
// Queries from an address no sandbox holds are dropped without an answer. Upstream failures and timeouts
// (kUpstreamTimeout) are SERVFAIL; at most kMaxInFlightPerSandbox queries of one sandbox (kMaxInFlight in all)
// wait upstream at a time, each on its own connected socket with a random ID: over that, SERVFAIL at once. UDP
// only: an answer larger than the client's UDP size comes back truncated (TC) from upstream, and the retry over
// TCP finds nothing listening.
//
// The resolver listens on an address of the node's `lo` taken from a small reserved block of the egress subnet
// (EgressNetwork::resolverAddresses): the first one it can bind port 53 on. Binding is exclusive (no
// SO_REUSEADDR/SO_REUSEPORT): several agents (or backends of one process) on one node each get their own address,
// and nobody else can take a bound one's queries. Port 53 is privileged, so only root binds these at all.
// One thread, a poll loop.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dsec/backends/NetworkPolicy.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"

namespace dsec::backends {

struct Ip4Endpoint {
  uint32_t ip4 = 0;  // host order; 0 = none
  uint16_t port = 53;
};

// "ADDR" or "ADDR:PORT" (IPv4).
Result<Ip4Endpoint> parseIp4Endpoint(const std::string& text);
// The first IPv4 nameserver of a resolv.conf; ip4 0 if it names none.
Ip4Endpoint firstNameserver(const std::string& resolv_conf_text);

class NodeResolver {
 public:
  static constexpr double kMinTtl = 30;    // seconds an answer's address stays open at least
  static constexpr double kMaxTtl = 3600;  // and at most (the sandbox asks again after that)
  static constexpr double kUpstreamTimeout = 3;
  static constexpr int kMaxInFlightPerSandbox = 16;
  static constexpr int kMaxInFlight = 256;

  // How the resolver learns about sandboxes (called on its thread).
  struct Hooks {
    // The network namespace cookie of the sandbox whose eth0 has this address (host order); 0 = none.
    std::function<uint64_t(uint32_t source_ip4)> sandbox_of;
    // Its policy's verdict on a name; nullopt when it has none (any more).
    std::function<std::optional<NameVerdict>(uint64_t cookie, const std::string& name)> verdict;
    // Opens ip4 for the sandbox for ttl seconds, under the rules that cover name.
    std::function<Status(uint64_t cookie, const std::string& name, uint32_t ip4, double ttl)> allow;
    // Records a refused name.
    std::function<void(uint64_t cookie, Violation violation)> report;
  };

  // Binds UDP port 53 on the first of `addresses` it can (add_address puts each on the node first) and starts the
  // thread. kUnavailable when every address is taken.
  static Result<std::unique_ptr<NodeResolver>> start(const std::vector<uint32_t>& addresses,
                                                     const std::function<Status(uint32_t)>& add_address,
                                                     Ip4Endpoint upstream, Hooks hooks);
  ~NodeResolver();
  NodeResolver(const NodeResolver&) = delete;
  NodeResolver& operator=(const NodeResolver&) = delete;

  uint32_t address() const { return address_; }  // host order
  // Also serves on address (sandboxes adopted from an agent that used it); fine if already served here.
  Status alsoServe(uint32_t address);

 private:
  struct Pending {
    UniqueFd upstream;
    uint64_t cookie = 0;
    int listener = -1;  // the socket the query came in on (the answer goes out from the same address)
    uint32_t client_ip4 = 0;
    uint16_t client_port = 0;
    uint16_t client_id = 0;
    uint16_t upstream_id = 0;
    bool opens = false;  // NameVerdict::kAllowed: the answer's addresses are opened
    std::vector<uint8_t> query;
    double deadline = 0;
  };

  NodeResolver(Ip4Endpoint upstream, Hooks hooks) : upstream_(upstream), hooks_(std::move(hooks)) {}
  static Result<UniqueFd> bindUdp(uint32_t address);
  void run();
  void readQueries(int listener);
  void handleQuery(int listener, uint32_t ip4, uint16_t port, std::vector<uint8_t> query);
  void forward(int listener, uint32_t ip4, uint16_t port, std::vector<uint8_t> query, uint64_t cookie, bool opens);
  void finish(Pending& pending);  // reads the upstream's answer and replies
  void reply(int listener, uint32_t ip4, uint16_t port, const std::vector<uint8_t>& message);

  const Ip4Endpoint upstream_;
  const Hooks hooks_;
  uint32_t address_ = 0;
  UniqueFd wake_;  // eventfd: stop, or a new listener
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::map<uint32_t, UniqueFd> listeners_;  // address -> bound socket (under mu_; the thread reads a copy)
  // The thread's own state.
  std::vector<std::unique_ptr<Pending>> pending_;
  std::map<uint64_t, int> in_flight_;  // per sandbox
};

}  // namespace dsec::backends
