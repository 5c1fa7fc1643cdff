#include "dsec/common/Fault.h"

#include <atomic>
#include <cstdlib>
#include <mutex>

namespace dsec {
namespace {

std::mutex g_mu;
bool g_loaded = false;
// Read without the lock by checkFault: create and exec pass several fault points, and outside tests none is
// armed, so the common case must not serialise concurrent creates on g_mu.
std::atomic<bool> g_any_armed{false};
std::string g_point;

void loadLocked() {
  if (g_loaded) return;
  g_loaded = true;
  const char* env = std::getenv("DSEC_FAULT");
  if (env != nullptr) g_point = env;
  g_any_armed.store(!g_point.empty());
}

}  // namespace

void armFault(const std::string& point) {
  std::lock_guard lock(g_mu);
  g_loaded = true;
  g_point = point;
  g_any_armed.store(!g_point.empty());
}

std::string armedFault() {
  std::lock_guard lock(g_mu);
  loadLocked();
  return g_point;
}

Status checkFault(const char* point) {
  static const bool kLoaded = [] {
    std::lock_guard lock(g_mu);
    loadLocked();
    return true;
  }();
  (void)kLoaded;
  if (!g_any_armed.load(std::memory_order_relaxed)) return okStatus();
  std::lock_guard lock(g_mu);
  if (!g_point.empty() && g_point == point) {
    return Error(ErrorCode::kInternal, std::string("injected fault at ") + point);
  }
  return okStatus();
}

}  // namespace dsec
