// One connection's thread (HttpServer.h): its keep-alive loop of reading a request head within the deadline,
// handing the exchange to the handler and deciding whether the connection carries another request.
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/error.hpp>
#include <limits>

#include "HttpWire.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/api/HttpServer.h"

namespace dsec::launcher {
namespace {

namespace net = boost::asio;
using http_wire::kLog;
using http_wire::secondsText;
using http_wire::writeRawError;

// Lets the client finish sending before the close, so it reads the answer instead of a reset.
void lingerBeforeClose(SocketStream& stream) {
  ::shutdown(stream.fd(), SHUT_WR);
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

}  // namespace

// One connection's thread state: its client and whether its unauthenticated slot is still held.
struct HttpServer::ConnState {
  std::string client;
  double accepted_at = 0;
  std::atomic<bool> slot_released{false};
};

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

ConnectionContext HttpServer::connectionContext(ConnState& state) {
  ConnectionContext context;
  context.client = state.client;
  context.body_timeout_seconds = options_.body_timeout_seconds;
  context.body_min_rate = options_.body_min_rate;
  context.stats = &stats_;
  context.on_authenticated = [this, &state] {
    if (!state.slot_released.exchange(true)) releaseClientSlot(state.client);
  };
  return context;
}

bool HttpServer::awaitNextRequest(SocketStream& stream, const boost::beast::flat_buffer& buffer,
                                  const ConnState& state) const {
  if (buffer.size() > 0) return true;  // pipelined: the next request has started already
  // The idle timeout; for a connection that never showed the token, only the head deadline.
  if (!state.slot_released.load()) stream.setDeadline(monotonicSeconds() + options_.header_timeout_seconds);
  boost::system::error_code ec;
  bool more = stream.waitReadable(ec);
  stream.setDeadline(0);
  return more;
}

HttpServer::Next HttpServer::readRequestHead(SocketStream& stream, boost::beast::flat_buffer& buffer,
                                             http::request_parser<http::empty_body>& parser, double head_started) {
  parser.header_limit(options_.header_limit);
  // Each route sets its own limit when it reads the body. (Not boost::none: Beast 1.74 compares the
  // Content-Length against the optional and an empty optional then rejects every body.)
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  boost::system::error_code ec;
  stream.setDeadline(head_started + options_.header_timeout_seconds);
  http::read_header(stream, buffer, parser, ec);
  const bool late = stream.deadlineExpired();
  stream.setDeadline(0);
  if (!ec) return Next::kServe;
  if (late) {
    // A head that trickles in (or never comes) frees its thread at the deadline. No lingering: a client this
    // slow is not waiting for an answer.
    stats_.header_timeouts++;
    writeRawError(stream.fd(), 408, "Request Timeout", "request_timeout",
                  "no complete request head within " + secondsText(options_.header_timeout_seconds) + " s");
    handler_->onResponse(408);
    return Next::kClose;
  }
  if (http_wire::isQuietDisconnect(ec)) return Next::kClose;
  std::string what = ec == http::error::header_limit
                         ? "request header larger than " + std::to_string(options_.header_limit) + " bytes"
                         : "malformed HTTP request: " + ec.message();
  writeRawError(stream.fd(), 400, "Bad Request", "invalid_request", what);
  handler_->onResponse(400);
  return Next::kLingerAndClose;
}

HttpServer::Next HttpServer::runExchange(HttpExchange& exchange) {
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
  if (!exchange.responded() && !exchange.broken()) exchange.sendError(500, "internal", "no response");
  if (exchange.streamOpen()) exchange.forceClose();  // a stream the handler did not finish is truncated
  if (exchange.responded()) handler_->onResponse(exchange.status());
  if (exchange.broken()) return Next::kClose;
  if (exchange.bodyPending()) return Next::kLingerAndClose;
  return exchange.keepAlive() ? Next::kServe : Next::kClose;
}

void HttpServer::serveConnection(int raw_fd, ConnState& state) {
  UniqueFd fd(raw_fd);
  SocketStream stream(fd.get(), stop_fd_.get(), options_.idle_timeout_ms);
  ConnectionContext context = connectionContext(state);
  boost::beast::flat_buffer buffer;
  Next next = Next::kServe;
  double head_started = state.accepted_at;  // the first request's head is due from the accept
  for (bool first = true; next == Next::kServe; first = false) {
    if (!first) {
      if (!awaitNextRequest(stream, buffer, state)) break;
      head_started = monotonicSeconds();  // a later request's head is due from its start
    }
    auto parser = std::make_unique<http::request_parser<http::empty_body>>();
    next = readRequestHead(stream, buffer, *parser, head_started);
    if (next != Next::kServe) break;
    HttpExchange exchange(stream, buffer, std::move(parser), &context);
    next = runExchange(exchange);
  }
  if (next == Next::kLingerAndClose) lingerBeforeClose(stream);
}

}  // namespace dsec::launcher
