// Small text helpers the E2B listener's two halves share (E2bFront.cc, E2bEnvd.cc; internal).
#pragma once

#include <cctype>
#include <ctime>
#include <string>
#include <string_view>

#include "dsec/launcher/api/HttpServer.h"

namespace dsec::launcher::e2b {

// A request header's value, "" when absent.
inline std::string header(const HttpExchange& ex, std::string_view name) {
  auto it = ex.head().find(boost::beast::string_view(name.data(), name.size()));
  return it == ex.head().end() ? std::string() : std::string(it->value());
}

// Percent-encoding for a query value of the dsec API ('/' kept: paths stay readable).
inline std::string queryEncode(const std::string& s) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == '/') {
      out.push_back(static_cast<char>(c));
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// "2026-12-07T12:00:00Z".
inline std::string rfc3339(double unix_seconds) {
  std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace dsec::launcher::e2b
