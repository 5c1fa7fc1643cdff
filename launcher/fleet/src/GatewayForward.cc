// The gateway's requests that go to nodes: creates placed with the ClusterPlacer, requests naming a sandbox
// forwarded to its node, listings and sessions fanned out to every node and merged.
#include <algorithm>
#include <cmath>

#include "GatewayInternal.h"
#include "dsec/backends/BackendKind.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/api/Edge.h"
#include "dsec/launcher/api/Requests.h"
#include "dsec/launcher/fleet/Gateway.h"

namespace dsec::launcher {
namespace {

using gateway_internal::kLog;
using gateway_internal::secondsText;
using nlohmann::json;
namespace http = boost::beast::http;

}  // namespace

void relayReply(HttpExchange& ex, const fleet::HttpReply& reply) {
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

void Gateway::createSandbox(HttpExchange& ex) {
  auto raw = readBodyOrAnswer(ex, kJsonBodyLimit);
  if (!raw) return;
  // The node's own validation and defaults (CreateParams): what fails here would fail on every node.
  auto body = parseJsonObject(*raw);
  if (!body.ok()) return sendError(ex, body.error());
  auto params = parseCreateRequest(*body, /*node_memory_bytes=*/0);
  if (!params.ok()) return sendError(ex, params.error());
  placement::ClusterRequest request;
  request.cpus = params->cpus;
  request.memory_bytes = params->memory_bytes;
  request.backend = backends::backendKindName(params->backend);
  const std::string& session = params->session;
  if (request.cpus <= 0 || request.memory_bytes <= 0) {  // unlimited: still one slot in the placer's books
    request.cpus = std::max(request.cpus, 0.001);
    request.memory_bytes = std::max<int64_t>(request.memory_bytes, 1);
  }

  std::vector<placement::NodeId> exclude;
  if (params->qos == backends::CpuQos::kLatency) {
    // A latency sandbox needs ceil(cpus) dedicated cores: skip nodes whose last report had fewer free.
    std::lock_guard lock(mu_);
    for (const auto& [name, n] : nodes_) {
      if (n.free_dedicated_cores >= 0 && n.free_dedicated_cores < std::ceil(request.cpus - 1e-9))
        exclude.push_back(n.id);
    }
  }
  std::string last_refusal;
  for (int attempt = 0; attempt < options_.max_place_attempts; ++attempt) {
    auto ticket = placer_.place(request, exclude);
    if (!ticket.ok()) {
      if (ticket.error().code() == ErrorCode::kInvalidArgument) {
        return ex.sendError(400, "invalid_request", ticket.error().message());
      }
      last_refusal = ticket.error().message() + (last_refusal.empty() ? "" : " (" + last_refusal + ")");
      break;
    }
    auto ref = nodeRef(placer_.name(ticket->node));
    if (!ref) {
      placer_.confirm(*ticket, false);
      exclude.push_back(ticket->node);
      continue;
    }
    auto reply = fleet::call(ref->endpoint, http::verb::post, "/v1/sandboxes", options_.token, *raw,
                             callOptions(*ref, 300 * 1000));
    if (reply.ok() && reply->status == 404 && !session.empty()) {
      // A node that joined after the session was created does not know it yet: create it there, then retry.
      std::string params;
      {
        std::lock_guard lock(mu_);
        if (auto it = sessions_.find(session); it != sessions_.end()) params = it->second;
      }
      if (!params.empty()) {
        auto put = fleet::call(ref->endpoint, http::verb::put, "/v1/sessions/" + session, options_.token, params,
                               callOptions(*ref, 10000));
        if (put.ok() && put->status == 200) {
          reply = fleet::call(ref->endpoint, http::verb::post, "/v1/sandboxes", options_.token, *raw,
                              callOptions(*ref, 300 * 1000));
        }
      }
    }
    if (!reply.ok()) {
      placer_.confirm(*ticket, false);
      exclude.push_back(ticket->node);
      last_refusal = "node " + ref->name + ": " + reply.error().message();
      DSEC_LOG(kWarn, kLog) << "create on " << ref->name << " failed, placing again: " << reply.error().message();
      watch_cv_.notify_all();
      continue;
    }
    if (reply->status == 429) {
      placer_.confirm(*ticket, false);
      exclude.push_back(ticket->node);
      last_refusal = "node " + ref->name + " is full";
      continue;
    }
    placer_.confirm(*ticket, reply->status == 201);
    if (reply->status == 201) {
      std::lock_guard lock(mu_);
      if (auto it = nodes_.find(ref->name); it != nodes_.end()) {
        Node& n = it->second;
        // A running mean of the CPUs per sandbox, for the committed-CPU estimate between probes.
        n.cpus_per_sandbox = (n.cpus_per_sandbox * 15 + request.cpus) / 16;
        n.sandboxes++;
      }
    }
    return relayReply(ex, *reply);
  }
  std::string msg = "no node of fleet " + options_.fleet_name + " can take the sandbox now";
  if (!last_refusal.empty()) msg += ": " + last_refusal;
  ex.sendError(429, "capacity", msg, {{"Retry-After", "1"}}, json{{"retry_after", 1}});
}

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
  auto st = fleet::forward(ex, ref->endpoint, options_.token, callOptions(*ref, options_.io_timeout_ms));
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
  const fleet::HttpReply* first_error = nullptr;
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
  // Layers live in the shared store: any live node answers for the fleet.
  for (const auto& n : liveNodes()) {
    auto st = fleet::forward(ex, n.endpoint, options_.token, callOptions(n, 30000));
    if (st.ok() || ex.responded()) return;
  }
  ex.discardBody(kDiscardLimit);
  ex.sendError(503, "unavailable", "no live node in fleet " + options_.fleet_name);
}

}  // namespace dsec::launcher
