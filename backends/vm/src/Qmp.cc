#include "Qmp.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <span>
#include <thread>

#include "dsec/common/FdIo.h"
#include "dsec/common/Strings.h"

namespace dsec::backends::vm {
namespace {

// QMP replies here are small (query-migrate, query-status); a line past this is a broken or hostile QEMU.
constexpr size_t kMaxLineBytes = 1 << 20;

int msLeft(double deadline) {
  double left = deadline - monotonicSeconds();
  if (left <= 0) return 0;
  return static_cast<int>(std::ceil(left * 1000));
}

Result<UniqueFd> connectUnix(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) return Error::invalid("socket path too long: " + path);
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) return Error::sys(errno, "socket");
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Error::sys(errno, "connect " + path);
  }
  return fd;
}

}  // namespace

Result<QmpClient> QmpClient::connect(const std::string& socket_path, double timeout_seconds) {
  const double deadline = monotonicSeconds() + timeout_seconds;
  Result<UniqueFd> fd = Error::internal("not tried");
  while (true) {
    fd = connectUnix(socket_path);
    if (fd.ok() || monotonicSeconds() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!fd.ok()) return fd.error().wrap("QEMU's monitor");
  QmpClient client(std::move(fd).value());
  DSEC_ASSIGN_OR_RETURN(auto greeting, client.readReply(deadline));
  if (!greeting.is_object() || !greeting.contains("QMP")) return Error::internal("QEMU's monitor: no greeting");
  DSEC_TRY(client.execute("qmp_capabilities", nullptr, std::max(0.1, deadline - monotonicSeconds())));
  return client;
}

Status QmpClient::sendLine(const std::string& line, int fd_to_pass, double deadline) {
  size_t sent = 0;
  while (sent < line.size()) {
    pollfd p{socket_.get(), POLLOUT, 0};
    int n = ::poll(&p, 1, msLeft(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error::sys(errno, "QEMU's monitor: poll");
    if (n == 0) return Error(ErrorCode::kTimeout, "QEMU's monitor: send timed out");
    std::string_view rest(line.data() + sent, line.size() - sent);
    if (fd_to_pass >= 0 && sent == 0) {
      std::array<int, 1> fds{fd_to_pass};
      DSEC_ASSIGN_OR_RETURN(size_t w, sendWithFds(socket_.get(), rest, std::span<const int>(fds), "QEMU's monitor"));
      sent += w;
      continue;
    }
    ssize_t w = ::send(socket_.get(), rest.data(), rest.size(), MSG_NOSIGNAL);
    if (w < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (w < 0) return Error::sys(errno, "QEMU's monitor: send");
    sent += static_cast<size_t>(w);
  }
  return okStatus();
}

Result<std::string> QmpClient::readLine(double deadline) {
  while (true) {
    size_t nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    if (buffer_.size() > kMaxLineBytes) return Error::internal("QEMU's monitor sent a line over 1 MiB");
    pollfd p{socket_.get(), POLLIN, 0};
    int n = ::poll(&p, 1, msLeft(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error::sys(errno, "QEMU's monitor: poll");
    if (n == 0) return Error(ErrorCode::kTimeout, "QEMU's monitor did not answer in time");
    char chunk[4096];
    ssize_t r = ::recv(socket_.get(), chunk, sizeof(chunk), 0);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r < 0) return Error::sys(errno, "QEMU's monitor: recv");
    if (r == 0) return Error(ErrorCode::kUnavailable, "QEMU's monitor closed (QEMU exited)");
    buffer_.append(chunk, static_cast<size_t>(r));
  }
}

Result<nlohmann::json> QmpClient::readReply(double deadline) {
  while (true) {
    DSEC_ASSIGN_OR_RETURN(std::string line, readLine(deadline));
    auto message = nlohmann::json::parse(line, nullptr, false);
    if (message.is_discarded() || !message.is_object()) return Error::internal("QEMU's monitor sent a bad message");
    if (message.contains("event")) continue;  // asynchronous; the caller polls state instead
    return message;
  }
}

Result<nlohmann::json> QmpClient::execute(const std::string& command, const nlohmann::json& arguments,
                                          double timeout_seconds) {
  const double deadline = monotonicSeconds() + timeout_seconds;
  nlohmann::json request{{"execute", command}};
  if (!arguments.is_null()) request["arguments"] = arguments;
  DSEC_TRY(sendLine(request.dump() + "\n", -1, deadline));
  DSEC_ASSIGN_OR_RETURN(auto reply, readReply(deadline));
  if (reply.contains("error")) {
    std::string desc = reply["error"].is_object() ? reply["error"].value("desc", "") : "";
    return Error(ErrorCode::kSystem, "QEMU refused " + command + ": " + desc.substr(0, 512));
  }
  if (!reply.contains("return")) return Error::internal("QEMU's monitor: no return for " + command);
  return reply["return"];
}

Status QmpClient::sendFd(const std::string& name, int fd, double timeout_seconds) {
  const double deadline = monotonicSeconds() + timeout_seconds;
  nlohmann::json request{{"execute", "getfd"}, {"arguments", {{"fdname", name}}}};
  DSEC_TRY(sendLine(request.dump() + "\n", fd, deadline));
  DSEC_ASSIGN_OR_RETURN(auto reply, readReply(deadline));
  if (reply.contains("error")) return Error(ErrorCode::kSystem, "QEMU refused the fd " + name);
  return okStatus();
}

Status QmpClient::waitMigration(double timeout_seconds) {
  const double deadline = monotonicSeconds() + timeout_seconds;
  auto pause = std::chrono::milliseconds(1);
  while (true) {
    DSEC_ASSIGN_OR_RETURN(auto info, execute("query-migrate", nullptr, std::max(0.1, deadline - monotonicSeconds())));
    std::string status = info.is_object() ? info.value("status", "") : "";
    if (status == "completed") return okStatus();
    if (status == "failed" || status == "cancelled") {
      std::string why = info.is_object() ? info.value("error-desc", "") : "";
      return Error(ErrorCode::kSystem, "migration " + status + ": " + why.substr(0, 512));
    }
    if (monotonicSeconds() >= deadline) return Error(ErrorCode::kTimeout, "migration still " + status);
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
  }
}

}  // namespace dsec::backends::vm
