#include "dsec/common/Fault.h"

#include <cstdlib>
#include <mutex>

namespace dsec {
namespace {

std::mutex g_mu;
bool g_loaded = false;
std::string g_point;

void loadLocked() {
  if (g_loaded) return;
  g_loaded = true;
  const char* env = std::getenv("DSEC_FAULT");
  if (env != nullptr) g_point = env;
}

}  // namespace

void armFault(const std::string& point) {
  std::lock_guard lock(g_mu);
  g_loaded = true;
  g_point = point;
}

std::string armedFault() {
  std::lock_guard lock(g_mu);
  loadLocked();
  return g_point;
}

Status checkFault(const char* point) {
  std::lock_guard lock(g_mu);
  loadLocked();
  if (!g_point.empty() && g_point == point) {
    return Error(ErrorCode::kInternal, std::string("injected fault at ") + point);
  }
  return okStatus();
}

}  // namespace dsec
