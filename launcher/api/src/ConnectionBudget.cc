// The per-client connection budget (ConnectionBudget.h).
#include "dsec/launcher/api/ConnectionBudget.h"

#include <algorithm>

namespace dsec::launcher {

bool ClientConnectionBudget::tryTake(const std::string& client) {
  std::lock_guard lock(mu_);
  if (total_ >= total_limit_) return false;
  int& n = counts_[client];
  if (n >= per_client_) return false;
  ++n;
  ++total_;
  return true;
}

void ClientConnectionBudget::give(const std::string& client) {
  std::lock_guard lock(mu_);
  auto it = counts_.find(client);
  if (it == counts_.end() || it->second <= 0) return;
  --total_;
  if (--it->second == 0) counts_.erase(it);
}

int ClientConnectionBudget::count(const std::string& client) const {
  std::lock_guard lock(mu_);
  auto it = counts_.find(client);
  return it == counts_.end() ? 0 : it->second;
}

int ClientConnectionBudget::largest() const {
  std::lock_guard lock(mu_);
  int most = 0;
  for (const auto& [client, n] : counts_) most = std::max(most, n);
  return most;
}

int64_t ClientConnectionBudget::total() const {
  std::lock_guard lock(mu_);
  return total_;
}

}  // namespace dsec::launcher
