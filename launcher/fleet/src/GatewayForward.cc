// The gateway's requests that go to nodes: requests naming a sandbox forwarded to its node, listings and
// sessions fanned out to every node and merged. Creates are in GatewayCreate.cc.
#include <algorithm>

#include "GatewayInternal.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/api/Edge.h"
#include "dsec/launcher/fleet/Gateway.h"

namespace dsec::launcher {
namespace {

using gateway_internal::secondsText;
using nlohmann::json;
namespace http = boost::beast::http;

}  // namespace

void relayReply(HttpExchange& ex, const client::HttpReply& reply) {
  std::string content_type = "application/json";
  HttpExchange::Fields extra;
  for (const auto& [k, v] : reply.headers) {
    if (boost::beast::iequals(k, "Content-Type")) {
      content_type = v;
    } else {
      extra.emplace_back(k, v);
    }
  }
  ex.sendText(reply.status, content_type, reply.body, extra);
}

namespace {

// Merges one session as seen by several nodes (docs/api.md, Sessions): sandboxes concatenated, active if any
// node holds it active, the latest expiry, the earliest lapse.
json mergeSessions(const std::vector<json>& parts) {
  json merged = parts.front();
  json sandboxes = json::array(), infos = json::array();
  bool active = false, any_infos = false;
  double expires = 0;
  std::optional<double> lapsed;
  for (const auto& p : parts) {
    for (const auto& id : p.value("sandboxes", json::array())) sandboxes.push_back(id);
    if (p.contains("sandbox_infos")) {
      any_infos = true;
      for (const auto& info : p["sandbox_infos"]) infos.push_back(info);
    }
    if (p.value("state", "") == "active") active = true;
    if (p.contains("expires_unix") && p["expires_unix"].is_number()) {
      expires = std::max(expires, p["expires_unix"].get<double>());
    }
    if (p.contains("lapsed_unix") && p["lapsed_unix"].is_number()) {
      double l = p["lapsed_unix"].get<double>();
      lapsed = lapsed ? std::min(*lapsed, l) : l;
    }
  }
  merged["sandboxes"] = sandboxes;
  if (any_infos) merged["sandbox_infos"] = infos;
  merged["state"] = active ? "active" : "lapsed";
  if (expires > 0) merged["expires_unix"] = expires;
  merged["lapsed_unix"] = active || !lapsed ? json(nullptr) : json(*lapsed);
  merged["nodes"] = parts.size();
  return merged;
}

}  // namespace

void Gateway::forwardToSandbox(HttpExchange& ex, const std::string& sandbox_id) {
  std::string node = nodeOfSandboxId(sandbox_id);
  auto ref = node.empty() ? std::nullopt : nodeRef(node);
  if (!ref) {
    ex.discardBody(kDiscardLimit);
    double up = monotonicSeconds() - started_;
    if (!node.empty() && up < options_.lost_after_seconds + 5) {
      return ex.sendError(503, "unavailable",
                          "node " + node + " has not registered with the gateway yet (the gateway started " +
                              secondsText(up) + " ago); retry",
                          {{"Retry-After", "1"}}, json{{"retry_after", 1}, {"node", node}});
    }
    return ex.sendError(404, "not_found",
                        "no sandbox '" + sandbox_id + "'" +
                            (node.empty() ? "" : ": no node '" + node + "' in fleet " + options_.fleet_name));
  }
  if (ref->state == NodeState::kLost) return sendLost(ex, *ref, sandbox_id);
  auto st = fleet::isUpgradeRequest(ex)
                ? fleet::tunnelUpgrade(ex, ref->endpoint, options_.token, callOptions(*ref, options_.io_timeout_ms))
                : fleet::forward(ex, ref->endpoint, options_.token, callOptions(*ref, options_.io_timeout_ms));
  if (!st.ok() && !ex.responded()) {
    auto now_ref = nodeRef(node);
    if (now_ref && now_ref->state == NodeState::kLost) return sendLost(ex, *now_ref, sandbox_id);
    sendNodeError(ex, st.error(), node, sandbox_id);
  }
}

void Gateway::listSandboxes(HttpExchange& ex) {
  ex.discardBody(kDiscardLimit);
  json sandboxes = json::array();
  json unreachable = json::array();
  for (auto& [node, reply] : fanOut(http::verb::get, std::string(ex.target()), "")) {
    if (!reply.ok()) {
      unreachable.push_back(node.name);
      continue;
    }
    if (reply->status != 200) return relayReply(ex, *reply);  // a bad filter: the node's 400
    auto j = reply->json();
    if (j.is_object() && j.contains("sandboxes")) {
      for (auto& s : j["sandboxes"]) sandboxes.push_back(std::move(s));
    }
  }
  {
    std::lock_guard lock(mu_);
    for (const auto& [name, n] : nodes_) {
      if (n.state == NodeState::kLost) unreachable.push_back(name);
    }
  }
  json out = {{"sandboxes", sandboxes}};
  if (!unreachable.empty()) out["unreachable_nodes"] = unreachable;
  ex.sendJson(200, out);
}

void Gateway::handleSessions(HttpExchange& ex, const std::vector<std::string>& segs) {
  auto method = ex.method();
  std::string body;
  if (method == http::verb::put || method == http::verb::post) {
    auto j = readJsonBody(ex, kJsonBodyLimit, EmptyBody::kEmptyObject);
    if (!j) return;
    body = j->dump();
    if (segs.size() >= 3) {
      std::lock_guard lock(mu_);
      // Remember lease and retention for nodes that join later (attach carries only the lease).
      json params = sessions_.count(segs[2]) ? json::parse(sessions_[segs[2]], nullptr, false) : json::object();
      if (!params.is_object()) params = json::object();
      for (const auto& key : {"lease", "retention"}) {
        if (j->contains(key)) params[key] = (*j)[key];
      }
      sessions_[segs[2]] = params.dump();
    }
  } else {
    ex.discardBody(kDiscardLimit);
  }
  auto replies = fanOut(method, std::string(ex.target()), body);
  if (replies.empty()) return ex.sendError(503, "unavailable", "no live node in fleet " + options_.fleet_name);
  json unreachable = json::array();
  std::vector<json> ok_parts;
  const client::HttpReply* first_error = nullptr;
  for (auto& [node, reply] : replies) {
    if (!reply.ok()) {
      unreachable.push_back(node.name);
      continue;
    }
    if (reply->status >= 200 && reply->status < 300) {
      ok_parts.push_back(reply->json());
    } else {
      if (!first_error || (first_error->status == 404 && reply->status != 404)) first_error = &*reply;
    }
  }
  if (segs.size() == 2) {  // GET /v1/sessions: group by name
    std::map<std::string, std::vector<json>> by_name;
    for (const auto& part : ok_parts) {
      for (const auto& s : part.value("sessions", json::array())) by_name[s.value("name", "")].push_back(s);
    }
    json sessions = json::array();
    for (auto& [name, parts] : by_name) sessions.push_back(mergeSessions(parts));
    json out = {{"sessions", sessions}};
    if (!unreachable.empty()) out["unreachable_nodes"] = unreachable;
    return ex.sendJson(200, out);
  }
  if (ok_parts.empty()) {
    if (first_error) return relayReply(ex, *first_error);
    return ex.sendError(503, "unavailable", "no node of fleet " + options_.fleet_name + " answered");
  }
  json out;
  if (method == http::verb::delete_) {
    int64_t destroyed = 0;
    for (const auto& p : ok_parts) destroyed += p.value("destroyed", int64_t{0});
    out = {{"name", segs[2]}, {"destroyed", destroyed}};
    std::lock_guard lock(mu_);
    sessions_.erase(segs[2]);
  } else {
    out = mergeSessions(ok_parts);
  }
  if (!unreachable.empty()) out["unreachable_nodes"] = unreachable;
  int status = 200;
  for (auto& [node, reply] : replies) {
    if (reply.ok() && reply->status >= 200 && reply->status < 300) {
      status = reply->status;
      break;
    }
  }
  ex.sendJson(status, out);
}

void Gateway::forwardToAny(HttpExchange& ex) {
  // Layers and snapshots live in stores every node shares: any live node answers for the fleet.
  for (const auto& n : liveNodes()) {
    auto st = fleet::forward(ex, n.endpoint, options_.token, callOptions(n, 30000));
    if (st.ok() || ex.responded()) return;
  }
  ex.discardBody(kDiscardLimit);
  ex.sendError(503, "unavailable", "no live node in fleet " + options_.fleet_name);
}

}  // namespace dsec::launcher
