#include "dsec/common/Endpoint.h"

#include <arpa/inet.h>

#include "dsec/common/Strings.h"

namespace dsec {

std::string Endpoint::hostPort() const {
  std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return h + ":" + std::to_string(port);
}

Result<Endpoint> parseEndpoint(std::string_view text, int default_port) {
  auto bad = [&](const std::string& why) {
    return Error::invalid("endpoint '" + std::string(text) + "': " + why + " (expected http://HOST:PORT)");
  };
  std::string_view rest = text;
  if (startsWith(rest, "https://")) return Error(ErrorCode::kUnsupported, "https endpoints are not supported yet");
  if (startsWith(rest, "http://")) rest.remove_prefix(7);
  if (rest.find("://") != std::string_view::npos) return bad("unknown scheme");
  if (auto slash = rest.find('/'); slash != std::string_view::npos) rest = rest.substr(0, slash);
  if (rest.find_first_of(" \t\r\n") != std::string_view::npos) return bad("blanks");
  Endpoint ep;
  std::string_view port;
  bool has_port = false;
  bool bracketed = !rest.empty() && rest[0] == '[';
  if (bracketed) {
    auto close = rest.find(']');
    if (close == std::string_view::npos) return bad("unclosed '['");
    ep.host = std::string(rest.substr(1, close - 1));
    std::string_view after = rest.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') return bad("junk after ']'");
      port = after.substr(1);
      has_port = true;
    }
  } else {
    auto colon = rest.rfind(':');
    if (colon != std::string_view::npos) {
      if (rest.find(':') != colon) return bad("an IPv6 address needs brackets");
      ep.host = std::string(rest.substr(0, colon));
      port = rest.substr(colon + 1);
      has_port = true;
    } else {
      ep.host = std::string(rest);
    }
  }
  if (ep.host.empty()) return bad("no host");
  if (bracketed) {
    in6_addr v6{};
    if (::inet_pton(AF_INET6, ep.host.c_str(), &v6) != 1) return bad("'" + ep.host + "' is not an IPv6 address");
  } else if (ep.host.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-_") !=
             std::string::npos) {
    // No user@, no percent-encoding, no control characters: a host name or an IPv4 address only.
    return bad("host '" + ep.host + "' has a character a host name cannot have");
  }
  if (!has_port) {
    if (default_port <= 0) return bad("no port");
    ep.port = default_port;
    return ep;
  }
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string_view::npos) {
    return bad("port '" + std::string(port) + "' is not a number");
  }
  ep.port = std::stoi(std::string(port));
  if (ep.port < 1 || ep.port > 65535) return bad("port " + std::to_string(ep.port) + " is out of range");
  return ep;
}

}  // namespace dsec
