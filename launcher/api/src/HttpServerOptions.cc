// HttpServerOptions (HttpServer.h): their defaults and checks, and the listen address.
#include <algorithm>

#include "dsec/launcher/api/HttpServer.h"

namespace dsec::launcher {

Result<std::pair<std::string, int>> parseListenAddress(const std::string& listen) {
  std::string host, port;
  if (!listen.empty() && listen[0] == '[') {
    auto close = listen.find(']');
    if (close == std::string::npos || close + 1 >= listen.size() || listen[close + 1] != ':') {
      return Error::invalid("listen address '" + listen + "': expected [ADDR]:PORT");
    }
    host = listen.substr(1, close - 1);
    port = listen.substr(close + 2);
  } else {
    auto colon = listen.rfind(':');
    if (colon == std::string::npos) return Error::invalid("listen address '" + listen + "': expected ADDR:PORT");
    host = listen.substr(0, colon);
    port = listen.substr(colon + 1);
  }
  if (host.empty()) host = "0.0.0.0";
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(port) > 65535) {
    return Error::invalid("listen address '" + listen + "': bad port '" + port + "'");
  }
  return std::make_pair(host, std::stoi(port));
}

int clientConnectionLimit(const HttpServerOptions& options) {
  if (options.max_client_connections > 0) return options.max_client_connections;
  return std::max(1, std::min(64, options.max_connections / 2));
}

Status validateHttpServerOptions(const HttpServerOptions& o) {
  if (o.max_connections <= 0) return Error::invalid("max_connections must be positive");
  if (o.max_client_connections < 0) return Error::invalid("max_client_connections must be >= 0 (0: the default)");
  if (!(o.header_timeout_seconds > 0)) return Error::invalid("the header timeout must be > 0 seconds");
  if (!(o.body_timeout_seconds > 0)) return Error::invalid("the body timeout must be > 0 seconds");
  if (!(o.body_min_rate > 0)) return Error::invalid("the minimum body rate must be > 0 bytes/s");
  if (!(o.client_queue_seconds >= 0)) return Error::invalid("the client queue wait must be >= 0 seconds");
  if (o.idle_timeout_ms <= 0) return Error::invalid("the idle timeout must be > 0");
  return okStatus();
}

}  // namespace dsec::launcher
