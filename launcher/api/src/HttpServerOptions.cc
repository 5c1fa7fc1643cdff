// HttpServerOptions (HttpServer.h): their defaults and checks.
#include <algorithm>

#include "dsec/launcher/api/HttpServer.h"

namespace dsec::launcher {

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
