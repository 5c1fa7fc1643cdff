#include "HttpTestClient.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/write.hpp>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>

#include "dsec/common/Endpoint.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {

namespace http = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

nlohmann::json HttpReply::json() const {
  auto j = nlohmann::json::parse(body, nullptr, false);
  return j;
}

std::string HttpReply::errorCode() const {
  auto j = json();
  if (j.is_object() && j.contains("error") && j["error"].is_object()) return j["error"].value("code", "");
  return "";
}

HttpTestClient::HttpTestClient(const std::string& endpoint, std::string token) : token_(std::move(token)) {
  auto ep = parseEndpoint(endpoint);
  if (!ep.ok()) throw std::invalid_argument(ep.error().message());
  host_ = ep->host;
  port_ = ep->port;
}

HttpTestClient::~HttpTestClient() = default;

void HttpTestClient::connect() {
  socket_ = std::make_unique<tcp::socket>(io_);
  socket_->connect(tcp::endpoint(net::ip::make_address(host_), static_cast<uint16_t>(port_)));
  buffer_.clear();
}

void HttpTestClient::prepare(http::request_header<>& head, bool auth,
                             const std::map<std::string, std::string>& headers) {
  head.set(http::field::host, host_);
  if (auth) head.set(http::field::authorization, "Bearer " + token_);
  for (const auto& [k, v] : headers) head.set(k, v);
}

namespace {

template <class Parser>
HttpReply finish(Parser& parser) {
  HttpReply reply;
  auto& msg = parser.get();
  reply.status = static_cast<int>(msg.result_int());
  for (const auto& f : msg) {
    std::string name(f.name_string());
    for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    reply.headers[name] = std::string(f.value());
  }
  reply.closed = !msg.keep_alive();
  return reply;
}

}  // namespace

HttpReply HttpTestClient::request(http::verb method, const std::string& target, const std::string& body,
                                  const std::map<std::string, std::string>& headers, bool auth) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (!socket_) connect();
    http::request<http::string_body> req{method, target, 11};
    prepare(req.base(), auth, headers);
    req.body() = body;
    req.prepare_payload();
    boost::system::error_code ec;
    http::write(*socket_, req, ec);
    http::response_parser<http::string_body> parser;
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    if (!ec) http::read(*socket_, buffer_, parser, ec);
    if (ec) {
      // A kept-alive connection the server closed meanwhile: retry once on a fresh one.
      socket_.reset();
      if (attempt == 0) continue;
      throw std::runtime_error("request " + target + ": " + ec.message());
    }
    HttpReply reply = finish(parser);
    reply.body = std::move(parser.get().body());
    if (reply.closed) socket_.reset();
    return reply;
  }
  throw std::runtime_error("unreachable");
}

HttpReply HttpTestClient::putStreamed(const std::string& target, uint64_t size,
                                      const std::function<std::string(uint64_t)>& next) {
  connect();
  http::request<http::empty_body> req{http::verb::put, target, 11};
  prepare(req.base(), true, {{"Content-Type", "application/octet-stream"}});
  req.content_length(size);
  http::request_serializer<http::empty_body> sr{req};
  http::write_header(*socket_, sr);
  uint64_t sent = 0;
  boost::system::error_code ec;
  while (sent < size && !ec) {
    std::string piece = next(sent);
    if (piece.empty()) break;
    net::write(*socket_, net::buffer(piece), ec);
    sent += piece.size();
  }
  http::response_parser<http::string_body> parser;
  http::read(*socket_, buffer_, parser, ec);
  if (ec) {
    socket_.reset();
    throw std::runtime_error("streamed PUT " + target + ": " + ec.message());
  }
  HttpReply reply = finish(parser);
  reply.body = std::move(parser.get().body());
  socket_.reset();
  return reply;
}

HttpReply HttpTestClient::getStreamed(const std::string& target, const std::function<void(const char*, size_t)>& sink) {
  connect();
  http::request<http::empty_body> req{http::verb::get, target, 11};
  prepare(req.base(), true, {});
  http::write(*socket_, req);
  return readStreamed(target, sink);
}

HttpReply HttpTestClient::postJsonStreamed(const std::string& target, const nlohmann::json& body,
                                           const std::function<void(const char*, size_t)>& sink) {
  connect();
  http::request<http::string_body> req{http::verb::post, target, 11};
  prepare(req.base(), true, {{"Content-Type", "application/json"}});
  req.body() = body.dump();
  req.prepare_payload();
  http::write(*socket_, req);
  return readStreamed(target, sink);
}

HttpReply HttpTestClient::readStreamed(const std::string& target,
                                       const std::function<void(const char*, size_t)>& sink) {
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  http::read_header(*socket_, buffer_, parser);
  std::vector<char> buf(256 << 10);
  HttpReply reply;
  std::string small;  // an error body is small: keep it
  while (!parser.is_done()) {
    parser.get().body().data = buf.data();
    parser.get().body().size = buf.size();
    boost::system::error_code ec;
    http::read(*socket_, buffer_, parser, ec);
    if (ec == http::error::need_buffer) ec = {};
    if (ec) {
      socket_.reset();
      throw std::runtime_error("streamed answer of " + target + ": " + ec.message());
    }
    size_t n = buf.size() - parser.get().body().size;
    if (parser.get().result_int() == 200) {
      sink(buf.data(), n);
    } else {
      small.append(buf.data(), n);
    }
  }
  reply = finish(parser);
  reply.body = small;
  socket_.reset();
  return reply;
}

std::string HttpTestClient::raw(const std::string& bytes, double timeout_seconds, bool half_close) {
  tcp::socket s(io_);
  s.connect(tcp::endpoint(net::ip::make_address(host_), static_cast<uint16_t>(port_)));
  boost::system::error_code ec;
  net::write(s, net::buffer(bytes), ec);
  if (half_close) s.shutdown(tcp::socket::shutdown_send, ec);
  std::string out;
  double deadline = monotonicSeconds() + timeout_seconds;
  char buf[4096];
  while (monotonicSeconds() < deadline) {
    struct pollfd pfd = {s.native_handle(), POLLIN, 0};
    if (::poll(&pfd, 1, 100) <= 0) continue;
    ssize_t n = ::recv(s.native_handle(), buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

namespace {
int64_t statusField(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::string(key).size())) * 1024;
  }
  return -1;
}
}  // namespace

int64_t residentBytes() { return statusField("VmRSS:"); }
int64_t peakResidentBytes() { return statusField("VmHWM:"); }
void resetPeakRss() { std::ofstream("/proc/self/clear_refs") << "5"; }

}  // namespace dsec::testing
