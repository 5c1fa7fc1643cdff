// The fleet gateway (rank 0 of dsec-launch, in its own process): the same HTTP API and token as a node, over
// every node of the fleet. It holds no sandbox state of its own, so it can be restarted at any time:
//  - nodes register (POST /v1/fleet/nodes) on start and every second; a watcher probes each node's
//    GET /v1/node every probe interval and marks a node that has not answered for `lost_after` seconds lost;
//  - creates are placed with the power-of-k ClusterPlacer (healthy, non-draining, backend, and admitted by the
//    node's own reported admission state with the gateway's creates in flight counted: placement/Admission.h)
//    and forwarded; a node's 429 or a connection failure places again elsewhere;
//  - a sandbox id is "<node>-<hex>": every request naming one goes to that node in one hop, bodies streamed;
//    a lost node's sandboxes get an immediate 503 that says so;
//  - listings and session requests fan out to every node and are merged.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "dsec/backends/BackendKind.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"
#include "dsec/launcher/api/HttpServer.h"
#include "dsec/launcher/api/Router.h"
#include "dsec/launcher/fleet/Fleet.h"
#include "dsec/launcher/node/Infos.h"
#include "dsec/placement/ClusterPlacer.h"

namespace dsec::launcher {

// Sends a node's reply on to the client as it is (status, body, Content-Type and the other headers).
void relayReply(HttpExchange& ex, const client::HttpReply& reply);

struct GatewayOptions {
  std::string fleet_name = "default";
  std::string token;
  double probe_interval_seconds = 1.0;
  double probe_timeout_seconds = 1.0;
  double lost_after_seconds = 3.0;  // no answer (probe or registration) for this long -> lost
  int connect_timeout_ms = 2000;
  int io_timeout_ms = 3600 * 1000;  // forwarded requests (exec can run long; lost nodes abort them anyway)
  int max_place_attempts = 3;
  int placement_k = 2;
  uint64_t seed = 0;
  // Keep-alive connections to the nodes for creates, probes and fan-out (false: one connection per call, as
  // before the pool; `dsec bench gateway --no-pool` compares).
  bool pool_connections = true;
};

enum class NodeState { kHealthy, kLost, kDraining };
const char* nodeStateName(NodeState state);

struct FleetNodeSpec {
  std::string name;
  std::string endpoint;
  double cpus = 0;
  int64_t memory_bytes = 0;
  std::vector<std::string> backends = {dsec::backends::backendKindName(dsec::backends::BackendKind::kContainer)};
  bool draining = false;
  // What the node admits by and its sandbox count, from its GET /v1/node (nullopt / -1: not reported).
  std::optional<AdmissionInfo> admission;
  int64_t sandboxes = -1;
};
// Parses a registration body ({"name","endpoint","capacity":{"cpus","memory_bytes"},"backends","draining",
// "admission","sandboxes"}); a malformed admission object is refused naming the field.
Result<FleetNodeSpec> parseNodeSpec(const nlohmann::json& body);
// The node a sandbox id names ("n2-3fa9..." -> "n2"), "" when the id has no node prefix.
std::string nodeOfSandboxId(const std::string& id);

class Gateway : public RequestHandler {
 public:
  explicit Gateway(GatewayOptions options);
  // POST /run_code: forwarded as a call is (forwardCall); also served by the gateway's RunCodeListener.
  void runCode(HttpExchange& ex) { forwardCall(ex, true); }
  ~Gateway() override;
  Gateway(const Gateway&) = delete;
  Gateway& operator=(const Gateway&) = delete;

  // Starts the watcher thread. Nodes come from registrations (and seed() before start).
  void start();
  void stop();

  // Adds or refreshes a node (a registration); a lost node that registers is healthy again.
  Status registerNode(const FleetNodeSpec& spec, bool from_seed = false);
  Status drainNode(const std::string& name, bool draining);
  Status removeNode(const std::string& name);
  nlohmann::json nodesJson();
  // One watcher round now (tests).
  void probeAll();

  void handle(HttpExchange& ex) override;
  bool acceptsCredentials(std::string_view authorization) const override;

 private:
  struct Node {
    FleetNodeSpec spec;
    placement::NodeId id = -1;
    NodeState state = NodeState::kHealthy;
    bool operator_drain = false;
    double last_seen = 0;  // monotonic
    int64_t sandboxes = 0;
    std::optional<AdmissionInfo> admission;  // as the node last reported it (placement has it too, with tickets)
    int consecutive_failures = 0;
    std::shared_ptr<UniqueFd> abort_fd;  // eventfd, written when the node is declared lost
  };
  struct NodeRef {
    std::string name, endpoint;
    NodeState state;
    double last_seen;
    std::shared_ptr<UniqueFd> abort_fd;
  };

