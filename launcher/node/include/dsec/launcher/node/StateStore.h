// Where a node keeps its sandboxes' records (StateRecord.h). FileStateStore is the real one: a file per sandbox
// under <root>/state/sandboxes, written atomically. InMemoryStateStore keeps them in memory, for simulated nodes
// (whose sandboxes hold no processes to re-adopt) and for tests of the node core.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dsec/common/Result.h"
#include "dsec/launcher/node/StateRecord.h"

namespace dsec::launcher {

// One record found at start-up. A record that does not decode comes back as an error with what the backend
// needs to reap what is left of it.
struct StoredState {
  std::string id;
  Result<SandboxStateRecord> record;
  nlohmann::json backend_state;
};

class StateStore {
 public:
  virtual ~StateStore() = default;
  virtual Status save(const SandboxStateRecord& record) = 0;
  virtual Status remove(const std::string& id) = 0;
  virtual Result<std::vector<StoredState>> loadAll() = 0;
};

class FileStateStore : public StateStore {
 public:
  // The directory is created (0700) on first use.
  explicit FileStateStore(std::string dir) : dir_(std::move(dir)) {}
  Status save(const SandboxStateRecord& record) override;
  Status remove(const std::string& id) override;
  Result<std::vector<StoredState>> loadAll() override;
  std::string pathOf(const std::string& id) const { return dir_ + "/" + id + ".json"; }

 private:
  std::string dir_;
};

class InMemoryStateStore : public StateStore {
 public:
  Status save(const SandboxStateRecord& record) override;
  Status remove(const std::string& id) override;
  Result<std::vector<StoredState>> loadAll() override;
  size_t size();

 private:
  std::mutex mu_;
  std::map<std::string, std::string> encoded_;  // encoded as on disk, so tests exercise the codec
};

}  // namespace dsec::launcher
