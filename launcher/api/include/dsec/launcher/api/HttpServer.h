// HTTP/1.1 transport for the node API and the fleet gateway: Boost.Beast parsing and serialisation over a
// blocking thread-per-connection design. One acceptor thread; each connection gets a thread running a
// keep-alive read/handle/write loop, so a slow exec or a large file transfer never blocks other clients. Every
// socket wait is a poll() with a timeout and the server's stop eventfd, so stop() is prompt and a silent client
// cannot pin a thread for ever. Against clients that hold threads on purpose (docs/node-agent.md, "Connection
// budgets"): a request head must arrive whole within a deadline, a body at a minimum rate, and each client
// holds at most a budget of connections that have not authenticated; connections over it wait in the acceptor
// (no thread) for a moment and are then refused with 429.
#pragma once

#include <poll.h>

#include <algorithm>
#include <atomic>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"
#include "dsec/launcher/api/ConnectionBudget.h"

namespace dsec::launcher {

namespace http = boost::beast::http;

// A SyncReadStream/SyncWriteStream over a non-blocking socket fd with poll() timeouts.
class SocketStream {
 public:
  SocketStream(int fd, int stop_fd, int timeout_ms) : fd_(fd), stop_fd_(stop_fd), timeout_ms_(timeout_ms) {}

  template <class MutableBufferSequence>
  size_t read_some(const MutableBufferSequence& buffers, boost::system::error_code& ec) {
    for (auto it = boost::asio::buffer_sequence_begin(buffers); it != boost::asio::buffer_sequence_end(buffers); ++it) {
      boost::asio::mutable_buffer b = *it;
      if (b.size() > 0) return readSome(b.data(), b.size(), ec);
    }
    ec = {};
    return 0;
  }
  template <class MutableBufferSequence>
  size_t read_some(const MutableBufferSequence& buffers) {
    boost::system::error_code ec;
    size_t n = read_some(buffers, ec);
    if (ec) throw boost::system::system_error(ec);
    return n;
  }
  template <class ConstBufferSequence>
  size_t write_some(const ConstBufferSequence& buffers, boost::system::error_code& ec) {
    struct iovec iov[16];
    int count = 0;
    for (auto it = boost::asio::buffer_sequence_begin(buffers);
         it != boost::asio::buffer_sequence_end(buffers) && count < 16; ++it) {
      boost::asio::const_buffer b = *it;
      if (b.size() == 0) continue;
      iov[count].iov_base = const_cast<void*>(b.data());
      iov[count].iov_len = b.size();
      ++count;
    }
    if (count == 0) {
      ec = {};
      return 0;
    }
    return writeSome(iov, count, ec);
  }
  template <class ConstBufferSequence>
  size_t write_some(const ConstBufferSequence& buffers) {
    boost::system::error_code ec;
    size_t n = write_some(buffers, ec);
    if (ec) throw boost::system::system_error(ec);
    return n;
  }

  void setTimeoutMs(int ms) { timeout_ms_ = ms; }
  int fd() const { return fd_; }
  int stopFd() const { return stop_fd_; }

  // Every wait ends by this monotonic time (seconds; 0: none): past it, reads and writes fail with timed_out
  // and deadlineExpired() is true. The per-wait inactivity timeout still applies.
  void setDeadline(double monotonic_seconds);
  // A floor on the peer's sending rate: from now, the time spent waiting for the peer to send may not exceed
  // grace_seconds + (bytes received since) / min_bytes_per_second; past that, reads fail as at a deadline.
  // Only time waiting on the peer counts, not time the reader spends elsewhere (writing a file, feeding tar).
  void startRateFloor(double grace_seconds, double min_bytes_per_second);
  void stopRateFloor();
  bool deadlineExpired() const { return expired_; }
  // Waits until the socket is readable (the inactivity timeout and stop apply); false with ec set otherwise.
  bool waitReadable(boost::system::error_code& ec) { return wait(POLLIN, ec); }

