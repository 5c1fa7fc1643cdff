// The gateway's node table: registration, draining, the watcher that probes nodes and declares them lost,
// and fan-out calls. Routes are in GatewayRoutes.cc, placement and forwarding in GatewayForward.cc.
#include "dsec/launcher/fleet/Gateway.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cmath>
#include <future>
#include <optional>

#include "GatewayInternal.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/api/NodeJson.h"
#include "dsec/launcher/node/NodeName.h"

namespace dsec::launcher {
namespace {

using gateway_internal::kLog;
using gateway_internal::secondsText;
using nlohmann::json;
namespace http = boost::beast::http;

std::shared_ptr<UniqueFd> newAbortFd() { return std::make_shared<UniqueFd>(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)); }

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
    DSEC_TRY(validateNodeName(spec.name));
    DSEC_TRY(dsec::parseEndpoint(spec.endpoint));
    if (body.contains("capacity")) {
      const auto& cap = body["capacity"];
      spec.cpus = cap.value("cpus", 0.0);
      spec.memory_bytes = cap.value("memory_bytes", int64_t{0});
    }
    if (body.contains("backends")) spec.backends = body["backends"].get<std::vector<std::string>>();
    spec.draining = body.value("draining", false);
    if (body.contains("admission") && !body["admission"].is_null()) {
      DSEC_ASSIGN_OR_RETURN(spec.admission, parseAdmissionJson(body["admission"]));
    }
    if (body.contains("sandboxes") && !body["sandboxes"].is_null()) spec.sandboxes = body["sandboxes"].get<int64_t>();
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
      placer_(placement::ClusterPlacerOptions{
          .k = options_.placement_k, .seed = options_.seed, .strategy = placement::Strategy::kPowerOfK}),
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
  if (spec.admission) noteAdmission(node, *spec.admission, spec.sandboxes >= 0 ? spec.sandboxes : node.sandboxes);
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
  if (info == nullptr || !info->is_object()) return;
  int64_t sandboxes = info->value("sandboxes", node.sandboxes);
  if (auto it = info->find("admission"); it != info->end() && !it->is_null()) {
    auto admission = parseAdmissionJson(*it);
    if (admission.ok()) {
      noteAdmission(node, *admission, sandboxes);
    } else {
      DSEC_LOG(kWarn, kLog) << "node " << node.spec.name << ": " << admission.error().message();
    }
  } else {
    node.sandboxes = sandboxes;
  }
}

void Gateway::noteAdmission(Node& node, const AdmissionInfo& admission, int64_t sandboxes) {
  bool was_admitting = !node.admission || node.admission->state.admitting;
  node.admission = admission;
  node.sandboxes = sandboxes;
  (void)placer_.setAdmission(node.id, admission.state, sandboxes, admission.reason);
  if (was_admitting != admission.state.admitting) {
    DSEC_LOG(kInfo, kLog) << "node " << node.spec.name
                          << (admission.state.admitting ? " admits again" : " stopped admitting: " + admission.reason);
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
  client::CallOptions o;
  o.connect_timeout_ms = static_cast<int>(options_.probe_timeout_seconds * 1000);
  o.io_timeout_ms = o.connect_timeout_ms;
  o.pool = options_.pool_connections ? &pool_ : nullptr;
  std::vector<std::future<Result<client::HttpReply>>> futures;
  for (const auto& target : targets) {
    const std::string& endpoint = target.second;
    futures.push_back(std::async(std::launch::async, [this, endpoint, o] {
      return client::call(endpoint, http::verb::get, "/v1/node", options_.token, "", o);
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
              {"memory_committed_bytes", n.admission ? n.admission->state.memory_committed_bytes : 0},
              {"admission", n.admission ? toJson(*n.admission) : json(nullptr)}};
    if (auto load = placer_.load(n.id); load.ok()) {
      j["in_flight"] = load->in_flight;
      j["utilisation"] = load->utilisation;
    }
    nodes.push_back(std::move(j));
  }
  return nodes;
}

client::CallOptions Gateway::callOptions(const NodeRef& node, int io_timeout_ms) const {
  client::CallOptions o;
  o.connect_timeout_ms = options_.connect_timeout_ms;
  o.io_timeout_ms = io_timeout_ms;
  o.abort_fd = node.abort_fd ? node.abort_fd->get() : -1;
  o.pool = options_.pool_connections ? &pool_ : nullptr;
  return o;
}

std::vector<std::pair<Gateway::NodeRef, Result<client::HttpReply>>> Gateway::fanOut(http::verb method,
                                                                                    const std::string& target,
                                                                                    const std::string& body) {
  auto nodes = liveNodes();
  std::vector<std::future<Result<client::HttpReply>>> futures;
  for (const auto& n : nodes) {
    futures.push_back(std::async(std::launch::async, [this, n, method, target, body] {
      return client::call(n.endpoint, method, target, options_.token, body, callOptions(n, 30000));
    }));
  }
  std::vector<std::pair<NodeRef, Result<client::HttpReply>>> out;
  for (size_t i = 0; i < nodes.size(); ++i) out.emplace_back(nodes[i], futures[i].get());
  return out;
}

}  // namespace dsec::launcher
