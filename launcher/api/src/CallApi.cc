// POST /v1/call (docs/api.md, "Function calls"): one stateless call on the node's fncall backend. Part of
// ApiServer, kept in its own file; ApiServer::dispatch routes Op::kCall here.
#include "dsec/backends/fncall/FunctionService.h"
#include "dsec/launcher/api/ApiServer.h"
#include "dsec/launcher/api/CallRequests.h"
#include "dsec/launcher/api/ExecResponse.h"

namespace dsec::launcher {

void ApiServer::call(HttpExchange& ex) {
  auto body = readJsonBody(ex, kCallBodyLimit);
  if (!body) return;
  auto request = parseCallRequest(*body, agent_->nodeMemoryBytes());
  if (!request.ok()) return sendError(ex, request.error());
  NodeFncall* fncall = agent_->fncall();
  if (fncall == nullptr) {
    return sendError(
        ex, Error(ErrorCode::kUnsupported, "fncall is not available on node " + agent_->options().node_name + ": " +
                                               agent_->fncallUnavailableReason()));
  }
  auto result = fncall->call(std::move(*request));
  if (!result.ok()) return sendError(ex, result.error());
  // The result is whole in memory already: it is answered if the output budget has room for it.
  respondWithinBudget(ex, &output_budget_, *result);
}

}  // namespace dsec::launcher
