// Where a node keeps its sandboxes' records (StateRecord.h). FileStateStore is the real one: a file per sandbox
// under <root>/state/sandboxes, written atomically. DiscardingStateStore keeps nothing: the store of simulated
// nodes, whose sandboxes hold no processes a restarted node could re-adopt (a record per create was a third of
// the CPU of `dsec bench gateway` when they were written).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dsec/common/Result.h"
#include "dsec/common/Strings.h"
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
  // Called once before anything else; a store that cannot hold records fails the node's start.
  virtual Status prepare() = 0;
  virtual Status save(const SandboxStateRecord& record) = 0;
  virtual Status remove(const std::string& id) = 0;
  virtual Result<std::vector<StoredState>> loadAll() = 0;
};

class FileStateStore : public StateStore {
 public:
  explicit FileStateStore(std::string dir) : dir_(std::move(dir)) {}
  Status prepare() override;  // creates the directory (0700)
  Status save(const SandboxStateRecord& record) override;
  Status remove(const std::string& id) override;
  Result<std::vector<StoredState>> loadAll() override;
  std::string pathOf(const std::string& id) const { return dir_ + "/" + id + ".json"; }

 private:
  std::string dir_;
};

class DiscardingStateStore : public StateStore {
 public:
  Status prepare() override { return okStatus(); }
  Status save(const SandboxStateRecord&) override { return okStatus(); }
  Status remove(const std::string&) override { return okStatus(); }
  Result<std::vector<StoredState>> loadAll() override { return std::vector<StoredState>{}; }
};

// Writes a state file (a sandbox's record, a session): atomically, mode 0600, without fsync (these files only
// matter while the node's sandboxes live, which no power loss survives).
inline Status writeStateFile(const std::string& path, const std::string& text) {
  return writeFileAtomic(path, text, 0600, Durability::kSurvivesAgentCrash);
}
// The *.json state files in dir (names only), after deleting the temp files of writes a crash cut short.
Result<std::vector<std::string>> listStateFiles(const std::string& dir);

}  // namespace dsec::launcher
