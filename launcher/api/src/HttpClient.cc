#include "dsec/launcher/api/HttpClient.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/error.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>

#include "dsec/launcher/api/HttpServer.h"

namespace dsec::launcher::client {

namespace net = boost::asio;
using nlohmann::json;
constexpr size_t kPiece = size_t{64} * 1024;

Error transportError(const std::string& endpoint, const std::string& what, const boost::system::error_code& ec) {
  std::string why = ec == net::error::operation_aborted ? "node declared lost" : ec.message();
  return Error(ErrorCode::kUnavailable, what + " " + endpoint + ": " + why);
}

std::vector<std::pair<std::string, std::string>> relayedHeaders(const http::response_header<>& h) {
  std::vector<std::pair<std::string, std::string>> out;
  for (auto field : {http::field::retry_after, http::field::allow}) {
    auto it = h.find(field);
    if (it != h.end()) out.emplace_back(std::string(http::to_string(field)), std::string(it->value()));
  }
  return out;
}

json HttpReply::json() const { return json::parse(body, nullptr, false); }

namespace {

// A numeric address (every endpoint the fleet hands around is one) without getaddrinfo: no resolver, no
// /etc files read on the gateway's hot path. Host names still go through getaddrinfo.
bool numericAddress(const Endpoint& ep, struct sockaddr_storage* ss, socklen_t* len) {
  std::memset(ss, 0, sizeof(*ss));
  auto* sin = reinterpret_cast<struct sockaddr_in*>(ss);
  if (::inet_pton(AF_INET, ep.host.c_str(), &sin->sin_addr) == 1) {
    sin->sin_family = AF_INET;
    sin->sin_port = htons(static_cast<uint16_t>(ep.port));
    *len = sizeof(*sin);
    return true;
  }
  auto* sin6 = reinterpret_cast<struct sockaddr_in6*>(ss);
  if (::inet_pton(AF_INET6, ep.host.c_str(), &sin6->sin6_addr) == 1) {
    sin6->sin6_family = AF_INET6;
    sin6->sin6_port = htons(static_cast<uint16_t>(ep.port));
    *len = sizeof(*sin6);
    return true;
  }
  return false;
}

}  // namespace

Result<UniqueFd> connectTo(const std::string& endpoint, const CallOptions& options) {
  DSEC_ASSIGN_OR_RETURN(auto ep, parseEndpoint(endpoint));
  struct sockaddr_storage ss {};
  socklen_t ss_len = 0;
  if (!numericAddress(ep, &ss, &ss_len)) {
    struct addrinfo hints {};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    struct addrinfo* res = nullptr;
    std::string port = std::to_string(ep.port);
    int gai = ::getaddrinfo(ep.host.c_str(), port.c_str(), &hints, &res);
    if (gai != 0) return Error(ErrorCode::kUnavailable, "resolving " + endpoint + ": " + gai_strerror(gai));
    std::unique_ptr<struct addrinfo, decltype(&::freeaddrinfo)> guard(res, ::freeaddrinfo);
    std::memcpy(&ss, res->ai_addr, res->ai_addrlen);
    ss_len = res->ai_addrlen;
  }
  UniqueFd fd(::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) return Error::sys(errno, "socket");
  if (::connect(fd.get(), reinterpret_cast<struct sockaddr*>(&ss), ss_len) != 0) {
    if (errno != EINPROGRESS)
      return Error(ErrorCode::kUnavailable, "connecting to " + endpoint + ": " + strerror(errno));
    struct pollfd fds[2] = {{fd.get(), POLLOUT, 0}, {options.abort_fd, POLLIN, 0}};
    int n;
    do {
      n = ::poll(fds, options.abort_fd >= 0 ? 2 : 1, options.connect_timeout_ms);
    } while (n < 0 && errno == EINTR);
    if (n == 0) {
      return Error(ErrorCode::kUnavailable, "connecting to " + endpoint + ": timed out after " +
                                                std::to_string(options.connect_timeout_ms) + " ms");
    }
    if (options.abort_fd >= 0 && (fds[1].revents & POLLIN)) {
      return Error(ErrorCode::kUnavailable, "connecting to " + endpoint + ": node declared lost");
    }
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return Error(ErrorCode::kUnavailable, "connecting to " + endpoint + ": " + strerror(err));
  }
  int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

namespace {

// A request's head: Host, the bearer token, the user agent, keep-alive when pooled, the options' headers.
void setHead(http::request_header<>& head, const Endpoint& ep, const std::string& token, const CallOptions& options) {
  head.set(http::field::host, ep.hostPort());
  if (!token.empty()) head.set(http::field::authorization, "Bearer " + token);
  if (!options.user_agent.empty()) head.set(http::field::user_agent, options.user_agent);
  if (options.pool == nullptr) head.set(http::field::connection, "close");  // HTTP/1.1 keeps alive unless told
}

void setExtraHeaders(http::request_header<>& head, const CallOptions& options) {
  for (const auto& [name, value] : options.headers) head.set(name, value);
}

http::request<http::string_body> makeRequest(const Endpoint& ep, http::verb method, const std::string& target,
                                             const std::string& token, const std::string& body,
                                             const CallOptions& options) {
  http::request<http::string_body> req{method, target, 11};
  setHead(req.base(), ep, token, options);
  if (!body.empty() || method == http::verb::post || method == http::verb::put) {
    req.set(http::field::content_type, "application/json");
    req.body() = body;
  }
  setExtraHeaders(req.base(), options);
  req.prepare_payload();
  return req;
}

// Writes a request on the stream; the transport error, if any.
using SendRequest = std::function<boost::system::error_code(SocketStream&)>;

// What exchange() may do besides sending and reading one answer.
struct ExchangeRules {
  bool pooled = true;                     // take a pooled connection when there is a pool
  bool answer_after_failed_send = false;  // read an answer even when the send failed (an early answer)
};

HttpReply replyHead(const http::response_header<>& head, const CallOptions& options) {
  HttpReply reply;
  reply.status = static_cast<int>(head.result_int());
  if (options.all_headers) {
    for (const auto& field : head)
      reply.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
    return reply;
  }
  reply.headers = relayedHeaders(head);
  if (auto it = head.find(http::field::content_type); it != head.end()) {
    reply.headers.emplace_back("Content-Type", std::string(it->value()));
  }
  return reply;
}

// Sends req and reads the answer: a 2xx body to on_body when given, else into the reply (at most
// max_body_bytes). A pooled connection the peer closed meanwhile (restart, idle timeout) fails before any byte
// of an answer: then, and only then, the request goes once more on a new connection. A peer that got the
// request answers it on the connection it came on, so nothing is ever sent twice to a live peer.
Result<HttpReply> exchange(const std::string& endpoint, const SendRequest& send, const ExchangeRules& rules,
                           const CallOptions& options, const std::function<bool(const char*, size_t)>* on_body) {
  for (int attempt = 0;; ++attempt) {
    UniqueFd fd;
    bool reused = false;
    if (options.pool != nullptr && rules.pooled && attempt == 0) {
      fd = options.pool->take(endpoint);
      reused = fd.valid();
    }
    if (!fd) {
      DSEC_ASSIGN_OR_RETURN(fd, connectTo(endpoint, options));
    }
    SocketStream stream(fd.get(), options.abort_fd, options.io_timeout_ms);
    boost::system::error_code ec = send(stream);
    const bool gave_up = ec == net::error::operation_aborted || ec == net::error::timed_out;
    if (ec) {
      if (reused && !gave_up) continue;
      if (!rules.answer_after_failed_send || gave_up) return transportError(endpoint, "sending to", ec);
    }
    boost::beast::flat_buffer buffer;
    http::response_parser<http::buffer_body> parser;
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    http::read_header(stream, buffer, parser, ec);
    if (ec) {
      if (reused && !parser.got_some() && buffer.size() == 0 && ec != net::error::operation_aborted &&
          ec != net::error::timed_out) {
        continue;
      }
      return transportError(endpoint, "reading the answer of", ec);
    }
    HttpReply reply = replyHead(parser.get().base(), options);
    reply.closed = !parser.get().keep_alive();
    bool to_sink = on_body != nullptr && reply.status >= 200 && reply.status < 300;
    std::optional<Error> failure;
    ec = readBodyPieces(stream, buffer, parser, [&](const char* data, size_t n) {
      if (to_sink) {
        if (!(*on_body)(data, n)) failure = Error(ErrorCode::kUnavailable, "stopped reading " + endpoint);
      } else if (reply.body.size() + n > options.max_body_bytes) {
        failure = Error(ErrorCode::kUnavailable, "the answer of " + endpoint + " is larger than " +
                                                     std::to_string(options.max_body_bytes) + " bytes");
      } else {
        reply.body.append(data, n);
      }
      return !failure;
    });
    if (ec) return transportError(endpoint, "reading the answer of", ec);
    if (failure) return *failure;
    if (options.pool != nullptr && rules.pooled && parser.get().keep_alive() && buffer.size() == 0) {
      options.pool->give(endpoint, std::move(fd));
    }
    return reply;
  }
}

}  // namespace

boost::system::error_code readBodyPieces(SocketStream& stream, boost::beast::flat_buffer& buffer,
                                         http::response_parser<http::buffer_body>& parser,
                                         const std::function<bool(const char*, size_t)>& on_piece) {
  // Not zeroed: every call (heartbeats, forwarded creates) reads an answer through here.
  std::unique_ptr<char[]> piece(new char[kPiece]);
  boost::system::error_code ec;
  while (!parser.is_done()) {
    parser.get().body().data = piece.get();
    parser.get().body().size = kPiece;
    http::read_some(stream, buffer, parser, ec);
    if (ec == http::error::need_buffer) ec = {};
    if (ec) return ec;
    size_t n = kPiece - parser.get().body().size;
    if (n > 0 && !on_piece(piece.get(), n)) break;
  }
  return ec;
}

namespace {

SendRequest sendWhole(const http::request<http::string_body>& req) {
  return [&req](SocketStream& stream) {
    boost::system::error_code ec;
    http::write(stream, req, ec);
    return ec;
  };
}

}  // namespace

Result<HttpReply> call(const std::string& endpoint, http::verb method, const std::string& target,
                       const std::string& token, const std::string& body, const CallOptions& options) {
  DSEC_ASSIGN_OR_RETURN(auto ep, parseEndpoint(endpoint));
  auto req = makeRequest(ep, method, target, token, body, options);
  return exchange(endpoint, sendWhole(req), ExchangeRules{}, options, nullptr);
}

Result<HttpReply> callStreaming(const std::string& endpoint, http::verb method, const std::string& target,
                                const std::string& token, const std::string& body, const CallOptions& options,
                                const std::function<bool(const char*, size_t)>& on_body) {
  DSEC_ASSIGN_OR_RETURN(auto ep, parseEndpoint(endpoint));
  auto req = makeRequest(ep, method, target, token, body, options);
  return exchange(endpoint, sendWhole(req), ExchangeRules{}, options, &on_body);
}

Result<HttpReply> callUpload(const std::string& endpoint, http::verb method, const std::string& target,
                             const std::string& token, uint64_t body_size,
                             const std::function<std::string(uint64_t produced)>& next_piece,
                             const CallOptions& options) {
  DSEC_ASSIGN_OR_RETURN(auto ep, parseEndpoint(endpoint));
  http::request<http::empty_body> req{method, target, 11};
  setHead(req.base(), ep, token, options);
  req.set(http::field::content_type, "application/octet-stream");
  setExtraHeaders(req.base(), options);
  req.content_length(body_size);
  auto send = [&](SocketStream& stream) {
    http::request_serializer<http::empty_body> head{req};
    boost::system::error_code ec;
    http::write_header(stream, head, ec);
    for (uint64_t produced = 0; !ec && produced < body_size;) {
      std::string piece = next_piece(produced);
      if (piece.empty()) break;
      net::write(stream, net::buffer(piece), ec);
      produced += piece.size();
    }
    return ec;
  };
  return exchange(endpoint, send, ExchangeRules{.pooled = false, .answer_after_failed_send = true}, options, nullptr);
}

}  // namespace dsec::launcher::client
