// Network "egress": a sandbox gets its own network namespace with one veth to the node, routed and masqueraded out
// through the node's uplink. The node itself (every address of it: the agent, the gateway, Slurm, any service on
// loopback or elsewhere), other sandboxes, link-local (metadata) addresses and IPv6 are out of reach; nothing from
// outside can open a connection in. Enforced by one nftables table the backend installs on first use.
//
// Each sandbox's link is `dsv<N>` on the node and `eth0` inside, with a /30 of the egress subnet (N-th block:
// node .1, sandbox .2). The subnet's first /28 is never a link: it holds the node's resolver addresses (on `lo`,
// NodeResolver.h), the only place on the node a sandbox may send to (UDP port 53). The kernel's interface names make N
// unique on the node across every agent, and the link goes when the sandbox's network namespace does (its last process
// gone), so nothing needs releasing.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dsec/common/Result.h"

namespace dsec::backends {

struct EgressLink {
  std::string address;  // the sandbox's, e.g. "100.64.0.6"
  std::string gateway;  // the node end, e.g. "100.64.0.5"
  std::string netmask = "255.255.255.252";
  std::string resolver;  // the node's resolver the sandbox asks (its /etc/resolv.conf), e.g. "100.64.0.1"
};

class EgressNetwork {
 public:
  // subnet: "A.B.C.D/len" (len 8..27), carved into /30s.
  explicit EgressNetwork(std::string subnet);
  // Installs the node's rules and turns on forwarding (once; idempotent across agents).
  Status prepare();
  // Creates the link of the sandbox whose init is pid (eth0 inside is configured by init; see InitProtocol.h).
  Result<EgressLink> attach(pid_t init_pid);
  // What the host lacks for egress ("" when usable); does not change the host.
  static std::string supportProblem();
  // Where resolvers may listen (host order): the first /28 of the subnet but its first and last address.
  Result<std::vector<uint32_t>> resolverAddresses();
  // The whole subnet (host-order base, prefix length): every sandbox link's two ends and the resolvers are in it.
  Result<std::pair<uint32_t, int>> block();
  // Puts address/32 on the node's `lo` (already there is fine). It stays when the agent goes: other agents may
  // serve on it, and it is only reachable from sandboxes (port 53) and the node.
  static Status addNodeAddress(uint32_t address);

 private:
  Status parseSubnet();

  const std::string subnet_;
  uint32_t base_ = 0;    // host order
  uint32_t blocks_ = 0;  // /30s in the subnet
  int prefix_len_ = 0;
  static constexpr uint32_t kResolverBlocks = 4;  // the first /28: resolver addresses, never a link
  std::mutex mu_;
  bool prepared_ = false;
  uint32_t next_ = 0;
};

}  // namespace dsec::backends
