// The gateway's WebSocket tunnel (Fleet.h, tunnelUpgrade): the handshake goes to the node with the fleet's
// token; once the node switched protocols, bytes are copied both ways unparsed until either side closes. The
// node enforces the protocol and its limits; the gateway holds no more than one read buffer per direction.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/beast/core/string.hpp>
#include <cerrno>
#include <cstring>

#include "dsec/common/Endpoint.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/fleet/Fleet.h"

namespace dsec::launcher::fleet {
namespace {

namespace http = boost::beast::http;
constexpr size_t kHeadLimit = size_t{64} * 1024;
constexpr size_t kRelayChunk = size_t{64} * 1024;

// Writes all of data to fd (non-blocking) within timeout_ms of no progress; false when it cannot.
bool writeAll(int fd, const char* data, size_t size, int stop_fd, int timeout_ms) {
  size_t off = 0;
  while (off < size) {
    ssize_t n = ::send(fd, data + off, size - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EINTR) return false;
    pollfd fds[2] = {{fd, POLLOUT, 0}, {stop_fd, POLLIN, 0}};
    int rc = poll(fds, 2, timeout_ms);
    if (rc <= 0 || fds[1].revents != 0 || (fds[0].revents & (POLLERR | POLLHUP)) != 0) return false;
  }
  return true;
}

}  // namespace

bool isUpgradeRequest(const HttpExchange& ex) {
  return boost::beast::iequals(ex.head()[http::field::upgrade], "websocket");
}

Status tunnelUpgrade(HttpExchange& ex, const std::string& endpoint, const std::string& token,
                     const client::CallOptions& options) {
  DSEC_ASSIGN_OR_RETURN(auto ep, parseEndpoint(endpoint));
  DSEC_ASSIGN_OR_RETURN(UniqueFd node, client::connectTo(endpoint, options));
  const int io_ms = options.io_timeout_ms > 0 ? options.io_timeout_ms : 30000;
  std::string head = "GET " + std::string(ex.target()) + " HTTP/1.1\r\n";
  for (const auto& field : ex.head()) {
    const auto name = field.name();
    if (name == http::field::authorization || name == http::field::host) continue;
    head += std::string(field.name_string()) + ": " + std::string(field.value()) + "\r\n";
  }
  head += "Host: " + ep.hostPort() + "\r\nAuthorization: Bearer " + token + "\r\n\r\n";
  if (!writeAll(node.get(), head.data(), head.size(), ex.stopFd(), io_ms)) {
    return Error(ErrorCode::kUnavailable, "sending the terminal handshake to " + endpoint + " failed");
  }
  // The node's answer head, then whatever came after it.
  std::string answer;
  size_t end = std::string::npos;
  while ((end = answer.find("\r\n\r\n")) == std::string::npos) {
    if (answer.size() > kHeadLimit) return Error(ErrorCode::kUnavailable, "the node's handshake answer is too long");
    pollfd fds[2] = {{node.get(), POLLIN, 0}, {ex.stopFd(), POLLIN, 0}};
    int rc = poll(fds, 2, io_ms);
    if (rc <= 0 || fds[1].revents != 0) return Error(ErrorCode::kUnavailable, "no handshake answer from " + endpoint);
    char buf[4096];
    ssize_t n = read(node.get(), buf, sizeof buf);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) return Error(ErrorCode::kUnavailable, endpoint + " closed during the terminal handshake");
    answer.append(buf, static_cast<size_t>(n));
  }
  std::string rest = answer.substr(end + 4);
  auto lines = split(answer.substr(0, end), '\n');
  int status = 0;
  if (!lines.empty() && lines[0].size() >= 12) status = std::atoi(lines[0].c_str() + 9);
  HttpExchange::Fields fields;
  std::string content_type = "application/json";
  size_t content_length = 0;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::string line = trim(lines[i]);
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = trim(line.substr(0, colon)), value = trim(line.substr(colon + 1));
    if (boost::beast::iequals(name, "Content-Type")) {
      content_type = value;
    } else if (boost::beast::iequals(name, "Content-Length")) {
      content_length = static_cast<size_t>(std::strtoull(value.c_str(), nullptr, 10));
    } else if (!boost::beast::iequals(name, "Server") && !boost::beast::iequals(name, "Connection") &&
               !boost::beast::iequals(name, "Transfer-Encoding")) {
      fields.emplace_back(name, value);
    }
  }
  if (status != 101) {
    // An HTTP answer (404, 401, 426...): relayed as one, with its body.
    while (rest.size() < content_length && rest.size() < kHeadLimit) {
      pollfd p{node.get(), POLLIN, 0};
      if (poll(&p, 1, io_ms) <= 0) break;
      char buf[4096];
      ssize_t n = read(node.get(), buf, sizeof buf);
      if (n <= 0) break;
      rest.append(buf, static_cast<size_t>(n));
    }
    ex.sendText(status == 0 ? 502 : status, content_type, rest.substr(0, content_length), fields);
    return okStatus();
  }
  fields.emplace_back("Connection", "Upgrade");
  std::string early;
  if (!ex.switchProtocols(fields, &early)) return okStatus();
  const int client = ex.socketFd();
  if (!writeAll(node.get(), early.data(), early.size(), ex.stopFd(), io_ms) ||
      !writeAll(client, rest.data(), rest.size(), ex.stopFd(), io_ms)) {
    return okStatus();
  }
  // Both ways until either side ends; a side that takes nothing for a minute is gone.
  std::vector<char> buf(kRelayChunk);
  for (;;) {
    pollfd fds[3] = {{client, POLLIN, 0}, {node.get(), POLLIN, 0}, {ex.stopFd(), POLLIN, 0}};
    if (poll(fds, 3, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[2].revents != 0) break;
    bool done = false;
    for (int side = 0; side < 2 && !done; ++side) {
      if (fds[side].revents == 0) continue;
      const int from = side == 0 ? client : node.get();
      const int to = side == 0 ? node.get() : client;
      ssize_t n = read(from, buf.data(), buf.size());
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n <= 0 || !writeAll(to, buf.data(), static_cast<size_t>(n), ex.stopFd(), 60000)) done = true;
    }
    if (done) break;
  }
  return okStatus();
}

}  // namespace dsec::launcher::fleet
