// One line per event on stderr: "2026-11-29T17:00:00.123Z INFO  container: created n0-1a2b (2.1 ms)".
#pragma once

#include <sstream>
#include <string>

namespace dsec {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

void setLogLevel(LogLevel level);
LogLevel logLevel();
// Parses "debug|info|warn|error"; false if the name is unknown.
bool parseLogLevel(const std::string& name, LogLevel* out);
void logLine(LogLevel level, const char* component, const std::string& message);

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* component) : level_(level), component_(component) {}
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  ~LogMessage() { logLine(level_, component_, stream_.str()); }
  std::ostringstream& stream() { return stream_; }

 private:
  LogLevel level_;
  const char* component_;
  std::ostringstream stream_;
};

}  // namespace dsec

// DSEC_LOG(kInfo, "container") << "created " << id;   (a for-loop, not an if, so it nests without braces)
#define DSEC_LOG(level, component)                                                                            \
  for (bool dsec_log_on_ = ::dsec::LogLevel::level >= ::dsec::logLevel(); dsec_log_on_; dsec_log_on_ = false) \
  ::dsec::LogMessage(::dsec::LogLevel::level, component).stream()
