#include "dsec/backends/NetworkPolicy.h"

#include <arpa/inet.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <set>

namespace dsec::backends {
namespace {

Error ruleError(const std::string& text, const std::string& why) {
  return Error::invalid("egress entry \"" + text + "\": " + why);
}

// "NAME:PORT" -> port; the part before it stays in host. Only the last colon counts (IPv6 is refused anyway).
Result<uint16_t> splitPort(const std::string& text, std::string* host) {
  auto colon = text.rfind(':');
  if (colon == std::string::npos) {
    *host = text;
    return uint16_t{0};
  }
  *host = text.substr(0, colon);
  const std::string port = text.substr(colon + 1);
  if (port.empty() || port.size() > 5 || !std::all_of(port.begin(), port.end(), ::isdigit)) {
    return ruleError(text, "the port must be a number 1..65535");
  }
  int value = std::stoi(port);
  if (value < 1 || value > 65535) return ruleError(text, "the port must be a number 1..65535");
  return static_cast<uint16_t>(value);
}

bool validLabel(const std::string& label) {
  if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') return false;
  return std::all_of(label.begin(), label.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'; });
}

Status parseDomain(const std::string& text, std::string name, EgressRule* rule) {
  if (name.rfind("*.", 0) == 0) {
    rule->wildcard = true;
    name = name.substr(2);
  }
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  if (!name.empty() && name.back() == '.') name.pop_back();
  if (name.empty() || name.size() > 253) return ruleError(text, "not a domain name");
  size_t start = 0;
  int labels = 0;
  while (start <= name.size()) {
    size_t dot = name.find('.', start);
    if (dot == std::string::npos) dot = name.size();
    if (!validLabel(name.substr(start, dot - start))) return ruleError(text, "not a domain name");
    ++labels;
    start = dot + 1;
  }
  if (rule->wildcard && labels < 2) return ruleError(text, "a wildcard needs a name of two labels or more below it");
  rule->domain = name;
  return okStatus();
}

Status parseAddressBlock(const std::string& text, const std::string& host, EgressRule* rule) {
  std::string address = host;
  rule->prefix_len = 32;
  if (auto slash = host.find('/'); slash != std::string::npos) {
    address = host.substr(0, slash);
    const std::string len = host.substr(slash + 1);
    if (len.empty() || len.size() > 2 || !std::all_of(len.begin(), len.end(), ::isdigit) || std::stoi(len) > 32) {
      return ruleError(text, "the prefix length must be 0..32");
    }
    rule->prefix_len = std::stoi(len);
  }
  in_addr parsed{};
  if (inet_pton(AF_INET, address.c_str(), &parsed) != 1) return ruleError(text, "not an IPv4 address");
  const uint32_t value = ntohl(parsed.s_addr);
  const uint32_t mask = rule->prefix_len == 0 ? 0 : ~uint32_t{0} << (32 - rule->prefix_len);
  if ((value & ~mask) != 0) {
    return ruleError(text, "host bits are set past the prefix length (did you mean " +
                               std::to_string(value >> 24 & 0xff) + "." + std::to_string(value >> 16 & 0xff) + "." +
                               std::to_string(value >> 8 & 0xff) + "." + std::to_string(value & 0xff) + " with /32, " +
                               "or the block's first address?)");
  }
  std::copy_n(reinterpret_cast<const uint8_t*>(&parsed.s_addr), 4, rule->address.begin());
  return okStatus();
}

bool looksLikeAddress(const std::string& host) {
  return !host.empty() && std::all_of(host.begin(), host.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == '/';
  });
}

}  // namespace

Result<EgressRule> parseEgressRule(const std::string& text) {
  if (text.empty()) return Error::invalid("egress entry is empty");
  if (text.find('[') != std::string::npos || std::count(text.begin(), text.end(), ':') > 1) {
    return ruleError(text, "IPv6 is not offered: sandboxes have no IPv6 route");
  }
  EgressRule rule;
  std::string host;
  DSEC_ASSIGN_OR_RETURN(rule.port, splitPort(text, &host));
  if (looksLikeAddress(host)) {
    DSEC_TRY(parseAddressBlock(text, host, &rule));
  } else {
    DSEC_TRY(parseDomain(text, host, &rule));
  }
  if (rule.isDomain()) {
    rule.text = (rule.wildcard ? "*." : "") + rule.domain;
  } else {
    char buf[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, rule.address.data(), buf, sizeof buf);
    rule.text = std::string(buf) + (rule.prefix_len == 32 ? "" : "/" + std::to_string(rule.prefix_len));
  }
  if (rule.port != 0) rule.text += ":" + std::to_string(rule.port);
  return rule;
}

Result<EgressPolicy> parseEgressPolicy(const std::vector<std::string>& entries) {
  if (entries.size() > kMaxEgressRules) {
    return Error::invalid("egress: at most " + std::to_string(kMaxEgressRules) + " entries, got " +
                          std::to_string(entries.size()));
  }
  EgressPolicy policy;
  std::set<std::string> seen;
  for (const auto& entry : entries) {
    DSEC_ASSIGN_OR_RETURN(EgressRule rule, parseEgressRule(entry));
    if (seen.insert(rule.text).second) policy.rules.push_back(std::move(rule));
  }
  return policy;
}

std::vector<std::string> EgressPolicy::texts() const {
  std::vector<std::string> out;
  out.reserve(rules.size());
  for (const auto& rule : rules) out.push_back(rule.text);
  return out;
}

bool EgressRule::matchesName(const std::string& name) const {
  if (!isDomain()) return false;
  if (!wildcard) return name == domain;
  return name.size() > domain.size() + 1 && name.compare(name.size() - domain.size(), domain.size(), domain) == 0 &&
         name[name.size() - domain.size() - 1] == '.';
}

NameVerdict EgressPolicy::verdictFor(const std::string& name) const {
  bool any_address = false;
  for (const auto& rule : rules) {
    if (rule.matchesName(name)) return NameVerdict::kAllowed;
    any_address = any_address || (!rule.isDomain() && rule.prefix_len == 0);
  }
  return any_address ? NameVerdict::kAnyAddress : NameVerdict::kDenied;
}

bool EgressPolicy::hasDomains() const {
  return std::any_of(rules.begin(), rules.end(), [](const EgressRule& r) { return r.isDomain(); });
}

Result<std::vector<std::string>> parseProtectedPaths(const std::vector<std::string>& paths) {
  if (paths.size() > kMaxProtectedPaths) {
    return Error::invalid("protect: at most " + std::to_string(kMaxProtectedPaths) + " paths, got " +
                          std::to_string(paths.size()));
  }
  std::set<std::string> out;
  for (const auto& path : paths) {
    if (path.empty() || path[0] != '/') return Error::invalid("protect: \"" + path + "\" is not an absolute path");
    std::string normal;
    size_t start = 1;
    while (start <= path.size()) {
      size_t slash = path.find('/', start);
      if (slash == std::string::npos) slash = path.size();
      const std::string part = path.substr(start, slash - start);
      if (part == "..") return Error::invalid("protect: \"" + path + "\" has a '..' component");
      if (!part.empty() && part != ".") normal += "/" + part;
      start = slash + 1;
    }
    if (normal.empty()) {
      return Error::invalid("protect: \"/\" would protect everything; create the sandbox with a read-only root");
    }
    if (normal.size() > 4096) return Error::invalid("protect: a path is longer than PATH_MAX");
    out.insert(normal);
  }
  return std::vector<std::string>(out.begin(), out.end());
}

namespace {
std::atomic<uint64_t> g_violations[3];
}  // namespace

void countViolation(ViolationKind kind) {
  g_violations[static_cast<int>(kind)].fetch_add(1, std::memory_order_relaxed);
}

uint64_t violationsTotal(ViolationKind kind) {
  return g_violations[static_cast<int>(kind)].load(std::memory_order_relaxed);
}

const char* violationKindName(ViolationKind kind) {
  switch (kind) {
    case ViolationKind::kConnect:
      return "connect";
    case ViolationKind::kDns:
      return "dns";
    case ViolationKind::kFile:
      return "file";
  }
  return "unknown";
}

}  // namespace dsec::backends
