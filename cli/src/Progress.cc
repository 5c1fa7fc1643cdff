#include "Progress.h"

#include <unistd.h>

#include <cstdio>
#include <iomanip>
#include <iostream>
#include <sstream>

namespace dsec::cli {
namespace {

constexpr auto kRedraw = std::chrono::milliseconds(200);
constexpr size_t kMaxLine = 100;  // a status line wider than a terminal would wrap and defeat the rewrite

std::string seconds(std::chrono::steady_clock::duration d) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << std::chrono::duration<double>(d).count() << " s";
  return s.str();
}

}  // namespace

Progress::Progress(std::string task) : Progress(std::move(task), std::cerr, ::isatty(STDERR_FILENO) == 1) {}

Progress::Progress(std::string task, std::ostream& out, bool terminal)
    : task_(std::move(task)), out_(out), terminal_(terminal) {
  if (terminal_) ticker_ = std::thread([this] { tick(); });
}

Progress::~Progress() {
  bool started = false;
  {
    std::lock_guard lock(mu_);
    started = steps_ > 0;
  }
  // A command refused before its first step has nothing to say here: its error says it.
  end(started ? "stopped after " + seconds(Clock::now() - started_) : "");
}

void Progress::step(const std::string& name, int64_t total) {
  std::lock_guard lock(mu_);
  if (finished_) return;
  step_ = name;
  detail_.clear();
  total_ = total;
  done_.store(0, std::memory_order_relaxed);
  ++steps_;
  step_started_ = Clock::now();
  held_ = false;
  if (terminal_) {
    draw();
  } else {
    out_ << task_ << ": " << name << (total > 0 ? " (" + std::to_string(total) + ")" : "") << "\n" << std::flush;
  }
}

void Progress::advance(int64_t n) { done_.fetch_add(n, std::memory_order_relaxed); }

void Progress::detail(std::string_view text) {
  std::lock_guard lock(mu_);
  detail_ = std::string(text);
  if (terminal_ && !finished_) draw();
}

void Progress::hold() {
  std::lock_guard lock(mu_);
  if (!terminal_ || held_) return;
  out_ << "\r" << std::string(drawn_, ' ') << "\r" << std::flush;
  drawn_ = 0;
  held_ = true;
}

void Progress::finish(const std::string& summary) {
  end("done in " + seconds(Clock::now() - started_) + (summary.empty() ? "" : ": " + summary));
}

void Progress::end(const std::string& last_line) {
  {
    std::lock_guard lock(mu_);
    if (finished_) return;
    finished_ = true;
    if (terminal_ && drawn_ > 0) out_ << "\r" << std::string(drawn_, ' ') << "\r";
    if (!last_line.empty()) out_ << task_ << ": " << last_line << "\n";
    out_ << std::flush;
  }
  wake_.notify_all();
  if (ticker_.joinable()) ticker_.join();
}

void Progress::draw() {
  if (held_ || step_.empty()) return;
  const auto now = Clock::now();
  std::ostringstream line;
  line << task_ << ": [" << steps_ << "] " << step_;
  if (total_ > 0) {
    const double elapsed = std::chrono::duration<double>(now - step_started_).count();
    const int64_t done = done_.load(std::memory_order_relaxed);
    line << " " << done << "/" << total_;
    if (elapsed > 0.5)
      line << " (" << std::fixed << std::setprecision(0) << static_cast<double>(done) / elapsed << "/s)";
  } else if (!detail_.empty()) {
    line << ": " << detail_;
  }
  std::string text = line.str();
  const std::string clock = "  " + seconds(now - step_started_);
  if (text.size() + clock.size() > kMaxLine) text = text.substr(0, kMaxLine - clock.size() - 3) + "...";
  text += clock;
  out_ << "\r" << text;
  if (text.size() < drawn_) out_ << std::string(drawn_ - text.size(), ' ');
  out_ << std::flush;
  drawn_ = text.size();
}

void Progress::tick() {
  std::unique_lock lock(mu_);
  while (!finished_) {
    wake_.wait_for(lock, kRedraw);
    if (!finished_) draw();
  }
}

}  // namespace dsec::cli
