// HTTP/1.1 transport (HttpServer.h): the socket stream with its deadlines, one exchange per request, and the
// acceptor with the connection caps and the per-client queue.
#include "dsec/launcher/api/HttpServer.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/error.hpp>
#include <boost/asio/write.hpp>
#include <cmath>
#include <cstring>
#include <limits>

#include "dsec/common/Logging.h"
#include "dsec/common/Prometheus.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/api/ClientKey.h"

namespace dsec::launcher {
namespace {

namespace net = boost::asio;
using nlohmann::json;
constexpr const char* kLog = "http";
constexpr size_t kStreamBuffer = size_t{256} * 1024;
constexpr int kAcceptBatch = 64;  // connections accepted per wakeup before queued ones are looked at again

std::string dumpJson(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string errorBody(const std::string& code, const std::string& message) {
  return dumpJson(json{{"error", {{"code", code}, {"message", message}}}}) + "\n";
}

// For failures before there is a request to answer (unparsable or late head, too many connections).
void writeRawError(int fd, int status, const char* reason, const std::string& code, const std::string& message,
                   const std::string& extra_headers = "", const std::string& body_override = "") {
  std::string body = body_override.empty() ? errorBody(code, message) : body_override;
  std::string text = "HTTP/1.1 " + std::to_string(status) + " " + reason +
                     "\r\nServer: dsec\r\nContent-Type: application/json\r\nConnection: close\r\n" + extra_headers +
                     "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  // Best effort, never blocking the caller: the socket buffer of a fresh connection takes this whole.
  (void)::send(fd, text.data(), text.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

// Reads and drops what the client already sent (without waiting), so that closing after an early answer sends
// a FIN rather than a reset that could destroy the answer before the client reads it.
void drainAvailable(int fd) {
  char sink[16 * 1024];
  for (int i = 0; i < 16; ++i) {
    ssize_t n = ::recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
    if (n <= 0) break;
  }
}

std::string secondsText(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", s);
  return buf;
}

bool isQuietDisconnect(const boost::system::error_code& ec) {
  return ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::timed_out ||
         ec == net::error::operation_aborted || ec == net::error::connection_reset || ec == net::error::broken_pipe ||
         ec == http::error::partial_message;
}

}  // namespace

// ---- SocketStream -------------------------------------------------------------------------------------

void SocketStream::setDeadline(double monotonic_seconds) {
  deadline_ = monotonic_seconds;
  expired_ = false;
}

void SocketStream::startRateFloor(double grace_seconds, double min_bytes_per_second) {
  floor_active_ = true;
  floor_grace_ = grace_seconds;
  floor_rate_ = min_bytes_per_second;
  floor_waited_ = 0;
  floor_received_ = 0;
  expired_ = false;
}

void SocketStream::stopRateFloor() { floor_active_ = false; }

bool SocketStream::wait(short events, boost::system::error_code& ec) {
  const bool floor = floor_active_ && (events & POLLIN);
  for (;;) {
    int timeout = timeout_ms_;
    bool limited = false;  // the wait is cut short by the deadline or the rate floor, not by inactivity
    double now = (deadline_ > 0 || floor) ? monotonicSeconds() : 0;
    auto limitTo = [&](double left) {
      if (left <= 0) return false;
      double ms = std::ceil(left * 1000);
      if (ms < timeout) {
        timeout = static_cast<int>(ms);
        limited = true;
      }
      return true;
    };
    if ((deadline_ > 0 && !limitTo(deadline_ - now)) ||
        (floor && !limitTo(floor_grace_ + static_cast<double>(floor_received_) / floor_rate_ - floor_waited_))) {
      expired_ = true;
      ec = net::error::timed_out;
      return false;
    }
    struct pollfd fds[2] = {{fd_, events, 0}, {stop_fd_, POLLIN, 0}};
    int n = ::poll(fds, stop_fd_ >= 0 ? 2 : 1, timeout);
    if (floor) floor_waited_ += monotonicSeconds() - now;
    if (n < 0) {
      if (errno == EINTR) continue;
      ec = boost::system::error_code(errno, boost::system::system_category());
      return false;
    }
    if (n == 0) {
      if (limited) continue;  // the next round finds the deadline passed
      ec = net::error::timed_out;
      return false;
    }
    if (stop_fd_ >= 0 && (fds[1].revents & POLLIN)) {
      ec = net::error::operation_aborted;
      return false;
    }
    return true;  // ready, or an error the next recv/send reports
  }
}

size_t SocketStream::readSome(void* data, size_t size, boost::system::error_code& ec) {
  for (;;) {
    ssize_t n = ::recv(fd_, data, size, 0);
    if (n > 0) {
      if (floor_active_) floor_received_ += static_cast<uint64_t>(n);
      ec = {};
      return static_cast<size_t>(n);
    }
    if (n == 0) {
      ec = net::error::eof;
      return 0;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait(POLLIN, ec)) return 0;
      continue;
    }
    ec = boost::system::error_code(errno, boost::system::system_category());
    return 0;
  }
}

size_t SocketStream::writeSome(struct iovec* iov, int count, boost::system::error_code& ec) {
  for (;;) {
    struct msghdr msg {};
    msg.msg_iov = iov;
    msg.msg_iovlen = count;
    ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (n >= 0) {
      ec = {};
      return static_cast<size_t>(n);
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait(POLLOUT, ec)) return 0;
      continue;
    }
    ec = boost::system::error_code(errno, boost::system::system_category());
    return 0;
  }
}

// ---- HttpExchange -------------------------------------------------------------------------------------

HttpExchange::HttpExchange(SocketStream& stream, boost::beast::flat_buffer& buffer,
                           std::unique_ptr<http::request_parser<http::empty_body>> parser,
                           ConnectionContext* connection)
    : stream_(stream),
      connection_(connection),
      buffer_(buffer),
      parser_(std::move(parser)),
      head_(parser_->get().base()) {
  body_done_ = parser_->is_done();
  keep_alive_ = parser_->get().keep_alive();
}

HttpExchange::~HttpExchange() = default;

bool HttpExchange::hasBody() const { return !parser_ || !parser_->is_done(); }
bool HttpExchange::bodyPending() const { return !body_done_; }

std::optional<uint64_t> HttpExchange::contentLength() const {
  if (!parser_) return std::nullopt;
  auto cl = parser_->content_length();
  if (!cl) return std::nullopt;
  return *cl;
}

void HttpExchange::markAuthenticated() {
  if (connection_ != nullptr && connection_->on_authenticated) connection_->on_authenticated();
}

const std::string& HttpExchange::client() const {
  static const std::string kUnknown = "unknown";
  return connection_ != nullptr ? connection_->client : kUnknown;
}

void HttpExchange::bodyReadFailed(const boost::system::error_code& ec) {
  broken_ = true;
  if (!stream_.deadlineExpired()) return;
  if (connection_ != nullptr && connection_->stats != nullptr) connection_->stats->body_timeouts++;
  keep_alive_ = false;
  broken_ = false;  // long enough to say why
  double grace = connection_ ? connection_->body_timeout_seconds : 0;
  double rate = connection_ ? connection_->body_min_rate : 0;
  sendError(408, "request_timeout",
            "the request body came slower than the server accepts (" + secondsText(grace) + " s, then at least " +
                std::to_string(static_cast<uint64_t>(rate)) + " bytes/s): " + ec.message());
  broken_ = true;  // the rest of the body is not read: close at once, no lingering
}

void HttpExchange::sendContinueIfExpected() {
  if (continue_sent_) return;
  continue_sent_ = true;
  auto it = head_.find(http::field::expect);
  if (it == head_.end() || !boost::beast::iequals(it->value(), "100-continue")) return;
  static const char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
  boost::system::error_code ec;
  net::write(stream_, net::const_buffer(kContinue, sizeof(kContinue) - 1), ec);
  if (ec) broken_ = true;
}

Result<std::string> HttpExchange::readBody(uint64_t limit, bool* too_large) {
  *too_large = false;
  if (body_done_) return std::string();
  if (auto cl = contentLength(); cl && *cl > limit) {
    *too_large = true;
    return Error::invalid("request body of " + std::to_string(*cl) + " bytes is over the limit of " +
                          std::to_string(limit) + " bytes for this route");
  }
  sendContinueIfExpected();
  http::request_parser<http::string_body> parser(std::move(*parser_));
  parser_.reset();
  parser.body_limit(limit);
  boost::system::error_code ec;
  startBodyClock();
  http::read(stream_, buffer_, parser, ec);
  stream_.stopRateFloor();
  body_done_ = true;
  if (ec == http::error::body_limit) {
    *too_large = true;
    keep_alive_ = false;
    body_done_ = false;  // the rest is unread: close after answering
    return Error::invalid("request body is over the limit of " + std::to_string(limit) + " bytes for this route");
  }
  if (ec) {
    body_done_ = false;
    bodyReadFailed(ec);
    return Error(ErrorCode::kUnavailable, "reading request body: " + ec.message());
  }
  return std::move(parser.get().body());
}

Status HttpExchange::readBodyStream(const std::function<Status(const char*, size_t)>& sink) {
  if (body_done_) return okStatus();
  sendContinueIfExpected();
  http::request_parser<http::buffer_body> parser(std::move(*parser_));
  parser_.reset();
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  std::vector<char> buf(kStreamBuffer);
  startBodyClock();
  while (!parser.is_done()) {
    parser.get().body().data = buf.data();
    parser.get().body().size = buf.size();
    boost::system::error_code ec;
    http::read(stream_, buffer_, parser, ec);
    if (ec == http::error::need_buffer) ec = {};
    if (ec) {
      stream_.stopRateFloor();
      bodyReadFailed(ec);
      return Error(ErrorCode::kUnavailable, "reading request body: " + ec.message());
    }
    size_t n = buf.size() - parser.get().body().size;
    if (n > 0) {
      if (auto st = sink(buf.data(), n); !st.ok()) {
        stream_.stopRateFloor();
        keep_alive_ = false;  // the rest of the body stays unread
        return st;
      }
    }
  }
  stream_.stopRateFloor();
  body_done_ = true;
  return okStatus();
}

bool HttpExchange::discardBody(uint64_t max_bytes) {
  if (body_done_) return true;
  auto cl = contentLength();
  if (!cl || *cl > max_bytes) {
    keep_alive_ = false;
    return false;
  }
  return readBodyStream([](const char*, size_t) { return okStatus(); }).ok();
}

void HttpExchange::startBodyClock() {
  if (connection_ != nullptr) stream_.startRateFloor(connection_->body_timeout_seconds, connection_->body_min_rate);
}

void HttpExchange::writeHead(http::response_header<>& head) {
  head.set(http::field::server, "dsec");
  if (!body_done_) keep_alive_ = false;
  // HTTP/1.1 keeps the connection by default; say so explicitly only when it ends. A 1.0 client without
  // keep-alive already made parser keep_alive() false.
  if (!keep_alive_ || broken_) head.set(http::field::connection, "close");
}

void HttpExchange::sendText(int status, const std::string& content_type, std::string body, const Fields& extra) {
  if (responded() || broken_) return;
  http::response<http::string_body> res{static_cast<http::status>(status), 11};
  writeHead(res.base());
  res.set(http::field::content_type, content_type);
  for (const auto& [k, v] : extra) res.set(k, v);
  res.body() = std::move(body);
  res.prepare_payload();
  status_ = status;
  boost::system::error_code ec;
  http::write(stream_, res, ec);
  if (ec) broken_ = true;
}

void HttpExchange::sendJson(int status, const json& body, const Fields& extra) {
  sendText(status, "application/json", dumpJson(body) + "\n", extra);
}

void HttpExchange::sendError(int status, const std::string& code, const std::string& message, const Fields& extra,
                             const json& more) {
  json err = {{"code", code}, {"message", message}};
  if (more.is_object()) {
    for (const auto& [k, v] : more.items()) err[k] = v;
  }
  sendJson(status, json{{"error", err}}, extra);
}

bool HttpExchange::beginStream(int status, const std::string& content_type, std::optional<uint64_t> content_length,
                               const Fields& extra) {
  if (responded() || broken_) return false;
  http::response<http::empty_body> res{static_cast<http::status>(status), 11};
  writeHead(res.base());
  res.set(http::field::content_type, content_type);
  for (const auto& [k, v] : extra) res.set(k, v);
  if (content_length) {
    res.content_length(*content_length);
    stream_remaining_ = *content_length;
    chunked_ = false;
  } else {
    res.chunked(true);
    chunked_ = true;
  }
  status_ = status;
  stream_open_ = true;
  http::response_serializer<http::empty_body> sr{res};
  boost::system::error_code ec;
  http::write_header(stream_, sr, ec);
  if (ec) broken_ = true;
  return !broken_;
}

bool HttpExchange::writeStream(const char* data, size_t size) {
  if (!stream_open_ || broken_) return false;
  if (size == 0) return true;  // a zero-size chunk would end a chunked body
  boost::system::error_code ec;
  if (chunked_) {
    net::write(stream_, http::make_chunk(net::const_buffer(data, size)), ec);
  } else {
    if (size > stream_remaining_) {
      broken_ = true;  // more than announced: the response is wrong, drop the connection
      return false;
    }
    net::write(stream_, net::const_buffer(data, size), ec);
    stream_remaining_ -= size;
  }
  if (ec) broken_ = true;
  return !broken_;
}

bool HttpExchange::endStream() {
  if (!stream_open_ || broken_) return false;
  stream_open_ = false;
  if (chunked_) {
    boost::system::error_code ec;
    net::write(stream_, http::make_chunk_last(), ec);
    if (ec) broken_ = true;
  } else if (stream_remaining_ != 0) {
    broken_ = true;  // fewer bytes than announced: only closing tells the client
  }
  return !broken_;
}

// ---- HttpServer ---------------------------------------------------------------------------------------

Result<std::pair<std::string, int>> parseListenAddress(const std::string& listen) {
  std::string host, port;
  if (!listen.empty() && listen[0] == '[') {
    auto close = listen.find(']');
    if (close == std::string::npos || close + 1 >= listen.size() || listen[close + 1] != ':') {
      return Error::invalid("listen address '" + listen + "': expected [ADDR]:PORT");
    }
    host = listen.substr(1, close - 1);
    port = listen.substr(close + 2);
  } else {
    auto colon = listen.rfind(':');
    if (colon == std::string::npos) return Error::invalid("listen address '" + listen + "': expected ADDR:PORT");
    host = listen.substr(0, colon);
    port = listen.substr(colon + 1);
  }
  if (host.empty()) host = "0.0.0.0";
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(port) > 65535) {
    return Error::invalid("listen address '" + listen + "': bad port '" + port + "'");
  }
  return std::make_pair(host, std::stoi(port));
}

std::pair<int, std::string> httpStatusFor(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return {400, "invalid_request"};
    case ErrorCode::kUnauthenticated:
      return {401, "unauthorized"};
    case ErrorCode::kNotFound:
      return {404, "not_found"};
    case ErrorCode::kAlreadyExists:
    case ErrorCode::kConflict:
      return {409, "conflict"};
    case ErrorCode::kResourceExhausted:
      return {429, "capacity"};
    case ErrorCode::kTimeout:
      return {504, "timeout"};
    case ErrorCode::kUnsupported:
      return {501, "unsupported"};
    case ErrorCode::kUnavailable:
      return {503, "unavailable"};
    case ErrorCode::kSystem:
    case ErrorCode::kInternal:
      return {500, "internal"};
  }
  return {500, "internal"};
}

