// The gateway's restores: POST /v1/sandboxes with "snapshot". Snapshots are files in a store every node of the
// fleet shares (<fleet root>/snapshots), so any node restores any snapshot: the gateway looks the snapshot up
// through any live node, then places the restore like any create. Snapshots and forks of a sandbox go to its node
// with the rest of /v1/sandboxes/<id>/ (GatewayForward.cc); listings and deletes to any node (forwardToAny).
#include <algorithm>

#include "GatewayInternal.h"
#include "dsec/launcher/api/Edge.h"
#include "dsec/launcher/api/Requests.h"
#include "dsec/launcher/fleet/Gateway.h"

namespace dsec::launcher {
namespace {

using nlohmann::json;
namespace http = boost::beast::http;

constexpr int kLookupTimeoutMs = 30 * 1000;

// The name goes into a path: anything but a plain name is refused here; the node holds the exact rule.
bool pathSafeName(const std::string& name) {
  return !name.empty() && name.size() <= 128 && name[0] != '.' && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
  });
}

}  // namespace

std::optional<client::HttpReply> Gateway::getFromAny(HttpExchange& ex, const std::string& target) {
  std::string last_error;
  for (const auto& n : liveNodes()) {
    auto reply =
        client::call(n.endpoint, http::verb::get, target, options_.token, "", callOptions(n, kLookupTimeoutMs));
    if (reply.ok()) return *reply;
    last_error = "node " + n.name + ": " + reply.error().message();
  }
  std::string msg = "no live node of fleet " + options_.fleet_name + " answered";
  if (!last_error.empty()) msg += " (" + last_error + ")";
  ex.sendError(503, "unavailable", msg, {{"Retry-After", "1"}}, json{{"retry_after", 1}});
  return std::nullopt;
}

void Gateway::restoreSandbox(HttpExchange& ex, const std::string& raw, const json& body) {
  const json& snapshot = body["snapshot"];
  if (!snapshot.is_string() || !pathSafeName(snapshot.get<std::string>())) {
    return ex.sendError(400, "invalid_request", "snapshot must be the name of a snapshot, got " + snapshot.dump());
  }
  const std::string name = snapshot.get<std::string>();
  auto found = getFromAny(ex, "/v1/snapshots/" + name);
  if (!found) return;
  if (found->status != 200) return relayReply(ex, *found);  // 404: no such snapshot in the fleet's store
  json meta = found->json();
  if (!meta.is_object()) return ex.sendError(500, "internal", "the node sent no snapshot object for " + name);
  // Placed as what it restores: the snapshot's backend; its limits when the object carries them, else a
  // default create's (the chosen node's admission counts the real ones, and a 429 there places it again).
  const CreateParams defaults;
  const std::string backend = meta.value("backend", std::string(backends::backendKindName(defaults.backend)));
  if (!backends::parseBackendKind(backend).ok()) {
    return ex.sendError(500, "internal", "snapshot " + name + " names an unknown backend '" + backend + "'");
  }
  placement::ClusterRequest request;
  request.backend = backend;
  request.cpus = std::max(meta.value("cpus", defaults.cpus), 0.001);
  request.memory_bytes = std::max<int64_t>(meta.value("memory_bytes", defaults.memory_bytes), 0);
  request.latency = meta.value("qos", "") == "latency";
  std::string session =
      body.contains("session") && body["session"].is_string() ? body["session"].get<std::string>() : "";
  placeCreate(ex, raw, request, session);
}

}  // namespace dsec::launcher
