#include "HttpTestClient.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <fstream>
#include <limits>
#include <stdexcept>

#include "dsec/common/Endpoint.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {

namespace http = boost::beast::http;
namespace client = launcher::client;

namespace {

// Long enough for any exec a test runs, short enough that a server that stops answering fails the test.
constexpr int kIoTimeoutMs = 300 * 1000;

std::string lowerCase(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The product's reply as a test reads it: header names in lower case. A transport failure throws.
HttpReply testReply(const std::string& what, Result<client::HttpReply> reply) {
  if (!reply.ok()) throw std::runtime_error(what + ": " + reply.error().message());
  HttpReply out;
  out.status = reply->status;
  out.body = std::move(reply->body);
  out.closed = reply->closed;
  for (auto& [name, value] : reply->headers) out.headers[lowerCase(name)] = std::move(value);
  return out;
}

}  // namespace

nlohmann::json HttpReply::json() const { return nlohmann::json::parse(body, nullptr, false); }

std::string HttpReply::errorCode() const {
  auto j = json();
  if (j.is_object() && j.contains("error") && j["error"].is_object()) return j["error"].value("code", "");
  return "";
}

HttpTestClient::HttpTestClient(const std::string& endpoint, std::string token)
    : endpoint_(endpoint), token_(std::move(token)) {
  auto ep = parseEndpoint(endpoint);
  if (!ep.ok()) throw std::invalid_argument(ep.error().message());
  host_ = ep->host;
  port_ = ep->port;
}

HttpTestClient::~HttpTestClient() = default;

client::CallOptions HttpTestClient::options(const std::map<std::string, std::string>& headers) {
  client::CallOptions o;
  o.io_timeout_ms = kIoTimeoutMs;
  o.pool = &pool_;
  o.max_body_bytes = std::numeric_limits<uint64_t>::max();
  o.all_headers = true;
  o.headers.assign(headers.begin(), headers.end());
  return o;
}

HttpReply HttpTestClient::request(http::verb method, const std::string& target, const std::string& body,
                                  const std::map<std::string, std::string>& headers, bool auth) {
  return testReply("request " + target,
                   client::call(endpoint_, method, target, tokenFor(auth), body, options(headers)));
}

HttpReply HttpTestClient::putStreamed(const std::string& target, uint64_t size,
                                      const std::function<std::string(uint64_t)>& next) {
  return testReply("streamed PUT " + target,
                   client::callUpload(endpoint_, http::verb::put, target, token_, size, next, options({})));
}

HttpReply HttpTestClient::getStreamed(const std::string& target, const std::function<void(const char*, size_t)>& sink) {
  auto on_body = [&sink](const char* data, size_t n) {
    sink(data, n);
    return true;
  };
  return testReply("streamed answer of " + target,
                   client::callStreaming(endpoint_, http::verb::get, target, token_, "", options({}), on_body));
}

HttpReply HttpTestClient::postJsonStreamed(const std::string& target, const nlohmann::json& body,
                                           const std::function<void(const char*, size_t)>& sink) {
  auto on_body = [&sink](const char* data, size_t n) {
    sink(data, n);
    return true;
  };
  return testReply("streamed answer of " + target, client::callStreaming(endpoint_, http::verb::post, target, token_,
                                                                         body.dump(), options({}), on_body));
}

std::string HttpTestClient::raw(const std::string& bytes, double timeout_seconds, bool half_close) {
  auto fd = client::connectTo(endpoint_, options({}));
  if (!fd.ok()) throw std::runtime_error("raw: " + fd.error().message());
  // Blocking sends: the bytes go out whole, whatever the server makes of them.
  ::fcntl(fd->get(), F_SETFL, ::fcntl(fd->get(), F_GETFL) & ~O_NONBLOCK);
  for (size_t off = 0; off < bytes.size();) {
    ssize_t n = ::send(fd->get(), bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server closed early: what it said is still read below
    off += static_cast<size_t>(n);
  }
  if (half_close) ::shutdown(fd->get(), SHUT_WR);
  std::string out;
  double deadline = monotonicSeconds() + timeout_seconds;
  char buf[4096];
  while (monotonicSeconds() < deadline) {
    struct pollfd pfd = {fd->get(), POLLIN, 0};
    if (::poll(&pfd, 1, 100) <= 0) continue;
    ssize_t n = ::recv(fd->get(), buf, sizeof(buf), 0);
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