int clientConnectionLimit(const HttpServerOptions& options) {
  if (options.max_client_connections > 0) return options.max_client_connections;
  return std::max(1, std::min(64, options.max_connections / 2));
}

Status validateHttpServerOptions(const HttpServerOptions& o) {
  if (o.max_connections <= 0) return Error::invalid("max_connections must be positive");
  if (o.max_client_connections < 0) return Error::invalid("max_client_connections must be >= 0 (0: the default)");
  if (!(o.header_timeout_seconds > 0)) return Error::invalid("the header timeout must be > 0 seconds");
  if (!(o.body_timeout_seconds > 0)) return Error::invalid("the body timeout must be > 0 seconds");
  if (!(o.body_min_rate > 0)) return Error::invalid("the minimum body rate must be > 0 bytes/s");
  if (!(o.client_queue_seconds >= 0)) return Error::invalid("the client queue wait must be >= 0 seconds");
  if (o.idle_timeout_ms <= 0) return Error::invalid("the idle timeout must be > 0");
  return okStatus();
}

Result<std::unique_ptr<HttpServer>> HttpServer::start(const HttpServerOptions& options, RequestHandler* handler) {
  DSEC_TRY(validateHttpServerOptions(options));
  DSEC_ASSIGN_OR_RETURN(auto addr, parseListenAddress(options.listen));
  std::unique_ptr<HttpServer> server(new HttpServer(options, handler));
  struct addrinfo hints {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  struct addrinfo* res = nullptr;
  std::string port_text = std::to_string(addr.second);
  int gai = ::getaddrinfo(addr.first.c_str(), port_text.c_str(), &hints, &res);
  if (gai != 0) return Error::invalid("listen address '" + options.listen + "': " + gai_strerror(gai));
  std::unique_ptr<struct addrinfo, decltype(&::freeaddrinfo)> res_guard(res, ::freeaddrinfo);
  UniqueFd fd(::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) return Error::sys(errno, "socket");
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), res->ai_addr, res->ai_addrlen) != 0) return Error::sys(errno, "bind " + options.listen);
  if (::listen(fd.get(), 4096) != 0) return Error::sys(errno, "listen " + options.listen);
  struct sockaddr_storage ss {};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd.get(), reinterpret_cast<struct sockaddr*>(&ss), &len) != 0) {
    return Error::sys(errno, "getsockname");
  }
  char host[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET6) {
    auto* sin6 = reinterpret_cast<struct sockaddr_in6*>(&ss);
    server->port_ = ntohs(sin6->sin6_port);
    if (IN6_IS_ADDR_UNSPECIFIED(&sin6->sin6_addr)) {
      std::strcpy(host, "::1");
    } else {
      ::inet_ntop(AF_INET6, &sin6->sin6_addr, host, sizeof(host));
    }
    server->endpoint_ = "http://[" + std::string(host) + "]:" + std::to_string(server->port_);
  } else {
    auto* sin = reinterpret_cast<struct sockaddr_in*>(&ss);
    server->port_ = ntohs(sin->sin_port);
    if (sin->sin_addr.s_addr == htonl(INADDR_ANY)) {
      std::strcpy(host, "127.0.0.1");  // reachable locally; remote clients use the node's own address
    } else {
      ::inet_ntop(AF_INET, &sin->sin_addr, host, sizeof(host));
    }
    server->endpoint_ = "http://" + std::string(host) + ":" + std::to_string(server->port_);
  }
  server->listen_fd_ = std::move(fd);
  server->stop_fd_ = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!server->stop_fd_) return Error::sys(errno, "eventfd");
  server->wake_fd_ = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!server->wake_fd_) return Error::sys(errno, "eventfd");
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

