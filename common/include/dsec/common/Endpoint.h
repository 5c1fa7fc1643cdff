// The one parser of HTTP endpoints: "host:port", "http://host:port", "[v6]:port" and "http://[v6]:port",
// optionally followed by "/" (a path is ignored). Used by the fleet, the CLI and the tests' client.
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
// '[', blanks.
Result<Endpoint> parseEndpoint(std::string_view text, int default_port = 0);

}  // namespace dsec
