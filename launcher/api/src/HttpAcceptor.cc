// The acceptor (HttpServer.h): accepts connections, refuses those over max_connections, and holds those over
// their client's budget of unauthenticated connections in a queue, without a thread, until a slot frees, their
// head shows a valid token, or their wait ends in 429.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "HttpWire.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/api/ClientKey.h"
#include "dsec/launcher/api/HttpServer.h"

namespace dsec::launcher {
namespace {

using http_wire::drainAvailable;
using http_wire::dumpJson;
using http_wire::kLog;
using http_wire::writeRawError;
using nlohmann::json;
constexpr int kAcceptBatch = 64;  // connections accepted per wakeup before queued ones are looked at again

}  // namespace

void HttpServer::acceptLoop() {
  while (!stopped_.load()) {
    int timeout_ms = 1000;
    if (queued_now_.load() > 0) {
      // Wake for the oldest queued connection's end of wait.
      double now = monotonicSeconds(), next = now + 1.0;
      for (const auto& [client, order] : queue_order_) {
        next = std::min(next, queued_.at(order.front()).accepted_at + queueWaitSeconds());
      }
      timeout_ms = std::max(0, static_cast<int>(std::ceil((next - now) * 1000)));
    }
    struct pollfd fds[4] = {{listen_fd_.get(), POLLIN, 0},
                            {stop_fd_.get(), POLLIN, 0},
                            {wake_fd_.get(), POLLIN, 0},
                            {queue_epoll_.get(), POLLIN, 0}};
    int n = ::poll(fds, 4, timeout_ms);
    reapFinished(false);
    if (n < 0 && errno != EINTR) {
      DSEC_LOG(kError, kLog) << "poll: " << strerror(errno);
      ::usleep(100 * 1000);
      continue;
    }
    if (fds[1].revents & POLLIN) break;
    if (fds[2].revents & POLLIN) {
      uint64_t v;
      (void)!::read(wake_fd_.get(), &v, sizeof(v));
    }
    if (fds[3].revents & POLLIN) recheckQueued();
    if (queued_now_.load() > 0) admitQueued();
    if (fds[0].revents & POLLIN) {
      for (int i = 0; i < kAcceptBatch && !stopped_.load(); ++i) {
        uint64_t before = stats_.accepted.load();
        acceptOne();
        if (stats_.accepted.load() == before) break;  // nothing more pending
      }
    }
  }
  // Stopping: queued connections get a 503 like any other over the cap.
  std::vector<int> left;
  for (const auto& [fd, q] : queued_) left.push_back(fd);
  for (int fd : left) {
    unqueue(fd);
    drainAvailable(fd);
    writeRawError(fd, 503, "Service Unavailable", "unavailable", "the server is stopping");
    ::close(fd);
  }
}

double HttpServer::queueWaitSeconds() const {
  return std::min(options_.client_queue_seconds, options_.header_timeout_seconds);
}

bool HttpServer::sentValidToken(int fd) {
  char buf[8192];
  ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_PEEK | MSG_DONTWAIT);
  if (n <= 0) return false;
  std::string_view head(buf, static_cast<size_t>(n));
  if (auto end = head.find("\r\n\r\n"); end != std::string_view::npos) head = head.substr(0, end + 2);
  // Complete header lines after the request line; the first Authorization one decides.
  constexpr std::string_view kName = "authorization:";
  for (size_t pos = head.find("\r\n"); pos != std::string_view::npos;) {
    size_t start = pos + 2;
    size_t next = head.find("\r\n", start);
    if (next == std::string_view::npos) break;
    std::string_view line = head.substr(start, next - start);
    if (line.size() > kName.size() && boost::beast::iequals(boost::beast::string_view(line.data(), kName.size()),
                                                            boost::beast::string_view(kName.data(), kName.size()))) {
      std::string_view value = line.substr(kName.size());
      while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
      while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
      return handler_->acceptsCredentials(value);
    }
    pos = next;
  }
  return false;
}

void HttpServer::acceptOne() {
  int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) {
    if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
      DSEC_LOG(kWarn, kLog) << "accept: " << strerror(errno);
      ::usleep(50 * 1000);
    }
    return;
  }
  stats_.accepted++;
  const double now = monotonicSeconds();
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (active_.load() >= options_.max_connections) {
    stats_.refused_busy++;
    drainAvailable(fd);
    writeRawError(fd, 503, "Service Unavailable", "unavailable",
                  "too many connections (" + std::to_string(options_.max_connections) + ")", "Retry-After: 1\r\n");
    handler_->onResponse(503);
    ::close(fd);
    return;
  }
  std::string client = clientKeyOf(fd);
  if (sentValidToken(fd)) {
    startConnection(fd, client, now, /*authenticated=*/true);
    return;
  }
  auto queued_it = queued_per_client_.find(client);
  const int queued_for_client = queued_it == queued_per_client_.end() ? 0 : queued_it->second;
  if (queued_for_client == 0 && client_budget_.tryTake(client)) {
    startConnection(fd, client, now, /*authenticated=*/false);
    return;
  }
  // Over the client's budget: wait here, without a thread, for one of its connections to authenticate or end,
  // or for this one's head to show the token; but only so many and so long.
  const int per_client_queue = std::max(client_budget_.perClient(), options_.max_connections / 4);
  if (queued_for_client < per_client_queue && queued_now_.load() < options_.max_connections) {
    enqueue(fd, client, now);
    return;
  }
  refuseForClient(fd, client);
}

