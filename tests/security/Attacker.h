// Support for the HTTP edge security tests: the attacker tool run as another user of the node (uid 65534,
// as any Slurm user would be), and a raw client that picks its source address.
#pragma once

#include <sys/types.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"

namespace dsec::testing {

constexpr uid_t kAttackerUid = 65534;  // nobody

// dsec_http_attacker (HttpAttacker.cc) running as kAttackerUid/kAttackerUid, its report read at finish().
class AttackerProcess {
 public:
  // Starts it with `args` (mode first). Fails if it cannot (not root, tool missing).
  static Result<std::unique_ptr<AttackerProcess>> start(const std::vector<std::string>& args);
  ~AttackerProcess();
  // Waits for it to end and returns its report ({"connections": [...], "ran": seconds}).
  Result<nlohmann::json> finish();

 private:
  AttackerProcess(pid_t pid, UniqueFd out) : pid_(pid), out_(std::move(out)) {}
  pid_t pid_;
  UniqueFd out_;
};

// One request on a new connection from `source` (bound before connect) with "Connection: close"; returns what
// came back until the server closed (or timeout_seconds passed). status() parses the status line.
std::string rawRequest(int port, const std::string& source, const std::string& request, double timeout_seconds);
int statusOf(const std::string& answer);
// The JSON body of a raw answer (null if none).
nlohmann::json bodyOf(const std::string& answer);

}  // namespace dsec::testing
