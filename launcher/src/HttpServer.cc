#include "dsec/launcher/HttpServer.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <boost/asio/error.hpp>
#include <boost/asio/write.hpp>
#include <cstring>
#include <limits>

#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"

namespace dsec::launcher {
namespace {

namespace net = boost::asio;
using nlohmann::json;
constexpr const char* kLog = "http";
constexpr size_t kStreamBuffer = size_t{256} * 1024;

std::string dumpJson(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string errorBody(const std::string& code, const std::string& message) {
  return dumpJson(json{{"error", {{"code", code}, {"message", message}}}}) + "\n";
}

// For failures before there is a request to answer (unparsable head, too many connections).
void writeRawError(int fd, int status, const char* reason, const std::string& code, const std::string& message) {
  std::string body = errorBody(code, message);
  std::string text =
      "HTTP/1.1 " + std::to_string(status) + " " + reason +
      "\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\n\r\n" + body;
  // Best effort, never blocking the caller: the socket buffer of a fresh connection takes this whole.
  (void)::send(fd, text.data(), text.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

bool isQuietDisconnect(const boost::system::error_code& ec) {
  return ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::timed_out ||
         ec == net::error::operation_aborted || ec == net::error::connection_reset || ec == net::error::broken_pipe ||
         ec == http::error::partial_message;
}

}  // namespace

// ---- SocketStream -------------------------------------------------------------------------------------

bool SocketStream::wait(short events, boost::system::error_code& ec) {
  for (;;) {
    struct pollfd fds[2] = {{fd_, events, 0}, {stop_fd_, POLLIN, 0}};
    int n = ::poll(fds, stop_fd_ >= 0 ? 2 : 1, timeout_ms_);
    if (n < 0) {
      if (errno == EINTR) continue;
      ec = boost::system::error_code(errno, boost::system::system_category());
      return false;
    }
    if (n == 0) {
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
                           std::unique_ptr<http::request_parser<http::empty_body>> parser)
    : stream_(stream), buffer_(buffer), parser_(std::move(parser)), head_(parser_->get().base()) {
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
  http::read(stream_, buffer_, parser, ec);
  body_done_ = true;
  if (ec == http::error::body_limit) {
    *too_large = true;
    keep_alive_ = false;
    body_done_ = false;  // the rest is unread: close after answering
    return Error::invalid("request body is over the limit of " + std::to_string(limit) + " bytes for this route");
  }
  if (ec) {
    broken_ = true;
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
  while (!parser.is_done()) {
    parser.get().body().data = buf.data();
    parser.get().body().size = buf.size();
    boost::system::error_code ec;
    http::read(stream_, buffer_, parser, ec);
    if (ec == http::error::need_buffer) ec = {};
    if (ec) {
      broken_ = true;
      return Error(ErrorCode::kUnavailable, "reading request body: " + ec.message());
    }
    size_t n = buf.size() - parser.get().body().size;
    if (n > 0) {
      if (auto st = sink(buf.data(), n); !st.ok()) {
        keep_alive_ = false;  // the rest of the body stays unread
        return st;
      }
    }
  }
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

Result<std::unique_ptr<HttpServer>> HttpServer::start(const HttpServerOptions& options, RequestHandler* handler) {
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

void HttpServer::acceptLoop() {
  while (!stopped_.load()) {
    struct pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0}, {stop_fd_.get(), POLLIN, 0}};
    int n = ::poll(fds, 2, 1000);
    reapFinished(false);
    if (n < 0 && errno != EINTR) {
      DSEC_LOG(kError, kLog) << "poll: " << strerror(errno);
      ::usleep(100 * 1000);
      continue;
    }
    if (fds[1].revents & POLLIN) break;
    if (!(fds[0].revents & POLLIN)) continue;
    int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        DSEC_LOG(kWarn, kLog) << "accept: " << strerror(errno);
        ::usleep(50 * 1000);
      }
      continue;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (active_.load() >= options_.max_connections) {
      writeRawError(fd, 503, "Service Unavailable", "unavailable",
                    "too many connections (" + std::to_string(options_.max_connections) + ")");
      handler_->onResponse(503);
      ::close(fd);
      continue;
    }
    active_.fetch_add(1);
    auto done = std::make_shared<std::atomic<bool>>(false);
    try {
      std::thread t([this, fd, done] {
        serveConnection(fd);
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
    }
  }
}

void HttpServer::serveConnection(int raw_fd) {
  UniqueFd fd(raw_fd);
  SocketStream stream(fd.get(), stop_fd_.get(), options_.idle_timeout_ms);
  boost::beast::flat_buffer buffer;
  bool linger = false;
  for (;;) {
    auto parser = std::make_unique<http::request_parser<http::empty_body>>();
    parser->header_limit(options_.header_limit);
    // Each route sets its own limit when it reads the body. (Not boost::none: Beast 1.74 compares the
    // Content-Length against the optional and an empty optional then rejects every body.)
    parser->body_limit(std::numeric_limits<std::uint64_t>::max());
    boost::system::error_code ec;
    http::read_header(stream, buffer, *parser, ec);
    if (ec) {
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
    HttpExchange exchange(stream, buffer, std::move(parser));
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
