// POST /v1/call through the gateway: calls are stateless, so any live node that offers fncall can run one.
// Nodes are taken round robin; a node that answers 429 (no warm worker in time) or does not answer is skipped
// for the next, and only when every node refused does the client get the (last) capacity error.
#include <algorithm>

#include "dsec/backends/BackendKind.h"
#include "dsec/common/Logging.h"
#include "dsec/launcher/api/CallRequests.h"
#include "dsec/launcher/api/Edge.h"
#include "dsec/launcher/api/RunCodeListener.h"
#include "dsec/launcher/api/RunCodeRequests.h"
#include "dsec/launcher/fleet/Gateway.h"

namespace dsec::launcher {
namespace {

using nlohmann::json;
constexpr const char* kLog = "gateway";
constexpr int kCallIoTimeoutMs = 900 * 1000;  // the longest call (600 s) plus time to queue and reply
// The longest run: a sandbox create, compile_timeout and run_timeout (600 s each), plus time to queue and reply.
constexpr int kRunCodeIoTimeoutMs = 1500 * 1000;

}  // namespace

void Gateway::forwardCall(HttpExchange& ex, bool run_code) {
  auto fail = [&](int status, const std::string& code, const std::string& message,
                  const HttpExchange::Fields& extra = {}) {
    if (run_code) return sendRunCodeError(ex, status, code, message, extra);
    ex.sendError(status, code, message, extra, status == 503 && !extra.empty() ? json{{"retry_after", 1}} : json());
  };
  std::optional<std::string> body;
  if (run_code) {
    bool too_large = false;
    auto read = ex.readBody(kRunCodeBodyLimit, &too_large);  // the node's limit (RunCodeRequests.h)
    if (!read.ok()) {
      if (too_large) return fail(413, "too_large", read.error().message());
      if (!ex.broken()) fail(400, "invalid_request", read.error().message());
      return;
    }
    body = std::move(*read);
  } else {
    body = readBodyOrAnswer(ex, kCallBodyLimit);  // the node's limit (CallRequests.h)
    if (!body) return;
  }
  std::vector<NodeRef> nodes;
  size_t live = 0;
  {
    std::lock_guard lock(mu_);
    for (const auto& [name, n] : nodes_) {
      if (n.state == NodeState::kLost) continue;
      ++live;
      const char* fncall = backends::backendKindName(backends::BackendKind::kFncall);
      bool offers = std::find(n.spec.backends.begin(), n.spec.backends.end(), fncall) != n.spec.backends.end();
      if (offers && n.state == NodeState::kHealthy) {
        nodes.push_back(NodeRef{n.spec.name, n.spec.endpoint, n.state, n.last_seen, n.abort_fd});
      }
    }
  }
  if (nodes.empty()) {
    if (live == 0) return fail(503, "unavailable", "no live node in fleet " + options_.fleet_name);
    return fail(501, "unsupported",
                "no healthy node of fleet " + options_.fleet_name + " offers fncall (see GET /v1/node)");
  }
  size_t first = static_cast<size_t>(call_next_.fetch_add(1, std::memory_order_relaxed) % nodes.size());
  std::optional<client::HttpReply> refusal;
  std::string failures;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const NodeRef& node = nodes[(first + i) % nodes.size()];
    // The node's answer goes to the client as it arrives (a call's output can be tens of MiB once escaped):
    // the gateway never holds it whole. Only a 429 is held back, to try the next node.
    std::optional<client::HttpReply> refused;
    int io_timeout_ms = run_code ? kRunCodeIoTimeoutMs : kCallIoTimeoutMs;
    auto st =
        fleet::forward(ex, node.endpoint, options_.token, callOptions(node, io_timeout_ms), &*body, 429, &refused);
    if (!st.ok()) {
      DSEC_LOG(kWarn, kLog) << "call on " << node.name << " failed, trying another node: " << st.error().message();
      failures += (failures.empty() ? "" : "; ") + node.name + ": " + st.error().message();
      watch_cv_.notify_all();  // probe now rather than at the next tick
      continue;
    }
    if (refused) {
      refusal = std::move(*refused);
      continue;
    }
    return;  // relayed (or the client went away meanwhile)
  }
  if (refusal) return relayReply(ex, *refusal);
  fail(503, "unavailable", "no node of fleet " + options_.fleet_name + " answered the call (" + failures + ")",
       {{"Retry-After", "1"}});
}

}  // namespace dsec::launcher
