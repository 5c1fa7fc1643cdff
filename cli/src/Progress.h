// Progress of a long command (a layer build, a benchmark) on stderr. On a terminal: one status line rewritten in
// place (the step, its count and rate or its latest detail, the time it has taken), refreshed by a ticker a few
// times a second. Anywhere else (a log, a pipe): one line as each step starts and one at the end, nothing in
// between, so logs stay quiet and every line says something.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <ostream>
#include <string>
#include <string_view>
#include <thread>

namespace dsec::cli {

class Progress {
 public:
  // task: what the command does ("layer build python:3"), the prefix of every line. terminal: whether out is one
  // (by default: whether stderr is a terminal, and out is std::cerr).
  explicit Progress(std::string task);
  Progress(std::string task, std::ostream& out, bool terminal);
  ~Progress();  // "stopped after N s" if finish() was not called (the command failed)
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // A new step; total > 0 makes it counted (advance() counts). The previous step ends.
  void step(const std::string& name, int64_t total = 0);
  // Counts n done in the current step (any thread).
  void advance(int64_t n = 1);
  // The current step's latest news (a tool's own progress line): shown on a terminal, not logged.
  void detail(std::string_view text);
  // Before other output goes to the terminal (a build command's streamed output): clears the status line and
  // stops redrawing it until the next step.
  void hold();
  // The last line: the task's total time and the summary.
  void finish(const std::string& summary = "");

  bool terminal() const { return terminal_; }

 private:
  using Clock = std::chrono::steady_clock;
  void end(const std::string& last_line);
  void draw();  // under mu_
  void tick();

  const std::string task_;
  std::ostream& out_;
  const bool terminal_;
  const Clock::time_point started_ = Clock::now();
  std::mutex mu_;
  std::condition_variable wake_;
  std::string step_;
  std::string detail_;
  int steps_ = 0;
  int64_t total_ = 0;
  std::atomic<int64_t> done_{0};  // lock-free: advance() sits in benchmarks' hot loops
  Clock::time_point step_started_ = started_;
  bool held_ = false;
  bool finished_ = false;
  size_t drawn_ = 0;  // width of the status line on screen
  std::thread ticker_;
};

}  // namespace dsec::cli
