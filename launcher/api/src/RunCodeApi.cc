// POST /run_code (docs/api.md, "SandboxFusion-compatible /run_code"): one program run as SandboxFusion runs it.
// Part of ApiServer, kept in its own file: ApiServer::dispatch routes Op::kRunCode here, and the node's optional
// listener without authentication (RunCodeListener, --run-code-listen) calls it too. Every answer, errors
// included, has SandboxFusion's shape (RunCodeRequests.h).
#include "dsec/launcher/api/ApiServer.h"
#include "dsec/launcher/api/Edge.h"
#include "dsec/launcher/api/ExecResponse.h"
#include "dsec/launcher/api/Requests.h"
#include "dsec/launcher/api/RunCodeListener.h"
#include "dsec/launcher/api/RunCodeRequests.h"

namespace dsec::launcher {

void sendRunCodeError(HttpExchange& ex, int status, const std::string& code, const std::string& message,
                      const HttpExchange::Fields& extra) {
  HttpExchange::Fields fields = extra;
  nlohmann::json body = runCodeErrorJson(code, message);
  if (status == 429 || status == 503) {
    if (fields.empty()) fields.emplace_back("Retry-After", "1");
    body["error"]["retry_after"] = 1;
  }
  ex.sendJson(status, body, fields);
}

namespace {

void sendRunCodeError(HttpExchange& ex, const Error& error) {
  auto [status, code] = httpStatusFor(error.code());
  sendRunCodeError(ex, status, code, error.message());
}

uint64_t resultBytes(const RunCodeResult& r) {
  uint64_t n = 0;
  for (const auto* o : {r.compile ? &*r.compile : nullptr, r.run ? &*r.run : nullptr}) {
    if (o) n += o->stdout_data.size() + o->stderr_data.size();
  }
  for (const auto& [path, bytes] : r.files) n += path.size() + bytes.size() * 4 / 3;
  return n;
}

}  // namespace

void ApiServer::runCode(HttpExchange& ex) {
  bool too_large = false;
  auto text = ex.readBody(kRunCodeBodyLimit, &too_large);
  if (!text.ok()) {
    if (too_large) return sendRunCodeError(ex, 413, "too_large", text.error().message());
    if (!ex.broken()) sendRunCodeError(ex, text.error());
    return;
  }
  auto body = parseJsonObject(*text);
  if (!body.ok()) return sendRunCodeError(ex, body.error());
  auto request = parseRunCodeRequest(*body, agent_->nodeMemoryBytes());
  if (!request.ok()) return sendRunCodeError(ex, request.error());
  auto result = launcher::runCode(*agent_, run_code_, *request);
  if (!result.ok()) return sendRunCodeError(ex, result.error());
  // The result is whole in memory: it is answered if the node's output budget has room for it.
  auto share = output_budget_.open(nullptr);
  uint64_t bytes = resultBytes(*result);
  OutputBudget::Take taken = share->take(bytes);
  if (taken != OutputBudget::Take::kOk) {
    return sendBudgetRefusal(ex, taken, bytes, output_budget_.capacity(), "the run's result was dropped");
  }
  share->seal();
  ex.sendJson(200, runCodeResponseJson(*result, agent_->options().node_name));
}

void RunCodeListener::handle(HttpExchange& ex) {
  // Only POST /run_code: nothing else of the API is reachable here, with or without a token.
  std::string_view target = ex.target();
  std::string_view path = target.substr(0, target.find('?'));
  if (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  if (path != "/run_code") {
    return sendRouteError(ex, 404, "no route " + std::string(path) + " (this listener serves only POST /run_code)", "");
  }
  if (ex.method() != boost::beast::http::verb::post) {
    return sendRouteError(ex, 405, "method not allowed on /run_code (allowed: POST)", "POST");
  }
  dispatchGuarded(ex, "run_code", [&] { serve_(ex); });
}

}  // namespace dsec::launcher
