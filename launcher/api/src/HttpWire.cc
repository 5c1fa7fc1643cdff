#include "HttpWire.h"

#include <sys/socket.h>

#include <boost/asio/error.hpp>
#include <boost/beast/http/error.hpp>
#include <cstdio>

namespace dsec::launcher::http_wire {

namespace http = boost::beast::http;
namespace net = boost::asio;
using nlohmann::json;

std::string dumpJson(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string errorBody(const std::string& code, const std::string& message) {
  return dumpJson(json{{"error", {{"code", code}, {"message", message}}}}) + "\n";
}

std::string secondsText(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", s);
  return buf;
}

void writeRawError(int fd, int status, const char* reason, const std::string& code, const std::string& message,
                   const std::string& extra_headers, const std::string& body_override) {
  std::string body = body_override.empty() ? errorBody(code, message) : body_override;
  std::string text = "HTTP/1.1 " + std::to_string(status) + " " + reason +
                     "\r\nServer: dsec\r\nContent-Type: application/json\r\nConnection: close\r\n" + extra_headers +
                     "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  (void)::send(fd, text.data(), text.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

void drainAvailable(int fd) {
  char sink[16 * 1024];
  for (int i = 0; i < 16; ++i) {
    ssize_t n = ::recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
    if (n <= 0) break;
  }
}

bool isQuietDisconnect(const boost::system::error_code& ec) {
  return ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::timed_out ||
         ec == net::error::operation_aborted || ec == net::error::connection_reset || ec == net::error::broken_pipe ||
         ec == http::error::partial_message;
}

}  // namespace dsec::launcher::http_wire
