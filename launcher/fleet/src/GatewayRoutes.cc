// The gateway's routes (one RouteTable, the node API's authentication, body limits and error mapping) and the
// answers it gives itself: health, metrics, the fleet's node table, the fleet-wide GET /v1/node.
#include <set>

#include "GatewayInternal.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Prometheus.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/api/Edge.h"
#include "dsec/launcher/api/Requests.h"
#include "dsec/launcher/api/Router.h"
#include "dsec/launcher/fleet/Gateway.h"

namespace dsec::launcher {
namespace {

using gateway_internal::secondsText;
using nlohmann::json;
namespace http = boost::beast::http;

}  // namespace

// ---- routes ---------------------------------------------------------------------------------------------

namespace {

enum Route {
  kHealthz,
  kMetrics,
  kNodeInfo,
  kLayers,
  kCall,
  kRunCode,
  kListSandboxes,
  kCreateSandbox,
  kSandbox,    // anything under /v1/sandboxes/<id>/ (snapshot and fork too): forwarded to the sandbox's node
  kSessions,   // /v1/sessions and below: fanned out to every node
  kSnapshots,  // /v1/snapshots and /v1/snapshots/<name>: the shared snapshot store, through any live node
  kListNodes,
  kRegisterNode,
  kGetNode,
  kRemoveNode,
  kDrainNode,
  kUndrainNode,
};

const RouteTable& gatewayRoutes() {
  using V = http::verb;
  static const RouteTable table = [] {
    RouteTable t;
    t.add("/healthz", {{V::get, kHealthz}})
        .add("/metrics", {{V::get, kMetrics}})
        .add("/v1/node", {{V::get, kNodeInfo}})
        .add("/v1/layers", {{V::get, kLayers}})
        .add("/v1/call", {{V::post, kCall}})
        .add("/run_code", {{V::post, kRunCode}})
        .add("/v1/sandboxes", {{V::get, kListSandboxes}, {V::post, kCreateSandbox}})
        .addAnyMethod("/v1/sandboxes/**", kSandbox)
        .addAnyMethod("/v1/sessions", kSessions)
        .addAnyMethod("/v1/sessions/**", kSessions)
        .add("/v1/snapshots", {{V::get, kSnapshots}})
        .add("/v1/snapshots/*", {{V::get, kSnapshots}, {V::delete_, kSnapshots}})
        .add("/v1/fleet/nodes", {{V::get, kListNodes}, {V::post, kRegisterNode}})
        .add("/v1/fleet/nodes/*", {{V::get, kGetNode}, {V::delete_, kRemoveNode}})
        .add("/v1/fleet/nodes/*/drain", {{V::post, kDrainNode}})
        .add("/v1/fleet/nodes/*/undrain", {{V::post, kUndrainNode}});
    return t;
  }();
  return table;
}

std::vector<std::string> pathSegments(std::string_view path) {
  std::vector<std::string> segs;
  for (auto& s : split(path, '/')) {
    if (!s.empty()) segs.push_back(s);
  }
  return segs;
}

}  // namespace

bool Gateway::acceptsCredentials(std::string_view value) const { return bearerTokenMatches(value, options_.token); }

void Gateway::sendLost(HttpExchange& ex, const NodeRef& node, const std::string& sandbox_id) {
  ex.discardBody(kDiscardLimit);
  std::string msg =
      "node " + node.name + " is lost (last seen " + secondsText(monotonicSeconds() - node.last_seen) + " ago)";
  if (!sandbox_id.empty()) msg += "; sandbox " + sandbox_id + " is lost";
  ex.sendError(503, "unavailable", msg, {{"Retry-After", "5"}},
               json{{"node", node.name}, {"node_state", "lost"}, {"sandbox", sandbox_id}, {"retry_after", 5}});
}

void Gateway::sendNodeError(HttpExchange& ex, const Error& error, const std::string& node,
                            const std::string& sandbox_id) {
  ex.discardBody(kDiscardLimit);
  std::string msg = "node " + node + " is not answering (" + error.message() + ")";
  if (!sandbox_id.empty()) msg += "; sandbox " + sandbox_id + " may be lost";
  ex.sendError(503, "unavailable", msg, {{"Retry-After", "2"}},
               json{{"node", node}, {"node_state", "unreachable"}, {"sandbox", sandbox_id}, {"retry_after", 2}});
  watch_cv_.notify_all();  // probe now rather than at the next tick
}

void Gateway::handle(HttpExchange& ex) {
  TableMatch m = gatewayRoutes().match(ex.method(), ex.target());
  RouteGate gate{m.error_status == 0 && m.route == kHealthz, m.error_status, m.error, m.allow};
  if (!admitRequest(ex, options_.token, gate)) return;
  dispatchGuarded(ex, "gateway", [&] { dispatch(ex, m); });
}

void Gateway::dispatch(HttpExchange& ex, const TableMatch& m) {
  switch (m.route) {
    case kHealthz:
      ex.discardBody(kDiscardLimit);
      ex.sendJson(
          200,
          json{{"status", "ok"}, {"fleet", options_.fleet_name}, {"node", "gateway"}, {"nodes", liveNodes().size()}});
      return;
    case kMetrics: {
      ex.discardBody(kDiscardLimit);
      std::map<std::string, int> counts = {{"healthy", 0}, {"lost", 0}, {"draining", 0}};
      for (const auto& n : nodesJson()) counts[n["state"].get<std::string>()]++;
      std::string text;
      prometheus::family(&text, "dsec_fleet_nodes", "gauge");
      for (const auto& [state, count] : counts) {
        prometheus::sample(&text, "dsec_fleet_nodes", {{"state", state}}, prometheus::number(count));
      }
      if (const HttpServer* http = transport()) http->renderMetrics(&text);
      return sendMetrics(ex, std::move(text));
    }
    case kNodeInfo:
      return fleetNodeInfo(ex);
    case kLayers:
    case kSnapshots:
      return forwardToAny(ex);
    case kCall:
      return forwardCall(ex);
    case kRunCode:
      return runCode(ex);
    case kListSandboxes:
      return listSandboxes(ex);
    case kCreateSandbox:
      return createSandbox(ex);
    case kSandbox: {
      const std::string& rest = m.wildcards[0];
      std::string raw = rest.substr(0, rest.find('/'));
      std::string id;
      if (!percentDecode(raw, &id)) id = raw;
      return forwardToSandbox(ex, id);
    }
    case kSessions:
      return handleSessions(ex, pathSegments(m.path));
    default:
      return handleFleet(ex, m);
  }
}

void Gateway::handleFleet(HttpExchange& ex, const TableMatch& m) {
  std::string name = m.wildcards.empty() ? "" : m.wildcards[0];
  switch (m.route) {
    case kListNodes:
      ex.discardBody(kDiscardLimit);
      return ex.sendJson(200, json{{"fleet", options_.fleet_name}, {"nodes", nodesJson()}});
    case kRegisterNode: {
      auto body = readJsonBody(ex, kJsonBodyLimit, EmptyBody::kEmptyObject);
      if (!body) return;
      auto spec = parseNodeSpec(*body);
      if (!spec.ok()) return sendError(ex, spec.error());
      (void)registerNode(*spec);
      auto ref = nodeRef(spec->name);
      return ex.sendJson(200, json{{"name", spec->name}, {"state", ref ? nodeStateName(ref->state) : "unknown"}});
    }
    case kGetNode:
      ex.discardBody(kDiscardLimit);
      for (const auto& n : nodesJson()) {
        if (n["name"] == name) return ex.sendJson(200, n);
      }
      return ex.sendError(404, "not_found", "no node '" + name + "' in fleet " + options_.fleet_name);
    case kRemoveNode: {
      ex.discardBody(kDiscardLimit);
      auto st = removeNode(name);
      if (!st.ok()) return sendError(ex, st.error());
      return ex.sendJson(200, json{{"name", name}, {"removed", true}});
    }
    case kDrainNode:
    case kUndrainNode: {
      ex.discardBody(kDiscardLimit);
      auto st = drainNode(name, m.route == kDrainNode);
      if (!st.ok()) return sendError(ex, st.error());
      for (const auto& n : nodesJson()) {
        if (n["name"] == name) return ex.sendJson(200, n);
      }
      return ex.sendError(404, "not_found", "no node '" + name + "' in fleet " + options_.fleet_name);
    }
    default:
      ex.discardBody(kDiscardLimit);
      return ex.sendError(404, "not_found", "no route " + m.path);
  }
}

void Gateway::fleetNodeInfo(HttpExchange& ex) {
  ex.discardBody(kDiscardLimit);
  json nodes = nodesJson();
  std::set<std::string> backends;
  double cpus = 0;
  int64_t memory = 0, committed = 0, sandboxes = 0;
  for (const auto& n : nodes) {
    if (n["state"] == "lost") continue;
    for (const auto& b : n["backends"]) backends.insert(b.get<std::string>());
    cpus += n["capacity"]["cpus"].get<double>();
    memory += n["capacity"]["memory_bytes"].get<int64_t>();
    committed += n["memory_committed_bytes"].get<int64_t>();
    sandboxes += n["sandboxes"].get<int64_t>();
  }
  json info{{"node", "gateway"},
            {"fleet", options_.fleet_name},
            {"backends", backends},
            {"unavailable_backends", json::object()},
            {"capacity", {{"memory_bytes", memory}, {"memory_committed_bytes", committed}, {"cpus", cpus}}},
            {"sandboxes", sandboxes},
            {"nodes", nodes}};
  if (const HttpServer* http = transport()) info["http"] = http->info();
  ex.sendJson(200, info);
}

}  // namespace dsec::launcher
