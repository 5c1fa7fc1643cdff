// The per-client connection budget of the HTTP transport (docs/node-agent.md, "Connection budgets"): how many
// connections each client (ClientKey.h) holds that have not yet carried a request with a valid token, and how
// many all clients hold together. A client without the token can never hold more threads than this; a trainer
// or the gateway, whose connections authenticate on their first request, is only bounded by the server's
// overall connection cap. Thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

namespace dsec::launcher {

class ClientConnectionBudget {
 public:
  // per_client for each client, and `total` for all clients together (so that many users at once still leave
  // threads for connections with the token).
  ClientConnectionBudget(int per_client, int total) : per_client_(per_client), total_limit_(total) {}

  // Counts one more unauthenticated connection of `client`; false (nothing counted) at either budget.
  bool tryTake(const std::string& client);
  // One of them authenticated or ended.
  void give(const std::string& client);

  int perClient() const { return per_client_; }
  int totalLimit() const { return total_limit_; }
  int count(const std::string& client) const;
  int64_t total() const;  // unauthenticated connections of every client
  int largest() const;    // those of the client with the most

 private:
  const int per_client_;
  const int total_limit_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, int> counts_;
  int64_t total_ = 0;
};

}  // namespace dsec::launcher
