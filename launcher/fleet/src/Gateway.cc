#include "dsec/launcher/fleet/Gateway.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <future>
#include <set>

#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/api/Requests.h"
#include "dsec/launcher/api/Router.h"

namespace dsec::launcher {
namespace {

using nlohmann::json;
namespace http = boost::beast::http;
constexpr const char* kLog = "gateway";
constexpr uint64_t kJsonLimit = 1 << 20;

std::shared_ptr<UniqueFd> newAbortFd() { return std::make_shared<UniqueFd>(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)); }

std::string secondsText(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1fs", s);
  return buf;
}

std::vector<std::string> pathSegments(std::string_view target) {
  std::string_view path = target.substr(0, target.find('?'));
  std::vector<std::string> segs;
  for (auto& s : split(path, '/')) {
    if (!s.empty()) segs.push_back(s);
  }
  return segs;
}

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

const char* nodeStateName(NodeState state) {
  switch (state) {
    case NodeState::kHealthy:
      return "healthy";
    case NodeState::kLost:
      return "lost";
    case NodeState::kDraining:
      return "draining";
  }
  return "?";
}

Result<FleetNodeSpec> parseNodeSpec(const json& body) {
  try {
    if (!body.is_object()) return Error::invalid("node registration must be a JSON object");
    FleetNodeSpec spec;
    spec.name = body.at("name").get<std::string>();
    spec.endpoint = body.at("endpoint").get<std::string>();
    if (spec.name.empty() || spec.name.size() > 32 ||
        spec.name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") != std::string::npos ||
        spec.name[0] == '-') {
      return Error::invalid("node name '" + spec.name + "': use 1-32 of [a-z0-9-], not starting with '-'");
    }
    DSEC_TRY(fleet::parseEndpoint(spec.endpoint));
    if (body.contains("capacity")) {
      const auto& cap = body["capacity"];
      spec.cpus = cap.value("cpus", 0.0);
      spec.memory_bytes = cap.value("memory_bytes", int64_t{0});
    }
    if (body.contains("backends")) spec.backends = body["backends"].get<std::vector<std::string>>();
    spec.draining = body.value("draining", false);
    if (body.contains("committed") && body["committed"].is_object()) {
      const auto& c = body["committed"];
      spec.committed_cpus = c.value("cpus", -1.0);
      spec.committed_memory = c.value("memory_bytes", int64_t{-1});
      spec.sandboxes = c.value("sandboxes", int64_t{-1});
    }
    return spec;
  } catch (const json::exception& e) {
    return Error::invalid(std::string("node registration: ") + e.what());
  }
}

std::string nodeOfSandboxId(const std::string& id) {
  auto dash = id.rfind('-');
  if (dash == std::string::npos || dash == 0) return "";
  return id.substr(0, dash);
}

Gateway::Gateway(GatewayOptions options)
    : options_(std::move(options)),
      placer_(placement::ClusterPlacerOptions{.k = options_.placement_k,
                                              .seed = options_.seed,
                                              .strategy = placement::Strategy::kPowerOfK,
                                              .cpu_overcommit = options_.cpu_overcommit,
                                              .memory_overcommit = options_.memory_overcommit}),
      started_(monotonicSeconds()) {}

Gateway::~Gateway() { stop(); }

void Gateway::start() {
  std::lock_guard lock(watch_mu_);
  if (watcher_.joinable()) return;
  stopping_ = false;
  watcher_ = std::thread([this] { watchLoop(); });
}

void Gateway::stop() {
  {
    std::lock_guard lock(watch_mu_);
    stopping_ = true;
  }
  watch_cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
}

// ---- the node table -----------------------------------------------------------------------------------

Status Gateway::registerNode(const FleetNodeSpec& spec, bool from_seed) {
  std::lock_guard lock(mu_);
  auto [it, fresh] = nodes_.try_emplace(spec.name);
  Node& node = it->second;
  bool was_lost = !fresh && node.state == NodeState::kLost;
  bool moved = !fresh && node.spec.endpoint != spec.endpoint;
  bool operator_drain = node.operator_drain;
  node.spec = spec;
  placement::NodeInfo info;
  info.name = spec.name;
  info.capacity.pus = static_cast<int>(std::lround(spec.cpus));
  info.capacity.cores = info.capacity.pus;
  info.capacity.memory_bytes = spec.memory_bytes;
  info.backends = spec.backends;
  info.healthy = true;
  info.draining = spec.draining || operator_drain;
  node.id = placer_.addNode(info);
  node.state = info.draining ? NodeState::kDraining : NodeState::kHealthy;
  node.last_seen = monotonicSeconds();
  node.consecutive_failures = 0;
  if (fresh || was_lost || moved || !node.abort_fd) node.abort_fd = newAbortFd();
  if (spec.committed_cpus >= 0 && spec.committed_memory >= 0 && spec.sandboxes >= 0) {
    node.reported_cpus = spec.committed_cpus;
    node.memory_committed = spec.committed_memory;
    node.sandboxes = spec.sandboxes;
    (void)placer_.setCommitted(node.id, spec.committed_cpus, spec.committed_memory, spec.sandboxes);
  }
  if (fresh) {
    DSEC_LOG(kInfo, kLog) << "node " << spec.name << " " << (from_seed ? "known from the launch" : "registered")
                          << " at " << spec.endpoint << " (" << spec.cpus << " cpus, " << formatBytes(spec.memory_bytes)
                          << ")";
  } else if (was_lost) {
    DSEC_LOG(kInfo, kLog) << "node " << spec.name << " is back at " << spec.endpoint;
  } else if (moved) {
    DSEC_LOG(kInfo, kLog) << "node " << spec.name << " moved to " << spec.endpoint;
  }
  return okStatus();
}

Status Gateway::drainNode(const std::string& name, bool draining) {
  std::lock_guard lock(mu_);
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return Error::notFound("no node '" + name + "' in fleet " + options_.fleet_name);
  Node& node = it->second;
  node.operator_drain = draining;
  node.spec.draining = draining;
  DSEC_TRY(placer_.setDraining(node.id, draining));
  if (node.state != NodeState::kLost) node.state = draining ? NodeState::kDraining : NodeState::kHealthy;
  DSEC_LOG(kInfo, kLog) << "node " << name << (draining ? " draining" : " no longer draining");
  return okStatus();
}

Status Gateway::removeNode(const std::string& name) {
  std::lock_guard lock(mu_);
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return Error::notFound("no node '" + name + "' in fleet " + options_.fleet_name);
  // The placer has no removal: the entry stays, unhealthy and draining, until the name registers again.
  (void)placer_.setHealthy(it->second.id, false);
  (void)placer_.setDraining(it->second.id, true);
  if (it->second.abort_fd) {
    uint64_t one = 1;
    (void)!::write(it->second.abort_fd->get(), &one, sizeof(one));
  }
  pool_.drop(it->second.spec.endpoint);
  nodes_.erase(it);
  DSEC_LOG(kInfo, kLog) << "node " << name << " left the fleet";
  return okStatus();
}

void Gateway::markSeen(Node& node, const json* info) {
  node.last_seen = monotonicSeconds();
  node.consecutive_failures = 0;
  if (node.state == NodeState::kLost) {
    node.state = node.operator_drain || node.spec.draining ? NodeState::kDraining : NodeState::kHealthy;
    node.abort_fd = newAbortFd();
    (void)placer_.setHealthy(node.id, true);
    DSEC_LOG(kInfo, kLog) << "node " << node.spec.name << " answers again";
  }
  if (info && info->is_object()) {
    node.sandboxes = info->value("sandboxes", int64_t{0});
    if (info->contains("capacity"))
      node.memory_committed = (*info)["capacity"].value("memory_committed_bytes", int64_t{0});
    // /v1/node reports committed memory but not CPUs: estimate them from what the gateway placed there.
    double cpus =
        node.reported_cpus >= 0 ? node.reported_cpus : static_cast<double>(node.sandboxes) * node.cpus_per_sandbox;
    if (info->contains("capacity") && (*info)["capacity"].contains("cpus_committed")) {
      cpus = (*info)["capacity"].value("cpus_committed", cpus);
    }
    (void)placer_.setCommitted(node.id, cpus, node.memory_committed, node.sandboxes);
    if (info->contains("qos") && (*info)["qos"].is_object()) {
      node.free_dedicated_cores = (*info)["qos"].value("free_dedicated_cores", -1);  // CPU QoS (docs/qos.md)
    }
  }
}

void Gateway::markLost(Node& node, const std::string& why) {
  if (node.state == NodeState::kLost) return;
  node.state = NodeState::kLost;
  (void)placer_.setHealthy(node.id, false);
  uint64_t one = 1;
  if (node.abort_fd) (void)!::write(node.abort_fd->get(), &one, sizeof(one));  // aborts requests in flight there
  pool_.drop(node.spec.endpoint);
  DSEC_LOG(kWarn, kLog) << "node " << node.spec.name << " is lost (last seen "
                        << secondsText(monotonicSeconds() - node.last_seen) << " ago): " << why;
}

void Gateway::probeAll() {
  std::vector<std::pair<std::string, std::string>> targets;
  {
    std::lock_guard lock(mu_);
    for (const auto& [name, node] : nodes_) targets.emplace_back(name, node.spec.endpoint);
  }
  fleet::CallOptions o;
  o.connect_timeout_ms = static_cast<int>(options_.probe_timeout_seconds * 1000);
  o.io_timeout_ms = o.connect_timeout_ms;
  o.pool = options_.pool_connections ? &pool_ : nullptr;
  std::vector<std::future<Result<fleet::HttpReply>>> futures;
  for (const auto& target : targets) {
    const std::string& endpoint = target.second;
    futures.push_back(std::async(std::launch::async, [this, endpoint, o] {
      return fleet::call(endpoint, http::verb::get, "/v1/node", options_.token, "", o);
    }));
  }
  double now = monotonicSeconds();
  for (size_t i = 0; i < targets.size(); ++i) {
    auto reply = futures[i].get();
    std::lock_guard lock(mu_);
    auto it = nodes_.find(targets[i].first);
    if (it == nodes_.end() || it->second.spec.endpoint != targets[i].second) continue;
    Node& node = it->second;
    if (reply.ok() && reply->status == 200) {
      auto info = reply->json();
      markSeen(node, &info);
      continue;
    }
    node.consecutive_failures++;
    std::string why = reply.ok() ? "GET /v1/node answered " + std::to_string(reply->status) : reply.error().message();
    if (now - node.last_seen >= options_.lost_after_seconds) markLost(node, why);
  }
}

void Gateway::watchLoop() {
  for (;;) {
    probeAll();
    std::unique_lock lock(watch_mu_);
    if (watch_cv_.wait_for(lock, std::chrono::duration<double>(options_.probe_interval_seconds),
                           [this] { return stopping_; })) {
      return;
    }
  }
}

std::optional<Gateway::NodeRef> Gateway::nodeRef(const std::string& name) {
  std::lock_guard lock(mu_);
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return std::nullopt;
  const Node& n = it->second;
  return NodeRef{n.spec.name, n.spec.endpoint, n.state, n.last_seen, n.abort_fd};
}

std::vector<Gateway::NodeRef> Gateway::liveNodes() {
  std::lock_guard lock(mu_);
  std::vector<NodeRef> out;
  for (const auto& [name, n] : nodes_) {
    if (n.state != NodeState::kLost)
      out.push_back(NodeRef{n.spec.name, n.spec.endpoint, n.state, n.last_seen, n.abort_fd});
  }
  return out;
}

json Gateway::nodesJson() {
  std::lock_guard lock(mu_);
  json nodes = json::array();
  double now = monotonicSeconds();
  for (const auto& [name, n] : nodes_) {
    json j = {{"name", name},
              {"endpoint", n.spec.endpoint},
              {"state", nodeStateName(n.state)},
              {"last_seen_seconds_ago", std::round((now - n.last_seen) * 10) / 10},
              {"capacity", {{"cpus", n.spec.cpus}, {"memory_bytes", n.spec.memory_bytes}}},
              {"backends", n.spec.backends},
              {"sandboxes", n.sandboxes},
              {"memory_committed_bytes", n.memory_committed}};
    if (auto load = placer_.load(n.id); load.ok()) {
      j["in_flight"] = load->in_flight;
      j["utilisation"] = load->utilisation;
    }
    nodes.push_back(std::move(j));
  }
  return nodes;
}

fleet::CallOptions Gateway::callOptions(const NodeRef& node, int io_timeout_ms) const {
  fleet::CallOptions o;
  o.connect_timeout_ms = options_.connect_timeout_ms;
  o.io_timeout_ms = io_timeout_ms;
  o.abort_fd = node.abort_fd ? node.abort_fd->get() : -1;
  o.pool = options_.pool_connections ? &pool_ : nullptr;
  return o;
}

std::vector<std::pair<Gateway::NodeRef, Result<fleet::HttpReply>>> Gateway::fanOut(http::verb method,
                                                                                   const std::string& target,
                                                                                   const std::string& body) {
  auto nodes = liveNodes();
  std::vector<std::future<Result<fleet::HttpReply>>> futures;
  for (const auto& n : nodes) {
    futures.push_back(std::async(std::launch::async, [this, n, method, target, body] {
      return fleet::call(n.endpoint, method, target, options_.token, body, callOptions(n, 30000));
    }));
  }
  std::vector<std::pair<NodeRef, Result<fleet::HttpReply>>> out;
  for (size_t i = 0; i < nodes.size(); ++i) out.emplace_back(nodes[i], futures[i].get());
  return out;
}

// ---- requests -------------------------------------------------------------------------------------------

bool Gateway::acceptsCredentials(std::string_view value) const { return bearerTokenMatches(value, options_.token); }

bool Gateway::authorized(const HttpExchange& ex) const {
  auto it = ex.head().find(http::field::authorization);
  if (it == ex.head().end()) return false;
  return acceptsCredentials(std::string_view(it->value().data(), it->value().size()));
}

std::optional<json> Gateway::readJson(HttpExchange& ex, uint64_t limit) {
  bool too_large = false;
  auto body = ex.readBody(limit, &too_large);
  if (!body.ok()) {
    if (too_large) {
      ex.sendError(413, "too_large", body.error().message());
    } else {
      ex.sendError(400, "invalid_request", body.error().message());
    }
    return std::nullopt;
  }
  if (body->empty()) return json::object();
  auto j = json::parse(*body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    ex.sendError(400, "invalid_request", "request body must be a JSON object");
    return std::nullopt;
  }
  return j;
}

void Gateway::sendLost(HttpExchange& ex, const NodeRef& node, const std::string& sandbox_id) {
  ex.discardBody(kJsonLimit);
  std::string msg =
      "node " + node.name + " is lost (last seen " + secondsText(monotonicSeconds() - node.last_seen) + " ago)";
  if (!sandbox_id.empty()) msg += "; sandbox " + sandbox_id + " is lost";
  ex.sendError(503, "unavailable", msg, {{"Retry-After", "5"}},
               json{{"node", node.name}, {"node_state", "lost"}, {"sandbox", sandbox_id}, {"retry_after", 5}});
}

void Gateway::sendNodeError(HttpExchange& ex, const Error& error, const std::string& node,
                            const std::string& sandbox_id) {
  ex.discardBody(kJsonLimit);
  std::string msg = "node " + node + " is not answering (" + error.message() + ")";
  if (!sandbox_id.empty()) msg += "; sandbox " + sandbox_id + " may be lost";
  ex.sendError(503, "unavailable", msg, {{"Retry-After", "2"}},
               json{{"node", node}, {"node_state", "unreachable"}, {"sandbox", sandbox_id}, {"retry_after", 2}});
  watch_cv_.notify_all();  // probe now rather than at the next tick
}

void Gateway::handle(HttpExchange& ex) {
  auto segs = pathSegments(ex.target());
  if (segs.size() == 1 && segs[0] == "healthz") {
    auto live = liveNodes();
    ex.sendJson(200,
                json{{"status", "ok"}, {"fleet", options_.fleet_name}, {"node", "gateway"}, {"nodes", live.size()}});
    return;
  }
  if (!authorized(ex)) {
    ex.discardBody(kJsonLimit);
    ex.sendError(401, "unauthorized", "missing or wrong bearer token", {{"WWW-Authenticate", "Bearer"}});
    return;
  }
  ex.markAuthenticated();  // the connection leaves its client's unauthenticated budget
  try {
    if (segs.size() == 1 && segs[0] == "metrics") {
      std::map<std::string, int> counts = {{"healthy", 0}, {"lost", 0}, {"draining", 0}};
      for (const auto& n : nodesJson()) counts[n["state"].get<std::string>()]++;
      std::string text = "# TYPE dsec_fleet_nodes gauge\n";
      for (const auto& [state, count] : counts) {
        text += "dsec_fleet_nodes{state=\"" + state + "\"} " + std::to_string(count) + "\n";
      }
      if (const HttpServer* http = transport()) http->renderMetrics(&text);
      ex.sendText(200, "text/plain; version=0.0.4", text);
      return;
    }
    if (segs.size() >= 2 && segs[0] == "v1") {
      if (segs[1] == "fleet") return handleFleet(ex, segs);
      if (segs[1] == "sessions") return handleSessions(ex, segs);
      if (segs[1] == "node" && segs.size() == 2) return fleetNodeInfo(ex);
      if (segs[1] == "layers" && segs.size() == 2) return forwardToAny(ex);
      if (segs[1] == "call" && segs.size() == 2) return forwardCall(ex);
      if (segs[1] == "sandboxes" && segs.size() == 2) {
        if (ex.method() == http::verb::post) return createSandbox(ex);
        if (ex.method() == http::verb::get) return listSandboxes(ex);
        ex.discardBody(kJsonLimit);
        ex.sendError(405, "invalid_request", "method not allowed", {{"Allow", "GET, POST"}});
        return;
      }
      if (segs[1] == "sandboxes") {
        std::string id;
        if (!percentDecode(segs[2], &id)) id = segs[2];
        return forwardToSandbox(ex, id);
      }
    }
    ex.discardBody(kJsonLimit);
    ex.sendError(404, "not_found", "no route " + std::string(ex.target().substr(0, ex.target().find('?'))));
  } catch (const json::exception& e) {
    if (!ex.responded()) ex.sendError(400, "invalid_request", std::string("bad JSON: ") + e.what());
  }
}

void Gateway::handleFleet(HttpExchange& ex, const std::vector<std::string>& segs) {
  auto method = ex.method();
  if (segs.size() == 3 && segs[2] == "nodes") {
    if (method == http::verb::get) {
      ex.sendJson(200, json{{"fleet", options_.fleet_name}, {"nodes", nodesJson()}});
      return;
    }
    if (method == http::verb::post) {
      auto body = readJson(ex, kJsonLimit);
      if (!body) return;
      auto spec = parseNodeSpec(*body);
      if (!spec.ok()) return ex.sendError(400, "invalid_request", spec.error().message());
      (void)registerNode(*spec);
      auto ref = nodeRef(spec->name);
      ex.sendJson(200, json{{"name", spec->name}, {"state", ref ? nodeStateName(ref->state) : "unknown"}});
      return;
    }
    ex.discardBody(kJsonLimit);
    return ex.sendError(405, "invalid_request", "method not allowed", {{"Allow", "GET, POST"}});
  }
  if (segs.size() >= 4 && segs[2] == "nodes") {
    const std::string& name = segs[3];
    if (segs.size() == 4 && method == http::verb::get) {
      for (const auto& n : nodesJson()) {
        if (n["name"] == name) return ex.sendJson(200, n);
      }
      return ex.sendError(404, "not_found", "no node '" + name + "' in fleet " + options_.fleet_name);
    }
    if (segs.size() == 4 && method == http::verb::delete_) {
      auto st = removeNode(name);
      if (!st.ok()) return ex.sendError(404, "not_found", st.error().message());
      return ex.sendJson(200, json{{"name", name}, {"removed", true}});
    }
    if (segs.size() == 5 && (segs[4] == "drain" || segs[4] == "undrain") && method == http::verb::post) {
      ex.discardBody(kJsonLimit);
      auto st = drainNode(name, segs[4] == "drain");
      if (!st.ok()) return ex.sendError(404, "not_found", st.error().message());
      for (const auto& n : nodesJson()) {
        if (n["name"] == name) return ex.sendJson(200, n);
      }
    }
  }
  ex.discardBody(kJsonLimit);
  ex.sendError(404, "not_found", "no route " + std::string(ex.target()));
}

void Gateway::createSandbox(HttpExchange& ex) {
  bool too_large = false;
  auto raw = ex.readBody(kJsonLimit, &too_large);
  if (!raw.ok()) {
    return ex.sendError(too_large ? 413 : 400, too_large ? "too_large" : "invalid_request", raw.error().message());
  }
  auto body = json::parse(*raw, nullptr, false);
  if (body.is_discarded() || !body.is_object()) {
    return ex.sendError(400, "invalid_request", "request body must be a JSON object");
  }
  // The placer's view of the request; anything malformed here is left to the node's validation (400).
  placement::ClusterRequest request;
  request.cpus = body.contains("cpus") && body["cpus"].is_number() ? body["cpus"].get<double>() : 1.0;
  request.memory_bytes = 512LL << 20;
  if (body.contains("memory")) {
    if (body["memory"].is_number_integer()) {
      request.memory_bytes = body["memory"].get<int64_t>();
    } else if (body["memory"].is_string()) {
      if (auto m = parseByteSize(body["memory"].get<std::string>()); m.ok()) request.memory_bytes = *m;
    }
  }
  std::string backend =
      body.contains("backend") && body["backend"].is_string() ? body["backend"].get<std::string>() : "container";
  request.backend = backend;
  std::string session =
      body.contains("session") && body["session"].is_string() ? body["session"].get<std::string>() : "";
  if (request.cpus <= 0 || request.memory_bytes <= 0) {
    request.cpus = std::max(request.cpus, 0.001);
    request.memory_bytes = std::max<int64_t>(request.memory_bytes, 1);
  }

  std::vector<placement::NodeId> exclude;
  if (body.contains("qos") && body["qos"] == "latency") {
    // A latency sandbox needs ceil(cpus) dedicated cores: skip nodes whose last report had fewer free.
    std::lock_guard lock(mu_);
    for (const auto& [name, n] : nodes_) {
      if (n.free_dedicated_cores >= 0 && n.free_dedicated_cores < std::ceil(request.cpus - 1e-9))
        exclude.push_back(n.id);
    }
  }
  std::string last_refusal;
  bool any_capacity_refusal = false;
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
      any_capacity_refusal = true;
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
  (void)any_capacity_refusal;
  std::string msg = "no node of fleet " + options_.fleet_name + " can take the sandbox now";
  if (!last_refusal.empty()) msg += ": " + last_refusal;
  ex.sendError(429, "capacity", msg, {{"Retry-After", "1"}}, json{{"retry_after", 1}});
}

void Gateway::forwardToSandbox(HttpExchange& ex, const std::string& sandbox_id) {
  std::string node = nodeOfSandboxId(sandbox_id);
  auto ref = node.empty() ? std::nullopt : nodeRef(node);
  if (!ref) {
    ex.discardBody(kJsonLimit);
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
  ex.discardBody(kJsonLimit);
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
    auto j = readJson(ex, kJsonLimit);
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
    ex.discardBody(kJsonLimit);
  }
  auto replies = fanOut(method, std::string(ex.target()), body);
  if (replies.empty()) return ex.sendError(503, "unavailable", "no live node in fleet " + options_.fleet_name);
  json unreachable = json::array();
  std::vector<json> ok_parts;
  const fleet::HttpReply* first_error = nullptr;
  bool all_not_found = true;
  for (auto& [node, reply] : replies) {
    if (!reply.ok()) {
      unreachable.push_back(node.name);
      continue;
    }
    if (reply->status >= 200 && reply->status < 300) {
      all_not_found = false;
      ok_parts.push_back(reply->json());
    } else {
      if (reply->status != 404) all_not_found = false;
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
    (void)all_not_found;
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

void Gateway::fleetNodeInfo(HttpExchange& ex) {
  ex.discardBody(kJsonLimit);
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

void Gateway::forwardToAny(HttpExchange& ex) {
  // Layers live in the shared store: any live node answers for the fleet.
  for (const auto& n : liveNodes()) {
    auto st = fleet::forward(ex, n.endpoint, options_.token, callOptions(n, 30000));
    if (st.ok() || ex.responded()) return;
  }
  ex.discardBody(kJsonLimit);
  ex.sendError(503, "unavailable", "no live node in fleet " + options_.fleet_name);
}

}  // namespace dsec::launcher
