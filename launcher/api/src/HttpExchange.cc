// HttpExchange (HttpServer.h): one request on a connection — reading its body under the body's rate floor, and
// writing its answer whole or as a stream — and the mapping of error codes to HTTP statuses.
#include <boost/asio/write.hpp>
#include <limits>

#include "HttpWire.h"
#include "dsec/launcher/api/HttpServer.h"

namespace dsec::launcher {
namespace {

namespace net = boost::asio;
using http_wire::dumpJson;
using http_wire::secondsText;
using nlohmann::json;
constexpr size_t kStreamBuffer = size_t{256} * 1024;

}  // namespace

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

bool HttpExchange::switchProtocols(const Fields& extra, std::string* early) {
  if (responded() || broken_) return false;
  http::response<http::empty_body> res{http::status::switching_protocols, 11};
  res.set(http::field::server, "dsec");
  for (const auto& [k, v] : extra) res.set(k, v);
  status_ = 101;
  keep_alive_ = false;
  boost::system::error_code ec;
  http::write(stream_, res, ec);
  if (ec) {
    broken_ = true;
    return false;
  }
  auto data = buffer_.data();
  early->assign(static_cast<const char*>(data.data()), data.size());
  buffer_.consume(data.size());
  return true;
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

}  // namespace dsec::launcher
