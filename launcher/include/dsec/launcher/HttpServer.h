// HTTP/1.1 transport for the node API: Boost.Beast parsing and serialisation over a blocking
// thread-per-connection design. One acceptor thread; each connection gets a thread running a keep-alive
// read/handle/write loop, so a slow exec or a large file transfer never blocks other clients. Every socket
// wait is a poll() with a timeout and the server's stop eventfd, so stop() is prompt and a silent client
// cannot pin a thread for ever.
#pragma once

#include <atomic>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"

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

 private:
  size_t readSome(void* data, size_t size, boost::system::error_code& ec);
  size_t writeSome(struct iovec* iov, int count, boost::system::error_code& ec);
  // Waits for `events` on the socket; false with ec set on timeout or stop.
  bool wait(short events, boost::system::error_code& ec);

  int fd_;
  int stop_fd_;
  int timeout_ms_;
};

// One request on a connection: its head, ways to read its body, and ways to answer it.
class HttpExchange {
 public:
  using Fields = std::vector<std::pair<std::string, std::string>>;

  HttpExchange(SocketStream& stream, boost::beast::flat_buffer& buffer,
               std::unique_ptr<http::request_parser<http::empty_body>> parser);
  ~HttpExchange();

  const http::request_header<>& head() const { return head_; }
  http::verb method() const { return head_.method(); }
  std::string_view target() const { return {head_.target().data(), head_.target().size()}; }
  bool hasBody() const;
  std::optional<uint64_t> contentLength() const;

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

  bool responded() const { return status_ != 0; }
  int status() const { return status_; }
  // Whether the connection can carry another request after this one.
  bool keepAlive() const { return keep_alive_ && !broken_; }
  void forceClose() { keep_alive_ = false; }
  bool broken() const { return broken_; }
  bool bodyPending() const;
  bool streamOpen() const { return stream_open_; }
  bool streamChunked() const { return chunked_; }

 private:
  void sendContinueIfExpected();
  void writeHead(http::response_header<>& head);

  SocketStream& stream_;
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

class RequestHandler {
 public:
  virtual ~RequestHandler() = default;
  // Must answer (every path ends in a response unless the connection broke).
  virtual void handle(HttpExchange& exchange) = 0;
  // Called once per response with its status (metrics).
  virtual void onResponse(int /*status*/) {}
};

struct HttpServerOptions {
  std::string listen = "127.0.0.1:0";
  int max_connections = 1024;
  int idle_timeout_ms = 120000;  // keep-alive wait and per-read/write inactivity
  uint32_t header_limit = 64 * 1024;
};

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

 private:
  HttpServer(const HttpServerOptions& options, RequestHandler* handler) : options_(options), handler_(handler) {}
  void acceptLoop();
  void serveConnection(int fd);
  void reapFinished(bool all);

  struct ConnThread {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };

  HttpServerOptions options_;
  RequestHandler* handler_;
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

// "127.0.0.1:8470", "[::1]:0", ":8470" (all interfaces) -> address and port.
Result<std::pair<std::string, int>> parseListenAddress(const std::string& listen);
// Maps a dsec error code to (HTTP status, API code).
std::pair<int, std::string> httpStatusFor(ErrorCode code);

}  // namespace dsec::launcher
