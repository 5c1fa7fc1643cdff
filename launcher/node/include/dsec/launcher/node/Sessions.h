// Sessions (docs/api.md "Sessions"): named leases held by a trainer. A SessionTable keeps name -> {lease,
// retention, expiry, state, sandbox ids}, persists each session atomically to <dir>/<name>.json (the node's own file
// format, Sessions.cc) and reloads them on restart. It decides *when* things happen (a lease lapses, a retention
// passes); the node agent does the pausing and destroying, so this class never calls a backend and is unit-tested on
// its own.
//
// Locking: one mutex over the table, never held while the caller pauses or destroys sandboxes.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dsec/common/Result.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/node/StateStore.h"

namespace dsec::launcher {

constexpr double kDefaultSessionLease = 60;
constexpr double kMinSessionLease = 1;
constexpr double kMaxSessionLease = 86400;
constexpr double kDefaultSessionRetention = 3600;
constexpr double kMaxSessionRetention = 604800;

// [A-Za-z0-9][A-Za-z0-9._-]{0,63}; the error names the rule.
Status validateSessionName(std::string_view name);

// What a PUT or an attach asks of a session (the API edge parses it: Requests.h); absent fields are nullopt.
struct SessionSettings {
  std::optional<double> lease;
  std::optional<double> retention;
};

struct Session {
  std::string name;
  double lease = kDefaultSessionLease;
  double retention = kDefaultSessionRetention;
  double expires_unix = 0;
  std::optional<double> lapsed_unix;  // set while the session is lapsed
  std::set<std::string> sandboxes;
  bool deleting = false;  // in memory only: a DELETE or the retention reaper is destroying its sandboxes

  bool lapsed() const { return lapsed_unix.has_value(); }
};

class SessionTable {
 public:
  explicit SessionTable(std::string dir);

  const std::string& dir() const { return dir_; }
  // Creates the directory and loads every <name>.json; unreadable or misnamed files are logged and removed.
  Status load();

  // PUT: creates the session (defaults for absent fields) or renews it (absent fields keep their values); a
  // lapsed session becomes active again. 409 while it is being deleted.
  Result<Session> put(const std::string& name, const SessionSettings& settings, double now);
  // attach: renews an existing session (404 if unknown); absent lease keeps the session's lease.
  Result<Session> renew(const std::string& name, std::optional<double> lease, double now);
  Result<Session> get(const std::string& name);
  std::vector<Session> list();

  // Whether a new sandbox may join: 404 unknown or being deleted, 409 lapsed.
  Status checkJoinable(const std::string& name);
  // Adds a created sandbox (same checks as checkJoinable, then persists).
  Status addSandbox(const std::string& name, const std::string& id);
  // Removes a destroyed sandbox; unknown names or ids are ignored.
  void removeSandbox(const std::string& name, const std::string& id);

  // DELETE: marks the session as being deleted and returns its sandboxes (404 if unknown or already being
  // deleted). Then the caller destroys them and calls erase() or, if that failed, cancelDelete().
  Result<std::vector<std::string>> beginDelete(const std::string& name);
  void erase(const std::string& name);
  void cancelDelete(const std::string& name);

  struct Due {
    // Sessions whose lease lapsed at this tick, with their sandboxes (to pause).
    std::vector<std::pair<std::string, std::vector<std::string>>> lapsed;
    // Lapsed sessions past their retention, now marked deleting, with their sandboxes (to destroy, then erase).
    std::vector<std::pair<std::string, std::vector<std::string>>> expired;
  };
  // Called by the reaper: marks (and persists) sessions whose lease ran out as lapsed.
  Due tick(double now);

  // After a restart: `members` maps each re-adopted sandbox id to its session. Ids of sandboxes that no
  // longer exist are dropped; a member a session does not list (a crash between the two writes) is added;
  // a member of an unknown session gets that session back with an already expired lease, so it is paused and
  // kept for the default retention rather than lost or left running unowned.
  void reconcile(const std::map<std::string, std::string>& members, double now);

  int64_t countActive();
  int64_t countLapsed();
  uint64_t lapsesTotal() const { return lapses_total_.load(); }

 private:
  std::string pathOf(const std::string& name) const { return dir_ + "/" + name + ".json"; }
  Status persistLocked(const Session& session);
  void removeFileLocked(const std::string& name);

  std::string dir_;
  std::mutex mu_;
  std::map<std::string, Session> sessions_;
  std::atomic<uint64_t> lapses_total_{0};
};

}  // namespace dsec::launcher
