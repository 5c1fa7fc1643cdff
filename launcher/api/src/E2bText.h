// What the E2B listener's two halves share (E2bFront.cc, E2bEnvd.cc; internal).
#pragma once

#include <string>
#include <string_view>

#include "dsec/launcher/api/HttpServer.h"

namespace dsec::launcher::e2b {

// A request header's value, "" when absent.
inline std::string header(const HttpExchange& ex, std::string_view name) {
  auto it = ex.head().find(boost::beast::string_view(name.data(), name.size()));
  return it == ex.head().end() ? std::string() : std::string(it->value());
}

}  // namespace dsec::launcher::e2b