 private:
  size_t readSome(void* data, size_t size, boost::system::error_code& ec);
  size_t writeSome(struct iovec* iov, int count, boost::system::error_code& ec);
  // Waits for `events` on the socket; false with ec set on timeout, deadline or stop.
  bool wait(short events, boost::system::error_code& ec);

  int fd_;
  int stop_fd_;
  int timeout_ms_;
  double deadline_ = 0;
  bool floor_active_ = false;
  double floor_grace_ = 0;
  double floor_rate_ = 0;
  double floor_waited_ = 0;
  uint64_t floor_received_ = 0;
  bool expired_ = false;
};

// Counters of the transport, for /metrics and GET /v1/node (docs/api.md).
struct HttpServerStats {
  std::atomic<uint64_t> accepted{0};
  std::atomic<uint64_t> refused_busy{0};     // over max_connections: 503
  std::atomic<uint64_t> refused_client{0};   // over the per-client budget: 429
  std::atomic<uint64_t> queued{0};           // waited in the acceptor for a per-client slot
  std::atomic<uint64_t> header_timeouts{0};  // no complete request head in time: 408, closed
  std::atomic<uint64_t> body_timeouts{0};    // a body slower than the minimum rate: 408, closed
};

// The transport's side of one connection, as an exchange sees it.
struct ConnectionContext {
  std::string client;  // the per-client budget's key ("uid:1000", "ip:10.0.0.7"; ClientKey.h)
  double body_timeout_seconds = 10;
  double body_min_rate = 64 * 1024;
  std::function<void()> on_authenticated;  // releases the connection's unauthenticated slot; idempotent
  HttpServerStats* stats = nullptr;
};

// One request on a connection: its head, ways to read its body, and ways to answer it.
class HttpExchange {
 public:
  using Fields = std::vector<std::pair<std::string, std::string>>;

  HttpExchange(SocketStream& stream, boost::beast::flat_buffer& buffer,
               std::unique_ptr<http::request_parser<http::empty_body>> parser, ConnectionContext* connection = nullptr);
  ~HttpExchange();

  const http::request_header<>& head() const { return head_; }
  http::verb method() const { return head_.method(); }
  std::string_view target() const { return {head_.target().data(), head_.target().size()}; }
  bool hasBody() const;
  std::optional<uint64_t> contentLength() const;
  // The handler found a valid token on this request: the connection no longer counts against its client's
  // budget of unauthenticated connections (for the rest of its life).
  void markAuthenticated();
  const std::string& client() const;

  // Reads the whole body (JSON routes). too_large is set (and an error returned) above the limit.
  Result<std::string> readBody(uint64_t limit, bool* too_large);
  // Streams the body in chunks to sink (file and tar uploads); a sink error stops reading.
  Status readBodyStream(const std::function<Status(const char*, size_t)>& sink);
  // Reads and drops the rest of the body (after an early error) so the connection stays usable; false if
  // it is too big to bother, and the connection will be closed.
  bool discardBody(uint64_t max_bytes);

  void sendJson(int status, const nlohmann::json& body, const Fields& extra = {});
  void sendText(int status, const std::string& content_type, std::string body, const Fields& extra = {});
  void sendError(int status, const std::string& code, const std::string& message, const Fields& extra = {},
                 const nlohmann::json& more = nullptr);
  // Streamed responses: a Content-Length when known, else chunked. Each returns false once the client is gone.
  bool beginStream(int status, const std::string& content_type, std::optional<uint64_t> content_length,
                   const Fields& extra = {});
  bool writeStream(const char* data, size_t size);
  bool endStream();

  // Answers 101 Switching Protocols (with extra, e.g. Upgrade and Sec-WebSocket-Accept) and hands the connection
  // over: it carries no more HTTP. *early gets the bytes the client sent after the head, already read; false if
  // the answer could not be written. The caller then owns socketFd()'s I/O until it returns.
  bool switchProtocols(const Fields& extra, std::string* early);
  int socketFd() const { return stream_.fd(); }
  // Readable once the server stops (a handler that owns the socket waits on it too).
  int stopFd() const { return stream_.stopFd(); }

