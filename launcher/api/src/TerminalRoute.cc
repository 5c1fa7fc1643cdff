// GET /v1/sandboxes/{id}/terminal: a terminal session over WebSocket (docs/api.md, "Terminals").
#include "dsec/launcher/api/ApiServer.h"

namespace dsec::launcher {

void ApiServer::terminal(HttpExchange& ex, const RouteMatch& /*m*/) {
  ex.sendError(501, "unsupported", "terminals are not available yet");
}

}  // namespace dsec::launcher
