// The node API's handlers (ApiServer.h) by what they act on: the node, a sandbox's lifecycle, sessions. Exec is
// in ExecRoute.cc, files and tar in FileRoutes.cc, POST /v1/call in CallApi.cc; the JSON of what the node core
// reports comes from NodeJson.h.
#include "dsec/launcher/api/ApiServer.h"

#include "dsec/common/Logging.h"
#include "dsec/common/Prometheus.h"
#include "dsec/launcher/api/NodeJson.h"
#include "dsec/launcher/api/PolicyRequests.h"
#include "dsec/launcher/api/Requests.h"

namespace dsec::launcher {
namespace {

using nlohmann::json;

}  // namespace

ApiServer::ApiServer(NodeAgent* agent, std::string token, const ApiServerOptions& options)
    : agent_(agent),
      token_(std::move(token)),
      output_budget_(options.output_budget_bytes > 0
                         ? options.output_budget_bytes
                         : defaultOutputBudget(static_cast<uint64_t>(std::max<int64_t>(0, agent->nodeMemoryBytes()))),
                     options.output_wait_seconds),
      run_code_(options.run_code) {}

void ApiServer::renderMetrics(std::string* out) {
  OutputBudget::Stats b = output_budget_.stats();
  auto line = [out](const char* type, const char* name, uint64_t v) {
    prometheus::family(out, name, type);
    prometheus::sample(out, name, prometheus::number(v));
  };
  line("gauge", "dsec_output_budget_bytes", b.capacity);
  line("gauge", "dsec_output_budget_used_bytes", b.used);
  line("gauge", "dsec_output_budget_peak_bytes", b.peak);
  line("gauge", "dsec_output_budget_responses", b.shares);
  line("counter", "dsec_output_budget_refusals_total", b.refusals);
  line("counter", "dsec_output_budget_too_large_total", b.too_large);
  line("counter", "dsec_output_budget_evictions_total", b.evictions);
  if (const HttpServer* http = transport()) http->renderMetrics(out);
}

json ApiServer::nodeInfo() {
  json info = toJson(agent_->nodeInfo());
  if (NodeFncall* fncall = agent_->fncall()) info["fncall"] = fncallJson(*fncall);
  OutputBudget::Stats b = output_budget_.stats();
  info["output_budget"] = json{{"capacity_bytes", b.capacity}, {"used_bytes", b.used},   {"peak_bytes", b.peak},
                               {"responses", b.shares},        {"refusals", b.refusals}, {"too_large", b.too_large},
                               {"evictions", b.evictions}};
  if (const HttpServer* http = transport()) info["http"] = http->info();
  return info;
}

bool ApiServer::acceptsCredentials(std::string_view value) const { return bearerTokenMatches(value, token_); }

void ApiServer::handle(HttpExchange& ex) {
  RouteMatch m = matchRoute(ex.method(), ex.target());
  RouteGate gate{m.error_status == 0 && m.op == Op::kHealthz, m.error_status, m.error, m.allow};
  if (!admitRequest(ex, token_, gate)) return;
  dispatchGuarded(ex, opName(m.op), [&] { dispatch(ex, m); });
}

void ApiServer::dispatch(HttpExchange& ex, const RouteMatch& m) {
  if (bodyKind(m.op) == BodyKind::kNone) ex.discardBody(kDiscardLimit);
  if (!m.session.empty() || m.op == Op::kListSessions) return dispatchSession(ex, m);
  if (m.op == Op::kListSnapshots || m.op == Op::kGetSnapshot || m.op == Op::kDeleteSnapshot ||
      m.op == Op::kSnapshotSandbox || m.op == Op::kForkSandbox) {
    return dispatchSnapshot(ex, m);  // SnapshotRoutes.cc
  }
  if (!m.sandbox_id.empty()) return dispatchSandbox(ex, m);
  dispatchNode(ex, m);
}

void ApiServer::dispatchNode(HttpExchange& ex, const RouteMatch& m) {
  switch (m.op) {
    case Op::kHealthz:
      ex.sendJson(200,
                  {{"status", "ok"}, {"fleet", agent_->options().fleet_name}, {"node", agent_->options().node_name}});
      return;
    case Op::kMetrics: {
      std::string text = agent_->metrics().render();
      renderMetrics(&text);
      sendMetrics(ex, std::move(text));
      return;
    }
    case Op::kNodeInfo:
      ex.sendJson(200, nodeInfo());
      return;
    case Op::kListLayers: {
      auto layers = agent_->layers();
      if (!layers.ok()) return sendError(ex, layers.error());
      ex.sendJson(200, layerListJson(*layers));
      return;
    }
    case Op::kListSandboxes: {
      auto want = parseLabelSelectors(m.query.all("label"));
      if (!want.ok()) return sendError(ex, want.error());
      ex.sendJson(200, sandboxListJson(agent_->list(*want)));
      return;
    }
    case Op::kCreateSandbox:
      return createSandbox(ex);
    case Op::kCall:
      return call(ex);
    case Op::kRunCode:
      return runCode(ex);
    default:
      ex.sendError(404, "not_found", "no route");
  }
}

void ApiServer::dispatchSandbox(HttpExchange& ex, const RouteMatch& m) {
  const std::string& id = m.sandbox_id;
  switch (m.op) {
    case Op::kGetSandbox: {
      auto info = agent_->info(id);
      if (!info.ok()) return sendError(ex, info.error());
      ex.sendJson(200, toJson(*info));
      return;
    }
    case Op::kDestroySandbox: {
      auto st = agent_->destroy(id);
      if (!st.ok()) return sendError(ex, st.error());
      ex.sendJson(200, {{"id", id}, {"destroyed", true}});
      return;
    }
    case Op::kPause:
    case Op::kResume: {
      auto info = m.op == Op::kPause ? agent_->pause(id) : agent_->resume(id);
      if (!info.ok()) return sendError(ex, info.error());
      ex.sendJson(200, toJson(*info));
      return;
    }
    case Op::kSetNetwork:
    case Op::kSetProtect:
    case Op::kViolations:
      return sandboxPolicy(ex, m);
    case Op::kSetTimeout: {
      auto body = readJsonBody(ex, kJsonBodyLimit);
      if (!body) return;
      if (!body->is_object() || !body->contains("timeout") || body->size() != 1) {
        return sendError(ex, Error::invalid("the body is {\"timeout\": SECONDS from now (0: none)}"));
      }
      auto seconds = parseDurationField((*body)["timeout"], "timeout");
      if (!seconds.ok()) return sendError(ex, seconds.error());
      auto info = agent_->setTimeout(id, *seconds);
      if (!info.ok()) return sendError(ex, info.error());
      ex.sendJson(200, toJson(*info));
      return;
    }
    case Op::kExec:
      return exec(ex, id, false);
    case Op::kExecStream:
      return exec(ex, id, true);
    case Op::kExecStdin: {
      const std::string eof = m.query.get("eof", "false");
      if (eof != "true" && eof != "false" && eof != "1" && eof != "0") {
        ex.discardBody(kStdinBufferLimit);
        return ex.sendError(400, "invalid", "eof: expected true or false, got '" + eof + "'");
      }
      return execStdin(ex, id, m.sub_id, eof == "true" || eof == "1");
    }
    case Op::kExecSignal:
      return execSignal(ex, id, m.sub_id);
    case Op::kTerminal:
      return terminal(ex, m);
    case Op::kReadFile:
      return readFile(ex, m);
    case Op::kWriteFile:
      return writeFile(ex, m);
    case Op::kGetTar:
      return getTar(ex, m);
    case Op::kPutTar:
      return putTar(ex, m);
    case Op::kRemoveFile:
    case Op::kListDir:
    case Op::kStatFile:
      return fileOp(ex, m);
    default:
      ex.sendError(404, "not_found", "no route");
  }
}

void ApiServer::dispatchSession(HttpExchange& ex, const RouteMatch& m) {
  switch (m.op) {
    case Op::kListSessions:
      ex.sendJson(200, sessionListJson(agent_->listSessions()));
      return;
    case Op::kGetSession: {
      auto session = agent_->getSession(m.session);
      if (!session.ok()) return sendError(ex, session.error());
      ex.sendJson(200, toJson(*session));
      return;
    }
    case Op::kDeleteSession: {
      auto deleted = agent_->deleteSession(m.session);
      if (!deleted.ok()) return sendError(ex, deleted.error());
      ex.sendJson(200, toJson(*deleted));
      return;
    }
    case Op::kPutSession:
    case Op::kAttachSession: {
      // Both bodies are optional: no body (or an empty one) means "all defaults".
      auto body = readJsonBody(ex, kJsonBodyLimit, EmptyBody::kEmptyObject);
      if (!body) return;
      bool put = m.op == Op::kPutSession;
      auto settings = parseSessionSettings(*body, /*allow_retention=*/put);
      if (!settings.ok()) return sendError(ex, settings.error());
      if (put) {
        auto session = agent_->putSession(m.session, *settings);
        if (!session.ok()) return sendError(ex, session.error());
        return ex.sendJson(200, toJson(*session));
      }
      auto attached = agent_->attachSession(m.session, settings->lease);
      if (!attached.ok()) return sendError(ex, attached.error());
      ex.sendJson(200, toJson(*attached));
      return;
    }
    default:
      ex.sendError(404, "not_found", "no route");
  }
}

void ApiServer::sandboxPolicy(HttpExchange& ex, const RouteMatch& m) {
  const std::string& id = m.sandbox_id;
  if (m.op == Op::kViolations) {
    auto violations = agent_->violations(id);
    if (!violations.ok()) return sendError(ex, violations.error());
    ex.sendJson(200, violationsJson(*violations));
    return;
  }
  auto body = readJsonBody(ex, kJsonBodyLimit);
  if (!body) return;
  Result<SandboxInfo> info = Error::internal("unreachable");
  if (m.op == Op::kSetNetwork) {
    auto policy = parseNetworkBody(*body);
    if (!policy.ok()) return sendError(ex, policy.error());
    info = agent_->setEgress(id, *policy);
  } else {
    auto paths = parseProtectBody(*body);
    if (!paths.ok()) return sendError(ex, paths.error());
    info = agent_->setProtectedPaths(id, *paths);
  }
  if (!info.ok()) return sendError(ex, info.error());
  ex.sendJson(200, toJson(*info));
}

void ApiServer::createSandbox(HttpExchange& ex) {
  auto body = readJsonBody(ex, kJsonBodyLimit);
  if (!body) return;
  if (body->is_object() && body->contains("snapshot")) return restoreSandbox(ex, *body);  // SnapshotRoutes.cc
  auto params = parseCreateRequest(*body, agent_->nodeMemoryBytes());
  if (!params.ok()) {
    agent_->metrics().create_failures_total++;
    return sendError(ex, params.error());
  }
  auto info = agent_->create(*params);
  if (!info.ok()) return sendError(ex, info.error());
  ex.sendJson(201, toJson(*info));
}

}  // namespace dsec::launcher
