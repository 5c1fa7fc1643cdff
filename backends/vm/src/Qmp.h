// A client of QEMU's machine protocol (QMP) on the unix socket a sandbox's QEMU listens on. QEMU runs guest
// code (under TCG, translated in its own address space), so it is not trusted either: every line it sends is
// bounded, and every wait has a deadline.
#pragma once

#include <deque>
#include <nlohmann/json.hpp>
#include <string>

#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"

namespace dsec::backends::vm {

class QmpClient {
 public:
  // Connects (retrying until the socket exists and accepts, up to timeout_seconds), reads the greeting and
  // enters command mode.
  static Result<QmpClient> connect(const std::string& socket_path, double timeout_seconds);

  // Runs one command; its "return" value, or the error QEMU gave (kSystem naming the command and QEMU's text).
  Result<nlohmann::json> execute(const std::string& command, const nlohmann::json& arguments = nullptr,
                                 double timeout_seconds = 10);
  // Hands an fd to QEMU under `name` (getfd with SCM_RIGHTS), for migrate / migrate-incoming "fd:NAME".
  Status sendFd(const std::string& name, int fd, double timeout_seconds = 10);
  // Polls query-migrate until it completes; kSystem with QEMU's reason when it fails, kTimeout after the deadline.
  Status waitMigration(double timeout_seconds);

 private:
  explicit QmpClient(UniqueFd socket) : socket_(std::move(socket)) {}
  Status sendLine(const std::string& line, int fd_to_pass, double deadline);
  // The next message that is not an event (events are kept, bounded, for nobody: dropped).
  Result<nlohmann::json> readReply(double deadline);
  Result<std::string> readLine(double deadline);

  UniqueFd socket_;
  std::string buffer_;
};

}  // namespace dsec::backends::vm
