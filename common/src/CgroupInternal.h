// Helpers shared by the v1 and v2 cgroup drivers (private to common/src).
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "dsec/common/Cgroup.h"

namespace dsec::cgroup_internal {

// Freezing 100 tasks takes ~1 ms here; a cgroup that does not freeze or empty within this is stuck (a task in
// uninterruptible sleep on a dead NFS server, say) and the caller gets kTimeout instead of hanging.
constexpr double kFreezeTimeoutSeconds = 5.0;
constexpr double kKillTimeoutSeconds = 5.0;
// rmdir right after the last task exits can still see EBUSY for a moment while the kernel finishes teardown.
constexpr double kRemoveBusyRetrySeconds = 2.0;

inline std::string joinPath(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  return a.back() == '/' ? a + b : a + "/" + b;
}

// A sandbox cgroup name is one path component: no traversal out of the parent.
inline Status validateCgroupName(const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos || name.size() > 200) {
    return Error::invalid("invalid cgroup name '" + name + "'");
  }
  return okStatus();
}

inline std::string_view trimView(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\n' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

inline std::optional<int64_t> parseInt64(std::string_view s) {
  s = trimView(s);
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

// The value of "key N" in a flat keyed file (memory.events, cpu.stat, cgroup.events, memory.oom_control).
inline std::optional<int64_t> keyedValue(std::string_view text, std::string_view key) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    if (line.size() > key.size() && line.substr(0, key.size()) == key && line[key.size()] == ' ') {
      return parseInt64(line.substr(key.size() + 1));
    }
    pos = end + 1;
  }
  return std::nullopt;
}

inline std::vector<pid_t> parsePids(std::string_view text) {
  std::vector<pid_t> pids;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    if (auto v = parseInt64(text.substr(pos, end - pos)); v && *v > 0) pids.push_back(static_cast<pid_t>(*v));
    pos = end + 1;
  }
  return pids;
}

// Calls done() with a short, growing back-off until it returns true, returns an error, or time runs out
// (kTimeout naming what).
inline Status pollUntil(const std::function<Result<bool>()>& done, double timeout_seconds, const std::string& what) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  auto delay = std::chrono::microseconds(50);
  for (;;) {
    Result<bool> r = done();
    if (!r.ok()) return r.error();
    if (*r) return okStatus();
    if (std::chrono::steady_clock::now() >= deadline) {
      return Error(ErrorCode::kTimeout, what + ": not done after " + std::to_string(timeout_seconds) + " s");
    }
    std::this_thread::sleep_for(delay);
    delay = std::min(delay * 2, std::chrono::microseconds(10000));
  }
}

// mkdir that treats "already there" as success (parents shared by concurrent creates).
inline Status makeDirIfMissing(CgroupFs& fs, const std::string& path) {
  Status s = fs.makeDir(path);
  if (!s.ok() && s.error().sysErrno() != EEXIST) return s;
  return okStatus();
}

// mkdir -p of base/rel where base exists.
inline Status makeDirsUnder(CgroupFs& fs, const std::string& base, const std::string& rel) {
  std::string cur = base;
  size_t pos = 0;
  while (pos <= rel.size()) {
    size_t end = rel.find('/', pos);
    if (end == std::string::npos) end = rel.size();
    if (end > pos) {
      cur = joinPath(cur, rel.substr(pos, end - pos));
      if (!fs.exists(cur)) DSEC_TRY(makeDirIfMissing(fs, cur));
    }
    pos = end + 1;
  }
  return okStatus();
}

// rmdir of each directory, retrying those that report EBUSY for a short while (all together, so a cgroup that
// really still has tasks costs one wait, not one per hierarchy). A missing directory is fine: removal is
// idempotent. Returns the first hard error, or the last EBUSY when time ran out.
inline Status removeDirsPatiently(CgroupFs& fs, std::vector<std::string> dirs) {
  Status first_error = okStatus();
  Status last_busy = okStatus();
  Status polled = pollUntil(
      [&]() -> Result<bool> {
        std::vector<std::string> busy;
        for (const auto& dir : dirs) {
          Status s = fs.removeDir(dir);
          if (s.ok() || s.error().sysErrno() == ENOENT) continue;
          if (s.error().sysErrno() == EBUSY) {
            busy.push_back(dir);
            last_busy = s;
          } else if (first_error.ok()) {
            first_error = s;
          }
        }
        dirs = std::move(busy);
        return dirs.empty();
      },
      kRemoveBusyRetrySeconds, "rmdir");
  if (!first_error.ok()) return first_error;
  if (!polled.ok() && !last_busy.ok()) return last_busy;
  return polled;
}

// An EEXIST from mkdir of the sandbox's own cgroup means the name is taken.
inline Error mapMkdirError(const Error& e, const std::string& name) {
  if (e.sysErrno() == EEXIST) return Error(ErrorCode::kAlreadyExists, "cgroup " + name + " already exists", EEXIST);
  return e.wrap("creating cgroup " + name);
}

}  // namespace dsec::cgroup_internal
