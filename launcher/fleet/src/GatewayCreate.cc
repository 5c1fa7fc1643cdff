// The gateway's creates: placed by the ClusterPlacer, tried on the chosen node, and placed again elsewhere while
// nodes refuse or fail, up to max_place_attempts. Restores from a snapshot are placed the same way
// (GatewaySnapshots.cc).
#include <algorithm>

#include "GatewayInternal.h"
#include "dsec/backends/BackendKind.h"
#include "dsec/common/Logging.h"
#include "dsec/launcher/api/Edge.h"
#include "dsec/launcher/api/Requests.h"
#include "dsec/launcher/fleet/Gateway.h"

namespace dsec::launcher {
namespace {

using gateway_internal::kLog;
using nlohmann::json;
namespace http = boost::beast::http;

constexpr int kCreateTimeoutMs = 300 * 1000;
constexpr int kSessionPutTimeoutMs = 10 * 1000;

// What the placer books for a create: the node's admission counts the same limits (0, unlimited, counts nothing;
// the placer wants a positive CPU figure, and a thousandth of a CPU is nothing next to a node's ratio x CPUs).
placement::ClusterRequest placementRequest(const CreateParams& params) {
  placement::ClusterRequest request;
  request.cpus = std::max(params.cpus, 0.001);
  request.memory_bytes = std::max<int64_t>(params.memory_bytes, 0);
  request.backend = backends::backendKindName(params.backend);
  request.latency = params.qos == backends::CpuQos::kLatency;
  return request;
}

}  // namespace

Result<client::HttpReply> Gateway::createOnNode(const NodeRef& ref, const std::string& body,
                                                const std::string& session) {
  auto reply = client::call(ref.endpoint, http::verb::post, "/v1/sandboxes", options_.token, body,
                            callOptions(ref, kCreateTimeoutMs));
  if (!reply.ok() || reply->status != 404 || session.empty()) return reply;
  // A node that joined after the session was created does not know it yet: create it there, then retry.
  std::string session_params = sessionParams(session, ref.name);
  if (session_params.empty()) return reply;
  auto put = client::call(ref.endpoint, http::verb::put, "/v1/sessions/" + session, options_.token, session_params,
                          callOptions(ref, kSessionPutTimeoutMs));
  if (!put.ok() || put->status != 200) return reply;
  return client::call(ref.endpoint, http::verb::post, "/v1/sandboxes", options_.token, body,
                      callOptions(ref, kCreateTimeoutMs));
}

std::string Gateway::sessionParams(const std::string& session, const std::string& except_node) {
  {
    std::lock_guard lock(mu_);
    if (auto it = sessions_.find(session); it != sessions_.end()) return it->second;
  }
  // The session was made through another gateway (they are active-active and keep no shared state): the nodes
  // that know it hold its lease and retention.
  for (const auto& n : liveNodes()) {
    if (n.name == except_node) continue;
    auto got = client::call(n.endpoint, http::verb::get, "/v1/sessions/" + session, options_.token, "",
                            callOptions(n, kSessionPutTimeoutMs));
    if (!got.ok() || got->status != 200) continue;
    auto j = got->json();
    if (!j.is_object() || !j.contains("lease") || !j.contains("retention")) continue;
    std::string params = json{{"lease", j["lease"]}, {"retention", j["retention"]}}.dump();
    std::lock_guard lock(mu_);
    sessions_[session] = params;
    return params;
  }
  return "";
}

std::string Gateway::whyNodeRefused(const NodeRef& ref, const Result<client::HttpReply>& reply) {
  if (reply.ok()) {
    // The node's own words (its admission names the resource and the numbers).
    auto body = reply->json();
    if (body.is_object() && body.contains("error") && body["error"].is_object()) {
      std::string message = body["error"].value("message", "");
      if (!message.empty()) return message;
    }
    return "node " + ref.name + " is full";
  }
  DSEC_LOG(kWarn, kLog) << "create on " << ref.name << " failed, placing again: " << reply.error().message();
  watch_cv_.notify_all();  // the watcher probes it now rather than at its next round
  return "node " + ref.name + ": " + reply.error().message();
}

void Gateway::noteCreated(const std::string& node) {
  std::lock_guard lock(mu_);
  if (auto it = nodes_.find(node); it != nodes_.end()) it->second.sandboxes++;  // until the node's next report
}

void Gateway::createSandbox(HttpExchange& ex) {
  auto raw = readBodyOrAnswer(ex, kJsonBodyLimit);
  if (!raw) return;
  // The node's own validation and defaults (CreateParams): what fails here would fail on every node.
  auto body = parseJsonObject(*raw);
  if (!body.ok()) return sendError(ex, body.error());
  if (body->contains("snapshot")) return restoreSandbox(ex, *raw, *body);  // GatewaySnapshots.cc
  auto params = parseCreateRequest(*body, /*node_memory_bytes=*/0);
  if (!params.ok()) return sendError(ex, params.error());
  placeCreate(ex, *raw, placementRequest(*params), params->session);
}

void Gateway::placeCreate(HttpExchange& ex, const std::string& raw, const placement::ClusterRequest& request,
                          const std::string& session) {
  std::vector<placement::NodeId> exclude;
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
    if (!ref) {  // the node left since the placer counted it
      placer_.confirm(*ticket, false);
      exclude.push_back(ticket->node);
      continue;
    }
    auto reply = createOnNode(*ref, raw, session);
    if (!reply.ok() || reply->status == 429) {
      placer_.confirm(*ticket, false);
      exclude.push_back(ticket->node);
      last_refusal = whyNodeRefused(*ref, reply);
      continue;
    }
    placer_.confirm(*ticket, reply->status == 201);
    if (reply->status == 201) noteCreated(ref->name);
    return relayReply(ex, *reply);
  }
  std::string msg = "no node of fleet " + options_.fleet_name + " can take the sandbox now";
  if (!last_refusal.empty()) msg += ": " + last_refusal;
  ex.sendError(429, "capacity", msg, {{"Retry-After", "1"}}, json{{"retry_after", 1}});
}

}  // namespace dsec::launcher