// ---- connections ----------------------------------------------------------------------------------------

// One connection's thread state: its client and whether its unauthenticated slot is still held.
struct HttpServer::ConnState {
  std::string client;
  double accepted_at = 0;
  std::atomic<bool> slot_released{false};
};

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

void HttpServer::releaseClientSlot(const std::string& client) {
  client_budget_.give(client);
  if (queued_now_.load() > 0) {
    uint64_t one = 1;
    (void)!::write(wake_fd_.get(), &one, sizeof(one));
  }
}

void HttpServer::startConnection(int fd, const std::string& client, double accepted_at, bool authenticated) {
  active_.fetch_add(1);
  auto done = std::make_shared<std::atomic<bool>>(false);
  auto state = std::make_shared<ConnState>();
  state->client = client;
  state->accepted_at = accepted_at;
  state->slot_released.store(authenticated);  // an authenticated one never took a slot
  try {
    std::thread t([this, fd, done, state] {
      serveConnection(fd, *state);
      if (!state->slot_released.exchange(true)) releaseClientSlot(state->client);
      active_.fetch_sub(1);
      done->store(true);
    });
    std::lock_guard lock(mu_);
    conns_.push_back(ConnThread{std::move(t), done});
  } catch (const std::system_error& e) {
    DSEC_LOG(kWarn, kLog) << "cannot start a connection thread: " << e.what();
    writeRawError(fd, 503, "Service Unavailable", "unavailable", "cannot start a connection thread");
    ::close(fd);
    active_.fetch_sub(1);
    if (!authenticated) releaseClientSlot(client);
  }
}

