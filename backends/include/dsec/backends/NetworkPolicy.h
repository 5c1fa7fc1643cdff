// What a sandbox may reach (its egress policy) and what its processes may not change (protected paths), and the
// record of what it tried anyway (violations). Typed here; JSON only at the API edge.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "dsec/common/Result.h"

namespace dsec::backends {

// One allowed destination: an address block or a domain name, each with an optional port.
//   "10.0.0.0/8"   "192.0.2.1:443"   "10.1.0.0/16:8080"   "pypi.org:443"   "*.pythonhosted.org"
// A domain reaches the addresses the node's resolver gave the sandbox for that name (until the answer's TTL
// runs out); "*.NAME" allows every name below NAME, not NAME itself.
struct EgressRule {
  std::string text;                  // as written, normalised ("10.0.0.0/8:443", "pypi.org")
  std::string domain;                // lower case, without "*."; "" for an address rule
  bool wildcard = false;             // "*.NAME"
  std::array<uint8_t, 4> address{};  // network address (IPv4, network byte order), address rules only
  int prefix_len = 0;                // 0..32
  uint16_t port = 0;                 // 0 = any port

  bool isDomain() const { return !domain.empty(); }
  // Whether a domain rule covers `name` (lower case, no trailing dot): the name itself, or for "*.NAME" every
  // name strictly below NAME.
  bool matchesName(const std::string& name) const;
};

// What the node's resolver does with a name a sandbox asks for.
enum class NameVerdict {
  kDenied,      // answered REFUSED and recorded: no rule covers it
  kAllowed,     // a domain rule covers it: resolved, and the answer's addresses opened for the sandbox
  kAnyAddress,  // no domain rule, but an address rule covers every address (0.0.0.0/0): resolved, nothing opened
};

// The whole policy; no rules = no egress at all (the default). Addresses of the node itself (every address of
// every interface, the agent, the gateway, Slurm), link-local (metadata) addresses and other sandboxes are never
// reachable, whatever the rules say.
struct EgressPolicy {
  std::vector<EgressRule> rules;

  std::vector<std::string> texts() const;
  bool hasDomains() const;
  NameVerdict verdictFor(const std::string& name) const;
};

// Parses one entry; kInvalidArgument naming the entry and what is wrong with it. IPv6 is refused (sandboxes have
// no IPv6 route), as are address blocks with host bits set ("10.0.0.1/8": ambiguous).
Result<EgressRule> parseEgressRule(const std::string& text);
// At most kMaxEgressRules entries.
Result<EgressPolicy> parseEgressPolicy(const std::vector<std::string>& entries);
inline constexpr size_t kMaxEgressRules = 256;

// Protected paths: absolute, normalised ("/workspace/tests", "/usr"); at most kMaxProtectedPaths; "/" itself is
// refused (use a read-only root). Returns them normalised, deduplicated, sorted.
Result<std::vector<std::string>> parseProtectedPaths(const std::vector<std::string>& paths);
inline constexpr size_t kMaxProtectedPaths = 64;

enum class ViolationKind { kConnect, kDns, kFile };
inline constexpr ViolationKind kViolationKinds[] = {ViolationKind::kConnect, ViolationKind::kDns, ViolationKind::kFile};
const char* violationKindName(ViolationKind kind);
// Refusals recorded by this process since it started, per kind (/metrics: dsec_violations_total{kind}).
void countViolation(ViolationKind kind);
uint64_t violationsTotal(ViolationKind kind);

// One thing a sandbox's processes tried and were refused.
struct Violation {
  double time_unix = 0;  // seconds since the epoch
  ViolationKind kind = ViolationKind::kConnect;
  std::string target;  // "192.0.2.9:443" | "evil.example" | "/workspace/tests/test_x.py"
  std::string detail;  // "tcp connect not in policy" | "name not in policy" | "unlinkat: read-only (protected)"
};

}  // namespace dsec::backends
