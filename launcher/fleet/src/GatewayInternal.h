// Helpers shared by the gateway's source files (Gateway*.cc).
#pragma once

#include <cstdio>
#include <string>

namespace dsec::launcher::gateway_internal {

constexpr const char* kLog = "gateway";

// "2.5s"
inline std::string secondsText(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1fs", s);
  return buf;
}

}  // namespace dsec::launcher::gateway_internal
