#include "dsec/common/Logging.h"

#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <ctime>

namespace dsec {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};

const char* levelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kInfo:
      return "INFO ";
    case LogLevel::kWarn:
      return "WARN ";
    case LogLevel::kError:
      return "ERROR";
  }
  return "?    ";
}

}  // namespace

void setLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel logLevel() { return static_cast<LogLevel>(g_level.load()); }

bool parseLogLevel(const std::string& name, LogLevel* out) {
  if (name == "debug") {
    *out = LogLevel::kDebug;
  } else if (name == "info") {
    *out = LogLevel::kInfo;
  } else if (name == "warn") {
    *out = LogLevel::kWarn;
  } else if (name == "error") {
    *out = LogLevel::kError;
  } else {
    return false;
  }
  return true;
}

void logLine(LogLevel level, const char* component, const std::string& message) {
  struct timeval tv {};
  gettimeofday(&tv, nullptr);
  struct tm tm {};
  gmtime_r(&tv.tv_sec, &tm);
  char stamp[40];
  strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);
  // One write per line so lines from concurrent threads do not interleave.
  char head[96];
  int n = snprintf(head, sizeof(head), "%s.%03ldZ %s %s: ", stamp, static_cast<long>(tv.tv_usec / 1000),
                   levelName(level), component);
  std::string line(head, n > 0 ? static_cast<size_t>(n) : 0);
  line += message;
  line += '\n';
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace dsec
