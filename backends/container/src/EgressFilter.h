// The kernel side of sandboxes' egress policies: BPF programs on connect() and sendmsg() (bpf/egress.bpf.c) and
// the maps that hold each sandbox's policy keyed by its network namespace's cookie. Refusals come back through a
// ring buffer and are handed to a sink on the filter's own thread.
//
// Where the programs are attached is the caller's choice (SandboxEgress.cc): on cgroup v2 each sandbox's own cgroup;
// on a v1 host one cgroup2 directory per agent that holds its command spawner, and so every process it starts. No
// directory ever carries two agents' programs for live sandboxes: the programs fail closed (a namespace without a
// policy reaches only its loopback), and attached programs must all allow a connect.
//
// A policy change is one map write: allow entries carry a generation, and the sandbox's entry names the generation
// in force, so a connect sees the old policy or the new one, never a mix. Programs are attached with
// BPF_F_ALLOW_MULTI and outlive the agent (a sandbox outliving its agent keeps its last policy); the next agent
// attaches its own where the sandbox's processes are and detaches the earlier ones (detachOthersOn).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "BpfEventThread.h"
#include "dsec/backends/NetworkPolicy.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"

struct dsec_egress;

namespace dsec::backends {

// An IPv4 block in host order.
struct Ip4Block {
  uint32_t address = 0;
  int prefix_len = 32;
};

class EgressFilter {
 public:
  // Resolved addresses one sandbox holds open at a time (the `resolved` map holds 1M for the node: 4096 sandboxes
  // at the cap). Far above what a task resolves within the answers' lifetimes (30 s to 1 h).
  static constexpr size_t kMaxResolvedPerSandbox = 256;
  using ViolationSink = std::function<void(uint64_t netns_cookie, Violation violation)>;

  // Loads the programs (attached nowhere yet); refusals go to sink.
  static Result<std::unique_ptr<EgressFilter>> start(ViolationSink sink);
  ~EgressFilter();
  EgressFilter(const EgressFilter&) = delete;
  EgressFilter& operator=(const EgressFilter&) = delete;

  // The cgroup2 hierarchy's directory for parent: the v2 tree's own <parent>, or on a v1 host the cgroup2
  // hierarchy mounted beside it (root/unified/<parent>). kUnsupported when there is none.
  static Result<std::string> cgroup2DirFor(int cgroup_version, const std::string& parent,
                                           const std::string& root = "/sys/fs/cgroup");
  // Attaches the programs to a cgroup v2 directory (made if missing): every process below it is judged from now on.
  Status attachTo(const std::string& dir);
  // Forgets a directory attachTo() attached to that went with its sandbox.
  void forgetDir(const std::string& dir);
  // Detaches the dsec egress programs on dir other than this filter's (an earlier agent's); a directory gone is
  // not an error.
  Status detachOthersOn(const std::string& dir);
  // Detaches every dsec egress program from dir and removes it, if no process is left in it (an earlier agent's
  // directory on a v1 host). True when removed.
  static bool removeIfEmpty(const std::string& dir);

  // Addresses no sandbox reaches whatever its policy: the egress subnet (every sandbox's link, both ends), the fleet's
  // gateways and the like. Replaces the previous extra set. The node's own addresses are always added, and kept
  // current as they change (a netlink subscription on the filter's thread); one inside an extra block is covered by
  // it and not listed again, so sandbox links, which come and go with sandboxes, never touch the map.
  Status setNever(const std::vector<Ip4Block>& extra);
  // Installs or replaces a sandbox's policy (domain rules take effect through allowResolved). resolver_ip4 (host
  // order; 0 = none) is where the sandbox may send DNS queries (port 53); own_ip4 (host order; 0 = none) is its
  // own link address, which it always reaches (its own namespace).
  Status setPolicy(uint64_t netns_cookie, const EgressPolicy& policy, uint32_t resolver_ip4, uint32_t own_ip4);
  // Lets a sandbox reach an address its resolver answered for an allowed name, until the answer's TTL runs out.
  Status allowResolved(uint64_t netns_cookie, uint32_t ip4, uint16_t port, double ttl_seconds);
  // What the sandbox's current policy says of a name it asks the resolver for; nullopt when it has no policy.
  std::optional<NameVerdict> verdictFor(uint64_t netns_cookie, const std::string& name);
  // allowResolved for each domain rule of the current policy that covers name (with the rule's port), as one step
  // against a concurrent policy change: a name the new policy does not cover opens nothing.
  Status allowResolvedName(uint64_t netns_cookie, const std::string& name, uint32_t ip4, double ttl_seconds);
  // Forgets a sandbox (destroyed). Its namespace's cookie is never reused.
  void remove(uint64_t netns_cookie);
  // Whether the sandbox's current policy lets it reach ip4:port (host order): the programs' own decision
  // (bpf/EgressDecision.h) on the maps they read. True for a namespace without a policy (not a sandbox of ours).
  bool allows(uint64_t netns_cookie, uint32_t ip4, uint16_t port) const;

 private:
  EgressFilter() = default;
  // Brings the never map to the extra set plus the node's addresses as they are now: new entries first, then
  // the ones that left, so no address is ever open in between.
  Status refreshNever();
  void onAddressChange();
  void deliver(const void* data, size_t size);

  struct SandboxPolicy {
    uint32_t generation = 0;
    EgressPolicy policy;
    std::map<std::pair<uint32_t, uint16_t>, double> resolved;  // (ip4, port) -> expiry (CLOCK_BOOTTIME seconds)
  };
  void eraseEntries(uint64_t netns_cookie, const SandboxPolicy& policy);
  Status installResolved(uint64_t netns_cookie, SandboxPolicy& policy, uint32_t ip4, uint16_t port,
                         double ttl_seconds);  // under mu_
  // Makes room for one more resolved address of the sandbox: drops its expired ones, else its soonest to expire.
  void dropResolved(uint64_t netns_cookie, SandboxPolicy& policy, double now);  // under mu_

  dsec_egress* skeleton_ = nullptr;
  std::vector<std::string> attached_;  // directories attachTo() attached to (under mu_)
  std::vector<uint32_t> program_ids_;
  ViolationSink sink_;
  UniqueFd address_events_;  // netlink: the node's IPv4 addresses changed
  std::mutex mu_;
  std::map<uint64_t, SandboxPolicy> sandboxes_;
  std::mutex never_mu_;                // one refresh at a time, from reading the addresses to the last map write
  std::vector<Ip4Block> extra_never_;  // under never_mu_
  std::set<std::pair<uint32_t, uint32_t>> never_keys_;  // (prefix length, masked address) in the map; never_mu_
  std::unique_ptr<BpfEventThread> events_;              // last: stopped first
};

// The cookie of the network namespace pid is in (SO_NETNS_COOKIE on a socket made there).
Result<uint64_t> netnsCookieOf(int pidfd);
// The cookie of the calling thread's network namespace.
Result<uint64_t> ownNetnsCookie();
// Destroys the TCP sockets (any state) and connected UDP sockets in pid's network namespace whose peer keep()
// refuses (host-order address and port); returns how many. SOCK_DESTROY through sock_diag: the process sees
// ECONNABORTED on its next call.
Result<int> cutSockets(int pidfd, const std::function<bool(uint32_t ip4, uint16_t port)>& keep);

}  // namespace dsec::backends
