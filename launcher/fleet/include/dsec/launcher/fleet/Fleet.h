// The fleet's wiring between processes: streamed forwarding of a client's request to a node agent over the
// shared HTTP client (api/HttpClient.h), and the registrar a node runs to
// (re-)register itself with the gateway and heartbeat. Every wait has a timeout and an abort fd, so a node
// that stops answering can never pin a gateway thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"
#include "dsec/launcher/api/HttpClient.h"
#include "dsec/launcher/api/HttpServer.h"

namespace dsec::launcher::fleet {

// Forwards the client's request in `ex` to the node and streams the node's answer back: bodies go through in
// pieces (uploads, downloads, NDJSON exec output), never whole. `body` is used instead of reading `ex` when
// the caller already read it (pre_read). Returns an error only when nothing was sent to the client yet (the
// caller answers, e.g. 503); a failure midway ends the client's response early (the connection closes).
// With held_back, an answer of status hold_back_status (a 429 the caller tries elsewhere) is read into it
// (at most 1 MiB) instead of being relayed, and nothing is sent to the client.
Status forward(HttpExchange& ex, const std::string& endpoint, const std::string& token,
               const client::CallOptions& options, const std::string* pre_read_body = nullptr, int hold_back_status = 0,
               std::optional<client::HttpReply>* held_back = nullptr);

// Whether the client asks to switch to WebSocket (the terminal route).
bool isUpgradeRequest(const HttpExchange& ex);
// Tunnels a WebSocket upgrade to the node: the handshake goes there with the fleet's token; a 101 is passed on
// and then bytes flow both ways, unparsed, until either side closes; another answer is relayed as it is.
// Returns an error only when nothing was sent to the client (the caller answers, e.g. 503).
Status tunnelUpgrade(HttpExchange& ex, const std::string& endpoint, const std::string& token,
                     const client::CallOptions& options);

// A node's registration with the fleet's gateways (every candidate; they are active-active and each keeps its
// own node table): POST /v1/fleet/nodes to each every `interval` seconds, one thread per gateway so that a dead
// one never delays the others, with its name, endpoint, capacity, and from its own GET /v1/node its backends,
// sandbox count and admission state (what its density controller admits by), so every gateway places as the node
// admits and a restarted gateway relearns the fleet within one interval. drain() tells the gateways to place
// nothing more here and waits until the node's sandboxes are gone (or the timeout), then deregisters.
struct RegistrarOptions {
  std::vector<std::string> gateways;  // gateway endpoints (candidates, in the fleet file's order)
  std::string token;                  // fleet token
  std::string name;                   // node name
  std::string endpoint;               // node API endpoint reachable from the gateways
  double cpus = 0;                    // capacity (hwloc)
  int64_t memory_bytes = 0;
  double interval_seconds = 1.0;
};

class NodeRegistrar {
 public:
  explicit NodeRegistrar(RegistrarOptions options);
  ~NodeRegistrar();
  NodeRegistrar(const NodeRegistrar&) = delete;
  NodeRegistrar& operator=(const NodeRegistrar&) = delete;

  void start();
  // One registration now with every gateway (also what the background threads do); ok when at least one took
  // it. A gateway's answer says whether the node is draining (an operator drained it there).
  Status registerOnce();
  // Marks the node draining at the gateways and waits until it has no sandboxes or timeout_seconds passed;
  // returns the number of sandboxes left.
  int64_t drain(double timeout_seconds);
  // Removes the node from the gateways' tables (best effort) and stops the heartbeat.
  void deregister();
  void stop();
  bool drainRequested() const { return drain_requested_.load(); }

 private:
  void loop(size_t gateway);
  Status registerWith(size_t gateway);
  nlohmann::json registration(bool draining);
  int64_t ownSandboxCount();

  RegistrarOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool draining_ = false;
  std::atomic<bool> drain_requested_{false};
  std::unique_ptr<std::atomic<bool>[]> warned_;  // per gateway: an outage is logged once
  std::vector<std::thread> threads_;
};

}  // namespace dsec::launcher::fleet