void HttpServer::enqueue(int fd, const std::string& client, double accepted_at) {
  struct epoll_event ev {};
  ev.events = EPOLLIN | EPOLLET;
  ev.data.fd = fd;
  ::epoll_ctl(queue_epoll_.get(), EPOLL_CTL_ADD, fd, &ev);
  queued_[fd] = Queued{client, accepted_at};
  queue_order_[client].push_back(fd);
  queued_per_client_[client]++;
  queued_now_++;
  stats_.queued++;
  // The head may have arrived between the peek at accept and the registration (edge-triggered: no event).
  if (sentValidToken(fd)) {
    unqueue(fd);
    startConnection(fd, client, accepted_at, /*authenticated=*/true);
    return;
  }
  // A slot released after the caller's tryTake failed but before queued_now_ counted this one wrote no wake:
  // take it now, or this connection would wait for the next wake (up to a second) with a slot free.
  if (oldestQueued(client) == fd && client_budget_.tryTake(client)) {
    unqueue(fd);
    startConnection(fd, client, accepted_at, /*authenticated=*/false);
  }
}

int HttpServer::oldestQueued(const std::string& client) const {
  auto it = queue_order_.find(client);
  return it == queue_order_.end() ? -1 : it->second.front();
}

void HttpServer::unqueue(int fd) {
  auto it = queued_.find(fd);
  if (it == queued_.end()) return;
  ::epoll_ctl(queue_epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
  const std::string client = it->second.client;
  queued_.erase(it);
  queued_now_--;
  if (--queued_per_client_[client] <= 0) queued_per_client_.erase(client);
  // Removed from its place, wherever it is: a stale entry would alias the next connection the kernel gives
  // this fd number (another client's, charged to this client's budget).
  auto oit = queue_order_.find(client);
  if (oit != queue_order_.end()) {
    auto& order = oit->second;
    order.erase(std::find(order.begin(), order.end(), fd));
    if (order.empty()) queue_order_.erase(oit);
  }
}

void HttpServer::recheckQueued() {
  struct epoll_event events[64];
  for (;;) {
    int n = ::epoll_wait(queue_epoll_.get(), events, 64, 0);
    if (n <= 0) return;
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      auto it = queued_.find(fd);
      if (it == queued_.end() || active_.load() >= options_.max_connections || !sentValidToken(fd)) continue;
      Queued q = it->second;
      unqueue(fd);
      startConnection(fd, q.client, q.accepted_at, /*authenticated=*/true);
    }
    if (n < 64) return;
  }
}

void HttpServer::admitQueued() {
  const double now = monotonicSeconds();
  std::vector<std::string> clients;
  for (const auto& [client, order] : queue_order_) clients.push_back(client);
  for (const auto& client : clients) {
    // Those that waited long enough are refused first: one started now would have no time left for its head.
    for (int fd; (fd = oldestQueued(client)) >= 0 && now >= queued_.at(fd).accepted_at + queueWaitSeconds();) {
      unqueue(fd);
      refuseForClient(fd, client);
    }
    for (int fd; (fd = oldestQueued(client)) >= 0 && active_.load() < options_.max_connections &&
                 client_budget_.tryTake(client);) {
      const double accepted_at = queued_.at(fd).accepted_at;
      unqueue(fd);
      startConnection(fd, client, accepted_at, /*authenticated=*/false);
    }
  }
}

void HttpServer::refuseForClient(int fd, const std::string& client) {
  stats_.refused_client++;
  const int limit = client_budget_.perClient();
  std::string message = "too many connections without a valid token from this client (" + client + ": " +
                        std::to_string(limit) + "); send the bearer token, or retry later";
  std::string body = dumpJson(json{{"error",
                                    {{"code", "too_many_connections"},
                                     {"message", message},
                                     {"limit", limit},
                                     {"client", client},
                                     {"retry_after", 1}}}}) +
                     "\n";
  drainAvailable(fd);
  writeRawError(fd, 429, "Too Many Requests", "too_many_connections", message, "Retry-After: 1\r\n", body);
  handler_->onResponse(429);
  ::shutdown(fd, SHUT_WR);
  ::close(fd);
}

}  // namespace dsec::launcher