  bool responded() const { return status_ != 0; }
  int status() const { return status_; }
  // Whether the connection can carry another request after this one.
  bool keepAlive() const { return keep_alive_ && !broken_; }
  void forceClose() { keep_alive_ = false; }
  bool broken() const { return broken_; }
  bool bodyPending() const;
  bool streamOpen() const { return stream_open_; }

 private:
  void sendContinueIfExpected();
  void writeHead(http::response_header<>& head);
  // Starts the body's rate floor (ConnectionContext's timeout and rate).
  void startBodyClock();
  // After a body read failed: a deadline (rate floor) is answered 408 and the connection closed.
  void bodyReadFailed(const boost::system::error_code& ec);

  SocketStream& stream_;
  ConnectionContext* connection_;
  boost::beast::flat_buffer& buffer_;
  std::unique_ptr<http::request_parser<http::empty_body>> parser_;
  http::request_header<> head_;
  bool body_done_ = false;
  bool keep_alive_ = true;
  bool broken_ = false;
  bool continue_sent_ = false;
  int status_ = 0;
  bool stream_open_ = false;
  bool chunked_ = false;
  uint64_t stream_remaining_ = 0;
};

class HttpServer;

class RequestHandler {
 public:
  virtual ~RequestHandler() = default;
  // Must answer (every path ends in a response unless the connection broke).
  virtual void handle(HttpExchange& exchange) = 0;
  // Called once per response with its status (metrics).
  virtual void onResponse(int /*status*/) {}
  // Whether an Authorization header value carries valid credentials. The transport asks with the head bytes a
  // new connection has already sent, so a client whose first request carries the token is never held to the
  // per-client budget of unauthenticated connections (a trainer's burst of new connections). Only a hint for
  // admission: handle() still checks every request.
  virtual bool acceptsCredentials(std::string_view /*authorization*/) const { return false; }
  // The server this handler runs on, while it runs (its counters for /metrics); null before and after.
  const HttpServer* transport() const { return transport_.load(); }
  void attachTransport(const HttpServer* server) { transport_.store(server); }

 private:
  std::atomic<const HttpServer*> transport_{nullptr};
};

struct HttpServerOptions {
  std::string listen = "127.0.0.1:0";  // "ADDR:PORT", "[V6]:PORT", ":PORT" (every interface); port 0: any free one
  int max_connections = 1024;          // connection threads in all; more get 503
  // Connections one client may hold that have not yet carried a request with a valid token (0: the default,
  // min(64, max_connections / 2)); all clients together hold at most max_connections / 2 such connections. Over
  // either, a connection waits in the acceptor, without a thread, for a slot or for its head to show the token
  // (at most client_queue_seconds, and max(budget, max_connections / 4) of one client's connections), then
  // gets 429. An unauthenticated connection's keep-alive wait for its next request is header_timeout_seconds.
  int max_client_connections = 0;
  double client_queue_seconds = 2;
  // A request head (request line and headers) must arrive whole within this, counted from the connection's
  // accept for its first request and from the first byte for later ones.
  double header_timeout_seconds = 10;
  // A request body may take body_timeout_seconds plus one second per body_min_rate bytes received (only the
  // time spent waiting on the client counts).
  double body_timeout_seconds = 10;
  double body_min_rate = 64 * 1024;
  int idle_timeout_ms = 120000;  // keep-alive wait and per-read/write inactivity
  uint32_t header_limit = 64 * 1024;