void HttpServer::serveConnection(int raw_fd, ConnState& state) {
  UniqueFd fd(raw_fd);
  SocketStream stream(fd.get(), stop_fd_.get(), options_.idle_timeout_ms);
  ConnectionContext context;
  context.client = state.client;
  context.body_timeout_seconds = options_.body_timeout_seconds;
  context.body_min_rate = options_.body_min_rate;
  context.stats = &stats_;
  context.on_authenticated = [this, &state] {
    if (!state.slot_released.exchange(true)) releaseClientSlot(state.client);
  };
  boost::beast::flat_buffer buffer;
  bool linger = false;
  double head_started = state.accepted_at;  // the first request's head is due from the accept
  for (bool first = true;; first = false) {
    boost::system::error_code ec;
    if (!first) {
      // Keep-alive: wait for the next request to start (the idle timeout; for a connection that never showed
      // the token, only the head deadline); its head is due from then.
      if (buffer.size() == 0) {
        if (!state.slot_released.load()) stream.setDeadline(monotonicSeconds() + options_.header_timeout_seconds);
        bool more = stream.waitReadable(ec);
        stream.setDeadline(0);
        if (!more) break;
      }
      head_started = monotonicSeconds();
    }
    auto parser = std::make_unique<http::request_parser<http::empty_body>>();
    parser->header_limit(options_.header_limit);
    // Each route sets its own limit when it reads the body. (Not boost::none: Beast 1.74 compares the
    // Content-Length against the optional and an empty optional then rejects every body.)
    parser->body_limit(std::numeric_limits<std::uint64_t>::max());
    stream.setDeadline(head_started + options_.header_timeout_seconds);
    http::read_header(stream, buffer, *parser, ec);
    const bool late = stream.deadlineExpired();
    stream.setDeadline(0);
    if (ec) {
      if (late) {
        // A head that trickles in (or never comes) frees its thread at the deadline. No lingering: a client
        // this slow is not waiting for an answer.
        stats_.header_timeouts++;
        writeRawError(fd.get(), 408, "Request Timeout", "request_timeout",
                      "no complete request head within " + secondsText(options_.header_timeout_seconds) + " s");
        handler_->onResponse(408);
        break;
      }
      if (!isQuietDisconnect(ec)) {
        std::string what = ec == http::error::header_limit
                               ? "request header larger than " + std::to_string(options_.header_limit) + " bytes"
                               : "malformed HTTP request: " + ec.message();
        writeRawError(fd.get(), 400, "Bad Request", "invalid_request", what);
        handler_->onResponse(400);
        linger = true;
      }
      break;
    }
    HttpExchange exchange(stream, buffer, std::move(parser), &context);
    try {
      handler_->handle(exchange);
    } catch (const std::exception& e) {
      DSEC_LOG(kError, kLog) << "handler: " << e.what();
      if (!exchange.responded()) {
        exchange.sendError(500, "internal", std::string("unexpected error: ") + e.what());
      } else {
        exchange.forceClose();
      }
    }
    if (!exchange.responded() && !exchange.broken()) {
      exchange.sendError(500, "internal", "no response");
    }
    if (exchange.streamOpen()) exchange.forceClose();  // a stream the handler did not finish is truncated
    if (exchange.responded()) handler_->onResponse(exchange.status());
    if (exchange.broken()) break;
    if (exchange.bodyPending()) {
      linger = true;
      break;
    }
    if (!exchange.keepAlive()) break;
  }
  if (linger) {
    // Let the client finish sending before we close, so it reads our answer instead of a reset.
    ::shutdown(fd.get(), SHUT_WR);
    char sink[64 * 1024];
    double deadline = monotonicSeconds() + 2.0;
    size_t drained = 0;
    stream.setTimeoutMs(200);
    while (monotonicSeconds() < deadline && drained < (256u << 20)) {
      boost::system::error_code ec;
      size_t n = stream.read_some(net::buffer(sink), ec);
      if (ec) {
        if (ec == net::error::timed_out) continue;
        break;
      }
      drained += n;
    }
  }
}

}  // namespace dsec::launcher
