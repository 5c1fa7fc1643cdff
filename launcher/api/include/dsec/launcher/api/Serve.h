// The embedded single-node fleet: a node agent plus the HTTP API in one process (`dsec serve`).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "dsec/common/Result.h"
#include "dsec/launcher/api/E2bFront.h"
#include "dsec/launcher/api/HttpServer.h"
#include "dsec/launcher/node/NodeAgent.h"
#include "dsec/launcher/node/RunCode.h"

namespace dsec::launcher {

// The HTTP edge of `dsec serve`: HttpServerOptions's defaults, on 127.0.0.1:8470.
HttpServerOptions defaultServeHttpOptions();

// The smallest node-wide output budget a node accepts (0 is the default budget).
constexpr uint64_t kMinOutputBudget = uint64_t{1} << 20;

// What a node serves with. The flags of `dsec serve` and `dsec-launch` that set it are declared once, in
// NodeOptionTable.h.
struct ServeOptions {
  // The node core: root (layer store, state dir, token), node and fleet name, admission, simulate, fncall,
  // density, CPU QoS, user namespaces (NodeAgent.h). node.root defaults to "" here: the fronts set it.
  NodeOptions node;
  // The HTTP edge: listen ADDR:PORT (port 0 picks a free one), connection budgets and request deadlines
  // (docs/node-agent.md, "Connection budgets").
  HttpServerOptions http = defaultServeHttpOptions();
  // Buffered exec and call output held at once (OutputBudget.h); 0: a sixteenth of the node's memory,
  // between 64 MiB and 1 GiB.
  uint64_t output_budget_bytes = 0;
  // POST /run_code: the image cpp runs in (RunCode.h).
  RunCodeOptions run_code;
  // "ADDR:PORT": a second listener, without authentication, that serves only POST /run_code (RunCodeListener.h;
  // docs/security.md). "" : none.
  std::string run_code_listen;
  // The E2B-compatible listener (E2bFront.h, docs/e2b.md): off while e2b.listen is "".
  E2bOptions e2b;
  bool write_fleet_file = true;  // fleet file ~/.dsec/fleets/<node.fleet_name>.json
};

// A running node: agent + API server on background threads. stop() (or the destructor) stops serving; the
// sandboxes keep running (a restarted node re-adopts them) unless destroySandboxes is true.
class EmbeddedNode {
 public:
  static Result<std::unique_ptr<EmbeddedNode>> start(const ServeOptions& options);
  virtual ~EmbeddedNode() = default;
  virtual std::string endpoint() const = 0;  // "http://127.0.0.1:PORT"
  virtual std::string token() const = 0;
  // "http://127.0.0.1:PORT" of the E2B-compatible listener; "" when it is off.
  virtual std::string e2bEndpoint() const = 0;
  virtual void stop(bool destroy_sandboxes) = 0;
};

// `dsec serve`: runs until SIGINT or SIGTERM, then stops serving and leaves sandboxes running (so a restart
// re-adopts them). Returns an error if it cannot start (port taken, root unusable, ...).
Status serveUntilSignal(const ServeOptions& options);

}  // namespace dsec::launcher