  bool operator==(const HttpServerOptions&) const = default;
};
// max_client_connections with the default applied.
int clientConnectionLimit(const HttpServerOptions& options);
// Bad values (a zero deadline, a negative rate) are refused with what is wrong.
Status validateHttpServerOptions(const HttpServerOptions& options);

class HttpServer {
 public:
  static Result<std::unique_ptr<HttpServer>> start(const HttpServerOptions& options, RequestHandler* handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }
  std::string endpoint() const { return endpoint_; }
  // Stops accepting, wakes every connection and joins their threads. Idempotent.
  void stop();
  int activeConnections() const { return active_.load(); }
  int queuedConnections() const { return queued_now_.load(); }
  int64_t unauthenticatedConnections() const { return client_budget_.total(); }
  const HttpServerOptions& options() const { return options_; }
  const HttpServerStats& stats() const { return stats_; }
  // The transport's counters as Prometheus text (dsec_http_*) and as the "http" object of GET /v1/node.
  void renderMetrics(std::string* out) const;
  nlohmann::json info() const;

 private:
  struct Queued {
    std::string client;
    double accepted_at;
  };
  struct ConnState;

  HttpServer(const HttpServerOptions& options, RequestHandler* handler)
      : options_(options),
        handler_(handler),
        client_budget_(clientConnectionLimit(options), std::max(1, options.max_connections / 2)) {}
  void acceptLoop();
  void acceptOne();
  // Whether the head bytes the client already sent on fd carry valid credentials (peeked, not read).
  bool sentValidToken(int fd);
  void enqueue(int fd, const std::string& client, double accepted_at);
  void unqueue(int fd);
  // The fd of the client's longest-waiting queued connection; -1 when it has none queued.
  int oldestQueued(const std::string& client) const;
  // Queued connections whose head now shows the token start at once (the queue's epoll reported data).
  void recheckQueued();
  // Starts queued connections whose client has a slot again; refuses those that waited too long.
  void admitQueued();
  double queueWaitSeconds() const;
  void startConnection(int fd, const std::string& client, double accepted_at, bool authenticated);
  void refuseForClient(int fd, const std::string& client);
  void releaseClientSlot(const std::string& client);
  void reapFinished(bool all);

  // One connection's thread (HttpConnection.cc): requests one after another while the connection keeps alive.
  enum class Next { kServe, kClose, kLingerAndClose };  // what the connection does after a step
  void serveConnection(int fd, ConnState& state);
  ConnectionContext connectionContext(ConnState& state);
  // Keep-alive: waits for the next request to start; false when the connection ends instead.
  bool awaitNextRequest(SocketStream& stream, const boost::beast::flat_buffer& buffer, const ConnState& state) const;
  // Reads a request head due by head_started + the head deadline; a late, oversized or malformed one is answered
  // here (408, 400) and ends the connection.
  Next readRequestHead(SocketStream& stream, boost::beast::flat_buffer& buffer,
                       http::request_parser<http::empty_body>& parser, double head_started);
  // Hands the exchange to the handler and answers for it if it did not.
  Next runExchange(HttpExchange& exchange);

  struct ConnThread {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };

  HttpServerOptions options_;
  RequestHandler* handler_;
  HttpServerStats stats_;
  ClientConnectionBudget client_budget_;
  // Connections over their client's budget (acceptor thread only): by fd, and each client's fds oldest first
  // (an fd no longer queued is skipped there). Their fds are in queue_epoll_ (edge-triggered: new head bytes).
  std::unordered_map<int, Queued> queued_;
  // Per client, its queued fds oldest first; exactly the fds in queued_ (unqueue removes an fd from its place).
  std::unordered_map<std::string, std::deque<int>> queue_order_;
  std::unordered_map<std::string, int> queued_per_client_;
  std::atomic<int> queued_now_{0};
  UniqueFd queue_epoll_;
  UniqueFd wake_fd_;  // written when a client slot frees while connections are queued
  UniqueFd listen_fd_;
  UniqueFd stop_fd_;
  int port_ = 0;
  std::string endpoint_;
  std::thread acceptor_;
  std::mutex mu_;
  std::list<ConnThread> conns_;
  std::atomic<int> active_{0};
  std::atomic<bool> stopped_{false};
};

// Maps a dsec error code to (HTTP status, API code).
std::pair<int, std::string> httpStatusFor(ErrorCode code);

}  // namespace dsec::launcher