  void watchLoop();
  void markSeen(Node& node, const nlohmann::json* info);
  // The node's report (registration or probe): its admission state and sandbox count replace the placer's books.
  void noteAdmission(Node& node, const AdmissionInfo& admission, int64_t sandboxes);
  void markLost(Node& node, const std::string& why);
  std::optional<NodeRef> nodeRef(const std::string& name);
  std::vector<NodeRef> liveNodes();
  client::CallOptions callOptions(const NodeRef& node, int io_timeout_ms) const;
  void sendLost(HttpExchange& ex, const NodeRef& node, const std::string& sandbox_id);
  void sendNodeError(HttpExchange& ex, const Error& error, const std::string& node, const std::string& sandbox_id);

  // Routing (GatewayRoutes.cc): the route table's match to the handler.
  void dispatch(HttpExchange& ex, const TableMatch& m);
  void handleFleet(HttpExchange& ex, const TableMatch& m);
  void createSandbox(HttpExchange& ex);
  // The steps of a create (GatewayCreate.cc).
  // POST /v1/sandboxes on the node; a 404 for a session the node has not heard of creates the session there
  // and tries once more.
  Result<client::HttpReply> createOnNode(const NodeRef& ref, const std::string& body, const std::string& session);
  // The lease and retention of a session (a PUT body): as seen in a PUT/attach here, else from a live node other
  // than except_node that knows it (the session came through another gateway). "" when none knows it.
  std::string sessionParams(const std::string& session, const std::string& except_node);
  // Why a failed or full node is passed over, for the 429 if no node takes the sandbox.
  std::string whyNodeRefused(const NodeRef& ref, const Result<client::HttpReply>& reply);
  void noteCreated(const std::string& node);
  // Places a create (its body as the client sent it) and relays the chosen node's answer; another node while
  // nodes refuse (429) or fail, up to max_place_attempts, then 429 naming why.
  void placeCreate(HttpExchange& ex, const std::string& raw, const placement::ClusterRequest& request,
                   const std::string& session);
  // POST /v1/sandboxes with "snapshot" (GatewaySnapshots.cc): the snapshot is looked up in the fleet's shared
  // store (a 404 or 400 is the answer), then the restore is placed like any create.
  void restoreSandbox(HttpExchange& ex, const std::string& raw, const nlohmann::json& body);
  // GET from any live node, the next one while a node cannot be reached; nullopt (and 503 sent) if none answered.
  std::optional<client::HttpReply> getFromAny(HttpExchange& ex, const std::string& target);
  void forwardToSandbox(HttpExchange& ex, const std::string& sandbox_id);
  void listSandboxes(HttpExchange& ex);
  void handleSessions(HttpExchange& ex, const std::vector<std::string>& segs);
  void fleetNodeInfo(HttpExchange& ex);
  // A request about what every node shares (layers, snapshots) to one live node, the next one while a node
  // cannot be reached.
  void forwardToAny(HttpExchange& ex);
  // POST /v1/call (and POST /run_code) to a live node offering fncall, round robin, another node on 429
  // (GatewayCall.cc). For /run_code the gateway's own errors have SandboxFusion's shape too.
  void forwardCall(HttpExchange& ex, bool run_code = false);
  // Sends the same request to every live node in parallel; (node, reply-or-error) per node.
  std::vector<std::pair<NodeRef, Result<client::HttpReply>>> fanOut(boost::beast::http::verb method,
                                                                    const std::string& target, const std::string& body);

  GatewayOptions options_;
  placement::ClusterPlacer placer_;
  // Keep-alive connections to the nodes for JSON calls (creates, probes, fan-out): see ConnectionPool.h.
  mutable client::ConnectionPool pool_;  // internally synchronised; callOptions() is const
  double started_ = 0;
  std::mutex mu_;
  std::map<std::string, Node> nodes_;
  // Session parameters seen in PUT/attach, so a create on a node that has not heard of the session yet
  // (it joined later) can create it there first.
  std::map<std::string, std::string> sessions_;
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  bool stopping_ = false;
  std::thread watcher_;
  std::atomic<uint64_t> call_next_{0};  // round robin of /v1/call
};

}  // namespace dsec::launcher
