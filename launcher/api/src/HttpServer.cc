// HttpServer (HttpServer.h): its start (the listening socket and the endpoint it is reached at), stop, and its
// counters. The acceptor is in HttpAcceptor.cc, a connection's thread in HttpConnection.cc.
#include "dsec/launcher/api/HttpServer.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "dsec/common/Endpoint.h"
#include "dsec/common/Prometheus.h"

namespace dsec::launcher {

using nlohmann::json;

namespace {

// A listening socket, non-blocking, on the listen address.
Result<UniqueFd> listenOn(const std::string& listen) {
  DSEC_ASSIGN_OR_RETURN(Endpoint addr, parseListenAddress(listen));
  struct addrinfo hints {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  struct addrinfo* res = nullptr;
  std::string port_text = std::to_string(addr.port);
  int gai = ::getaddrinfo(addr.host.c_str(), port_text.c_str(), &hints, &res);
  if (gai != 0) return Error::invalid("listen address '" + listen + "': " + gai_strerror(gai));
  std::unique_ptr<struct addrinfo, decltype(&::freeaddrinfo)> res_guard(res, ::freeaddrinfo);
  UniqueFd fd(::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) return Error::sys(errno, "socket");
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), res->ai_addr, res->ai_addrlen) != 0) return Error::sys(errno, "bind " + listen);
  if (::listen(fd.get(), 4096) != 0) return Error::sys(errno, "listen " + listen);
  return fd;
}

struct BoundAddress {
  int port = 0;
  std::string endpoint;  // "http://host:port"; a wildcard address is named by its loopback
};

Result<BoundAddress> boundAddress(int fd) {
  struct sockaddr_storage ss {};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd, reinterpret_cast<struct sockaddr*>(&ss), &len) != 0) return Error::sys(errno, "getsockname");
  BoundAddress bound;
  char host[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET6) {
    auto* sin6 = reinterpret_cast<struct sockaddr_in6*>(&ss);
    bound.port = ntohs(sin6->sin6_port);
    if (IN6_IS_ADDR_UNSPECIFIED(&sin6->sin6_addr)) {
      std::strcpy(host, "::1");
    } else {
      ::inet_ntop(AF_INET6, &sin6->sin6_addr, host, sizeof(host));
    }
    bound.endpoint = "http://[" + std::string(host) + "]:" + std::to_string(bound.port);
  } else {
    auto* sin = reinterpret_cast<struct sockaddr_in*>(&ss);
    bound.port = ntohs(sin->sin_port);
    if (sin->sin_addr.s_addr == htonl(INADDR_ANY)) {
      std::strcpy(host, "127.0.0.1");  // reachable locally; remote clients use the node's own address
    } else {
      ::inet_ntop(AF_INET, &sin->sin_addr, host, sizeof(host));
    }
    bound.endpoint = "http://" + std::string(host) + ":" + std::to_string(bound.port);
  }
  return bound;
}

Result<UniqueFd> eventFd() {
  UniqueFd fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!fd) return Error::sys(errno, "eventfd");
  return fd;
}

}  // namespace

Result<std::unique_ptr<HttpServer>> HttpServer::start(const HttpServerOptions& options, RequestHandler* handler) {
  DSEC_TRY(validateHttpServerOptions(options));
  DSEC_ASSIGN_OR_RETURN(UniqueFd listen_fd, listenOn(options.listen));
  DSEC_ASSIGN_OR_RETURN(BoundAddress bound, boundAddress(listen_fd.get()));
  std::unique_ptr<HttpServer> server(new HttpServer(options, handler));
  server->port_ = bound.port;
  server->endpoint_ = std::move(bound.endpoint);
  server->listen_fd_ = std::move(listen_fd);
  DSEC_ASSIGN_OR_RETURN(server->stop_fd_, eventFd());
  DSEC_ASSIGN_OR_RETURN(server->wake_fd_, eventFd());
  server->queue_epoll_ = UniqueFd(::epoll_create1(EPOLL_CLOEXEC));
  if (!server->queue_epoll_) return Error::sys(errno, "epoll_create1");
  handler->attachTransport(server.get());
  server->acceptor_ = std::thread([s = server.get()] { s->acceptLoop(); });
  return server;
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::stop() {
  if (stopped_.exchange(true)) return;
  uint64_t one = 1;
  if (stop_fd_) (void)!::write(stop_fd_.get(), &one, sizeof(one));
  if (acceptor_.joinable()) acceptor_.join();
  reapFinished(true);
  listen_fd_.reset();
  if (handler_->transport() == this) handler_->attachTransport(nullptr);
}

void HttpServer::reapFinished(bool all) {
  std::list<ConnThread> finished;
  {
    std::lock_guard lock(mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (all || it->done->load()) {
        finished.splice(finished.end(), conns_, it++);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : finished) {
    if (c.thread.joinable()) c.thread.join();
  }
}

void HttpServer::renderMetrics(std::string* out) const {
  auto line = [out](const char* type, const std::string& name, uint64_t v) {
    prometheus::family(out, name, type);
    prometheus::sample(out, name, prometheus::number(v));
  };
  line("gauge", "dsec_http_connections", static_cast<uint64_t>(activeConnections()));
  line("gauge", "dsec_http_connections_max", static_cast<uint64_t>(options_.max_connections));
  line("gauge", "dsec_http_unauthenticated_connections", static_cast<uint64_t>(unauthenticatedConnections()));
  line("gauge", "dsec_http_client_connections_max", static_cast<uint64_t>(client_budget_.perClient()));
  line("gauge", "dsec_http_queued_connections", static_cast<uint64_t>(queuedConnections()));
  line("counter", "dsec_http_connections_accepted_total", stats_.accepted.load());
  line("counter", "dsec_http_connections_queued_total", stats_.queued.load());
  using prometheus::number;
  prometheus::family(out, "dsec_http_connections_refused_total", "counter");
  prometheus::sample(out, "dsec_http_connections_refused_total", {{"reason", "busy"}},
                     number(stats_.refused_busy.load()));
  prometheus::sample(out, "dsec_http_connections_refused_total", {{"reason", "client_budget"}},
                     number(stats_.refused_client.load()));
  prometheus::family(out, "dsec_http_request_timeouts_total", "counter");
  prometheus::sample(out, "dsec_http_request_timeouts_total", {{"part", "header"}},
                     number(stats_.header_timeouts.load()));
  prometheus::sample(out, "dsec_http_request_timeouts_total", {{"part", "body"}}, number(stats_.body_timeouts.load()));
}

json HttpServer::info() const {
  return json{{"connections", activeConnections()},
              {"max_connections", options_.max_connections},
              {"unauthenticated_connections", unauthenticatedConnections()},
              {"largest_client_unauthenticated", client_budget_.largest()},
              {"max_client_connections", client_budget_.perClient()},
              {"max_unauthenticated_connections", client_budget_.totalLimit()},
              {"queued_connections", queuedConnections()},
              {"header_timeout", options_.header_timeout_seconds},
              {"body_timeout", options_.body_timeout_seconds},
              {"body_min_rate", options_.body_min_rate},
              {"accepted", stats_.accepted.load()},
              {"queued", stats_.queued.load()},
              {"refused_busy", stats_.refused_busy.load()},
              {"refused_client_budget", stats_.refused_client.load()},
              {"header_timeouts", stats_.header_timeouts.load()},
              {"body_timeouts", stats_.body_timeouts.load()}};
}

}  // namespace dsec::launcher
