// The one parser of HTTP endpoints and listen addresses. An endpoint is "host:port", "http://host:port",
// "[v6]:port" or "http://[v6]:port", optionally followed by "/" (a path is ignored); used by the fleet, the CLI
// and the tests' client. A listen address is the same host and port without scheme or path, where the port may
// be 0 and the host may be left out; used by the HTTP server and its flags.
#pragma once

#include <string>
#include <string_view>

#include "dsec/common/Result.h"

namespace dsec {

struct Endpoint {
  std::string host;  // without the brackets of an IPv6 address
  int port = 0;
  // "host:port", or "[host]:port" for an IPv6 address.
  std::string hostPort() const;
};

// default_port 0: the port is required; otherwise it is used when the endpoint names none. Refused (with a
// message quoting the input): an empty host, a port that is not 1-65535, https://, other schemes, an unclosed
// '[', blanks, an IPv6 address without brackets.
Result<Endpoint> parseEndpoint(std::string_view text, int default_port = 0);

// "127.0.0.1:8470", "[::1]:8470", "node-1:8470", and ":8470" for every IPv4 interface (host "0.0.0.0"); port 0
// asks for a free port. Refused like an endpoint, and also: a scheme, a path, a missing port, a port over 65535.
Result<Endpoint> parseListenAddress(std::string_view text);

}  // namespace dsec
