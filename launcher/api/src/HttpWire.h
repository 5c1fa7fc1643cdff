// What the HTTP transport's files share (HttpServer.h): answers written straight to a socket before there is an
// exchange to answer through (an unparsable or late head, a connection over a cap), and the text they are made
// of. Private to dsec_api.
#pragma once

#include <boost/system/error_code.hpp>
#include <nlohmann/json.hpp>
#include <string>

namespace dsec::launcher::http_wire {

constexpr const char* kLog = "http";

std::string dumpJson(const nlohmann::json& j);
// The JSON error body of the API: {"error": {"code": ..., "message": ...}} and a newline.
std::string errorBody(const std::string& code, const std::string& message);
// 2.5 -> "2.5": seconds as a message quotes them.
std::string secondsText(double s);

// For failures before there is a request to answer (unparsable or late head, too many connections). Best
// effort and never blocking: the socket buffer of a fresh connection takes it whole. extra_headers are whole
// "Name: value\r\n" lines; body_override replaces the default error body.
void writeRawError(int fd, int status, const char* reason, const std::string& code, const std::string& message,
                   const std::string& extra_headers = "", const std::string& body_override = "");
// Reads and drops what the client already sent (without waiting), so that closing after an early answer sends
// a FIN rather than a reset that could destroy the answer before the client reads it.
void drainAvailable(int fd);
// A client that went away or went quiet: nothing to answer, nothing to log.
bool isQuietDisconnect(const boost::system::error_code& ec);

}  // namespace dsec::launcher::http_wire
