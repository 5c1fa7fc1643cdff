#include "dsec/common/Endpoint.h"

#include <arpa/inet.h>

#include <functional>

#include "dsec/common/Strings.h"

namespace dsec {
namespace {

// Builds the refusal of one input: what is wrong with it, quoting it.
using Complaint = std::function<Error(const std::string& why)>;

// What an endpoint and a listen address differ in.
struct EndpointRules {
  bool listen = false;  // no scheme or path; port 0 and an empty host (every interface) allowed
  int default_port = 0;
};

// "host:port" or "[v6]:port" (or either without ":port"): the host as written, the port text.
struct HostAndPort {
  std::string host;
  bool bracketed = false;
  bool has_port = false;
  std::string_view port;
};

Result<HostAndPort> splitHostPort(std::string_view rest, const Complaint& bad) {
  HostAndPort split;
  split.bracketed = !rest.empty() && rest[0] == '[';
  if (split.bracketed) {
    auto close = rest.find(']');
    if (close == std::string_view::npos) return bad("unclosed '['");
    split.host = std::string(rest.substr(1, close - 1));
    std::string_view after = rest.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') return bad("junk after ']'");
      split.port = after.substr(1);
      split.has_port = true;
    }
    return split;
  }
  auto colon = rest.rfind(':');
  if (colon == std::string_view::npos) {
    split.host = std::string(rest);
    return split;
  }
  if (rest.find(':') != colon) return bad("an IPv6 address needs brackets");
  split.host = std::string(rest.substr(0, colon));
  split.port = rest.substr(colon + 1);
  split.has_port = true;
  return split;
}

Status checkHost(const HostAndPort& split, const Complaint& bad) {
  if (split.bracketed) {
    in6_addr v6{};
    if (::inet_pton(AF_INET6, split.host.c_str(), &v6) != 1) return bad("'" + split.host + "' is not an IPv6 address");
  } else if (split.host.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-_") !=
             std::string::npos) {
    // No user@, no percent-encoding, no control characters: a host name or an IPv4 address only.
    return bad("host '" + split.host + "' has a character a host name cannot have");
  }
  return okStatus();
}

Result<int> parsePort(std::string_view port, const EndpointRules& rules, const Complaint& bad) {
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string_view::npos) {
    return bad("port '" + std::string(port) + "' is not a number");
  }
  int number = std::stoi(std::string(port));
  if (number < (rules.listen ? 0 : 1) || number > 65535) {
    return bad("port " + std::to_string(number) + " is out of range");
  }
  return number;
}

Result<Endpoint> parse(std::string_view text, const EndpointRules& rules) {
  const std::string what = rules.listen ? "listen address" : "endpoint";
  const std::string expected = rules.listen ? "ADDR:PORT" : "http://HOST:PORT";
  Complaint bad = [&](const std::string& why) {
    return Error::invalid(what + " '" + std::string(text) + "': " + why + " (expected " + expected + ")");
  };
  std::string_view rest = text;
  if (rules.listen) {
    if (rest.find("://") != std::string_view::npos) return bad("a listen address has no scheme");
    if (rest.find('/') != std::string_view::npos) return bad("a listen address has no path");
  } else {
    if (startsWith(rest, "https://")) return Error(ErrorCode::kUnsupported, "https endpoints are not supported yet");
    if (startsWith(rest, "http://")) rest.remove_prefix(7);
    if (rest.find("://") != std::string_view::npos) return bad("unknown scheme");
    if (auto slash = rest.find('/'); slash != std::string_view::npos) rest = rest.substr(0, slash);
  }
  if (rest.find_first_of(" \t\r\n") != std::string_view::npos) return bad("blanks");
  DSEC_ASSIGN_OR_RETURN(HostAndPort split, splitHostPort(rest, bad));
  Endpoint ep;
  if (split.host.empty()) {
    // ":8470" listens on every interface; "[]:8470" names no address at all.
    if (!rules.listen || split.bracketed || !split.has_port) return bad("no host");
    split.host = "0.0.0.0";
  }
  DSEC_TRY(checkHost(split, bad));
  ep.host = std::move(split.host);
  if (!split.has_port) {
    if (rules.default_port <= 0) return bad("no port");
    ep.port = rules.default_port;
    return ep;
  }
  DSEC_ASSIGN_OR_RETURN(ep.port, parsePort(split.port, rules, bad));
  return ep;
}

}  // namespace

std::string Endpoint::hostPort() const {
  std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return h + ":" + std::to_string(port);
}

Result<Endpoint> parseEndpoint(std::string_view text, int default_port) {
  return parse(text, EndpointRules{.listen = false, .default_port = default_port});
}

Result<Endpoint> parseListenAddress(std::string_view text) { return parse(text, EndpointRules{.listen = true}); }

}  // namespace dsec
