// exec: a command in the sandbox root, in its own session and process group, in the sandbox's cgroup (joined
// before it execs), with pipes or a terminal of the guest; output streamed back, capped, with a timeout.
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "GuestAgent.h"

namespace dsec::guest {
namespace {

int64_t nowMs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  void reset(int f = -1) {
    if (fd >= 0) close(fd);
    fd = f;
  }
};

// What the child needs, prepared before fork (the child only makes system calls).
struct ChildPlan {
  std::vector<std::string> candidates;  // argv[0] resolved along PATH
  std::vector<std::string> argv_s, env_s;
  std::vector<char*> argv, envp;
  std::string cwd;
  int cgroup_fd = -1;
  int root_fd = -1;  // the sandbox root (by fd: once the image's init runs, /sandbox is no longer its path)
  int stdin_fd = -1, stdout_fd = -1, stderr_fd = -1;  // pipes' child ends, or the terminal's slave
  bool tty = false;
  int status_fd = -1;  // write end: errno if it could not exec
};

[[noreturn]] void runChild(const ChildPlan& p) {
  sigset_t all;
  sigemptyset(&all);
  sigprocmask(SIG_SETMASK, &all, nullptr);
  signal(SIGPIPE, SIG_DFL);
  int err = 0;
  if (setsid() < 0) err = errno;
  // Into the sandbox's cgroup before anything of the command runs (the pids limit holds from its first fork).
  if (err == 0 && p.cgroup_fd >= 0 && ::write(p.cgroup_fd, "0", 1) != 1) err = errno;
  if (err == 0 && (fchdir(p.root_fd) != 0 || chroot(".") != 0)) err = errno;
  if (err == 0 && chdir(p.cwd.c_str()) != 0) err = errno;
  if (err == 0 && p.tty && ioctl(p.stdin_fd, TIOCSCTTY, 0) != 0) err = errno;
  if (err == 0) {
    if (dup2(p.stdin_fd, 0) < 0 || dup2(p.stdout_fd, 1) < 0 || dup2(p.stderr_fd, 2) < 0) err = errno;
  }
  if (err == 0) {
    err = ENOENT;
    for (const auto& c : p.candidates) {
      execve(c.c_str(), p.argv.data(), p.envp.data());
      if (errno != ENOENT && errno != ENOTDIR) err = errno;
    }
  }
  (void)!::write(p.status_fd, &err, sizeof err);
  _exit(127);
}

class ExecRun {
 public:
  ExecRun(Port& port, uint32_t request, proto::ExecMsg msg) : port_(port), request_(request), msg_(std::move(msg)) {}

  void run(std::optional<proto::Frame>* pending) {
    if (!start()) return;
    loop(pending);
  }

 private:
  bool start() {
    ChildPlan plan;
    std::map<std::string, std::string> env;
    {
      std::lock_guard lock(sandbox().mu);
      if (!sandbox().ready) {
        port_.sendError(request_, ENODEV, "the sandbox is not set up");
        return false;
      }
      plan.root_fd = sandbox().root_fd;
      env = sandbox().env;
    }
    env.emplace("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    env.emplace("HOME", "/root");
    if (msg_.tty) env.emplace("TERM", "xterm-256color");
    for (const auto& [k, v] : msg_.env) env[k] = v;
    for (const auto& [k, v] : env) {
      if (k.empty() || k.find('=') != std::string::npos) continue;
      plan.env_s.push_back(k + "=" + v);
    }
    plan.argv_s = msg_.argv;
    for (auto& s : plan.argv_s) plan.argv.push_back(s.data());
    plan.argv.push_back(nullptr);
    for (auto& s : plan.env_s) plan.envp.push_back(s.data());
    plan.envp.push_back(nullptr);
    const std::string& name = msg_.argv[0];
    if (name.find('/') != std::string::npos) {
      plan.candidates.push_back(name);
    } else {
      std::string path = env["PATH"];
      size_t pos = 0;
      while (pos <= path.size()) {
        size_t end = path.find(':', pos);
        if (end == std::string::npos) end = path.size();
        std::string dir = path.substr(pos, end - pos);
        plan.candidates.push_back((dir.empty() ? "." : dir) + "/" + name);
        pos = end + 1;
      }
    }
    plan.cwd = msg_.cwd.empty() ? "/" : msg_.cwd;
    Fd cgroup(open((std::string(kSandboxCgroup) + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
    plan.cgroup_fd = cgroup.fd;

    Fd child_in, child_out, child_err, status_r, status_w;
    int sp[2];
    if (pipe2(sp, O_CLOEXEC) != 0) return fail(errno, "pipe");
    status_r.reset(sp[0]);
    status_w.reset(sp[1]);
    if (msg_.tty) {
      master_.reset(posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC));
      if (master_.fd < 0 || grantpt(master_.fd) != 0 || unlockpt(master_.fd) != 0) return fail(errno, "openpt");
      char slave_name[128];
      if (ptsname_r(master_.fd, slave_name, sizeof slave_name) != 0) return fail(errno, "ptsname");
      child_in.reset(open(slave_name, O_RDWR | O_NOCTTY | O_CLOEXEC));
      if (child_in.fd < 0) return fail(errno, "open terminal");
      winsize ws{};
      ws.ws_row = static_cast<unsigned short>(msg_.rows);
      ws.ws_col = static_cast<unsigned short>(msg_.cols);
      ioctl(master_.fd, TIOCSWINSZ, &ws);
      plan.stdin_fd = plan.stdout_fd = plan.stderr_fd = child_in.fd;
      plan.tty = true;
      fcntl(master_.fd, F_SETFL, O_NONBLOCK);
    } else {
      int in[2], out[2], err[2];
      if (pipe2(in, O_CLOEXEC) != 0) return fail(errno, "pipe");
      child_in.reset(in[0]);
      stdin_.reset(in[1]);
      if (pipe2(out, O_CLOEXEC) != 0) return fail(errno, "pipe");
      out_.reset(out[0]);
      child_out.reset(out[1]);
      if (pipe2(err, O_CLOEXEC) != 0) return fail(errno, "pipe");
      err_.reset(err[0]);
      child_err.reset(err[1]);
      plan.stdin_fd = child_in.fd;
      plan.stdout_fd = child_out.fd;
      plan.stderr_fd = child_err.fd;
      for (int fd : {stdin_.fd, out_.fd, err_.fd}) fcntl(fd, F_SETFL, O_NONBLOCK);
    }
    plan.status_fd = status_w.fd;
    if (!msg_.stdin_stream) stdin_buf_ = msg_.stdin_data;
    stdin_eof_ = !msg_.stdin_stream;

    started_ms_ = nowMs();
    int exit_fd = -1;
    pid_ = Reaper::instance().forkTracked(&exit_fd);
    if (pid_ == 0) runChild(plan);
    if (pid_ < 0) return fail(errno, "fork");
    exit_event_.reset(exit_fd);
    status_w.reset();
    child_in.reset();
    child_out.reset();
    child_err.reset();
    int child_errno = 0;
    ssize_t n;
    do {
      n = ::read(status_r.fd, &child_errno, sizeof child_errno);
    } while (n < 0 && errno == EINTR);
    if (n == static_cast<ssize_t>(sizeof child_errno)) {
      Reaper::instance().takeStatus(pid_);
      pid_ = -1;
      std::string why = child_errno == EAGAIN ? "the sandbox's pids limit is reached" : msg_.argv[0];
      port_.sendError(request_, child_errno, why + ": " + strerror(child_errno));
      return false;
    }
    if (msg_.timeout_ms > 0) deadline_ms_ = started_ms_ + msg_.timeout_ms;
    return port_.send(proto::FrameType::kStarted, request_, {});
  }

  bool fail(int err, const char* what) {
    port_.sendError(request_, err, std::string(what) + ": " + strerror(err));
    return false;
  }

  void killGroup(int sig) {
    if (pid_ > 0 && !exited_) kill(-pid_, sig);
  }

  // Reads what one output fd has; false at its end.
  bool drain(Fd& fd, proto::FrameType type, int64_t& sent) {
    char buf[proto::kMaxChunk];
    for (int rounds = 0; rounds < 16; ++rounds) {
      ssize_t n = ::read(fd.fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) return true;
      if (n <= 0) {  // EOF, or EIO from a terminal whose every slave is closed
        fd.reset();
        return false;
      }
      int64_t keep = std::min<int64_t>(n, std::max<int64_t>(0, msg_.output_cap - sent));
      if (keep < n) truncated_ = true;
      if (keep > 0) {
        if (!port_.sendChunks(type, request_, buf, static_cast<size_t>(keep))) peer_gone_ = true;
        sent += keep;
      }
    }
    return true;
  }

  void feedStdin() {
    int fd = msg_.tty ? master_.fd : stdin_.fd;
    while (fd >= 0 && !stdin_buf_.empty()) {
      ssize_t n = ::write(fd, stdin_buf_.data(), stdin_buf_.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) return;
      if (n <= 0) {  // the command closed its stdin: what is left is dropped
        stdin_buf_.clear();
        if (!msg_.tty) stdin_.reset();
        return;
      }
      stdin_buf_.erase(0, static_cast<size_t>(n));
    }
    if (stdin_buf_.empty() && stdin_eof_ && !stdin_closed_) {
      stdin_closed_ = true;
      if (msg_.tty) {
        // The terminal's end-of-file character, typed.
        termios t{};
        char veof = tcgetattr(master_.fd, &t) == 0 ? static_cast<char>(t.c_cc[VEOF]) : '\x04';
        (void)!::write(master_.fd, &veof, 1);
      } else {
        stdin_.reset();
      }
    }
  }

  // A frame that came while the command runs.
  bool onFrame(proto::Frame& f, std::optional<proto::Frame>* pending) {
    if (f.type == proto::FrameType::kHello) {
      *pending = std::move(f);
      return false;
    }
    if (f.request != request_) return true;
    switch (f.type) {
      case proto::FrameType::kStdin:
        if (!stdin_eof_ && stdin_buf_.size() < (8u << 20)) stdin_buf_ += f.payload;
        break;
      case proto::FrameType::kStdinEof:
        stdin_eof_ = true;
        break;
      case proto::FrameType::kCancel:
        killGroup(SIGKILL);
        break;
      case proto::FrameType::kSignal: {
        proto::SignalMsg m;
        if (!m.decode(f.payload)) break;
        pid_t target = pid_;
        if (msg_.tty) {
          pid_t fg = tcgetpgrp(master_.fd);
          if (fg > 0) target = fg;
        }
        if (!exited_) kill(-target, static_cast<int>(m.sig));
        break;
      }
      case proto::FrameType::kResize: {
        proto::ResizeMsg m;
        if (!msg_.tty || !m.decode(f.payload)) break;
        winsize ws{};
        ws.ws_row = static_cast<unsigned short>(m.rows);
        ws.ws_col = static_cast<unsigned short>(m.cols);
        ioctl(master_.fd, TIOCSWINSZ, &ws);
        break;
      }
      default:
        break;
    }
    return true;
  }

  void abandon() {
    killGroup(SIGKILL);
    if (pid_ > 0) Reaper::instance().takeStatus(pid_);
    pid_ = -1;
  }

  void loop(std::optional<proto::Frame>* pending) {
    int64_t sent_out = 0, sent_err = 0;
    for (;;) {
      if (peer_gone_) return abandon();
      feedStdin();
      pollfd fds[5];
      int n = 0;
      fds[n++] = {port_.fd(), POLLIN, 0};
      fds[n++] = {exit_event_.fd, POLLIN, 0};
      Fd& out = msg_.tty ? master_ : out_;
      int out_i = -1, err_i = -1, in_i = -1;
      if (out.fd >= 0 && !exited_) {
        out_i = n;
        fds[n++] = {out.fd, POLLIN, 0};
      }
      if (err_.fd >= 0 && !exited_) {
        err_i = n;
        fds[n++] = {err_.fd, POLLIN, 0};
      }
      if (!msg_.tty && stdin_.fd >= 0 && !stdin_buf_.empty()) {
        in_i = n;
        fds[n++] = {stdin_.fd, POLLOUT, 0};
      }
      int timeout = -1;
      if (deadline_ms_ > 0 && !timed_out_) timeout = static_cast<int>(std::max<int64_t>(0, deadline_ms_ - nowMs()));
      int r = poll(fds, static_cast<nfds_t>(n), timeout);
      if (r < 0 && errno != EINTR) return abandon();
      if (deadline_ms_ > 0 && !timed_out_ && nowMs() >= deadline_ms_) {
        timed_out_ = true;
        killGroup(SIGKILL);
      }
      if (r <= 0) continue;
      if (fds[0].revents) {
        if (!port_.pump()) return abandon();  // the peer went away: nobody wants this command any more
        proto::Frame f;
        for (;;) {
          Port::Read got = port_.nextFrame(&f);
          if (got == Port::Read::kBad) return abandon();
          if (got != Port::Read::kFrame) break;
          if (!onFrame(f, pending)) return abandon();
        }
      }
      if (out_i >= 0 && fds[out_i].revents) drain(out, proto::FrameType::kStdout, sent_out);
      if (err_i >= 0 && fds[err_i].revents) drain(err_, proto::FrameType::kStderr, sent_err);
      (void)in_i;
      if (fds[1].revents & POLLIN) {
        exited_ = true;
        // What the command wrote before it exited is in the pipes: take it (not what its background children
        // write later: they may run for ever).
        while (out.fd >= 0 && drain(out, proto::FrameType::kStdout, sent_out) && hasData(out.fd)) {
        }
        while (err_.fd >= 0 && drain(err_, proto::FrameType::kStderr, sent_err) && hasData(err_.fd)) {
        }
        int status = Reaper::instance().takeStatus(pid_);
        pid_ = -1;
        proto::ExitMsg m;
        if (WIFSIGNALED(status)) {
          m.signal = WTERMSIG(status);
          m.exit_code = 128 + m.signal;
        } else {
          m.exit_code = WEXITSTATUS(status);
        }
        m.timed_out = timed_out_;
        m.truncated = truncated_;
        m.duration_us = (nowMs() - started_ms_) * 1000;
        port_.send(proto::FrameType::kExit, request_, m.encode());
        return;
      }
    }
  }

  static bool hasData(int fd) {
    pollfd p{fd, POLLIN, 0};
    return poll(&p, 1, 0) > 0 && (p.revents & POLLIN);
  }

  Port& port_;
  uint32_t request_;
  proto::ExecMsg msg_;
  Fd master_, stdin_, out_, err_, exit_event_;
  pid_t pid_ = -1;
  std::string stdin_buf_;
  bool stdin_eof_ = false, stdin_closed_ = false;
  bool exited_ = false, timed_out_ = false, truncated_ = false, peer_gone_ = false;
  int64_t started_ms_ = 0, deadline_ms_ = 0;
};

}  // namespace

void handleExec(Port& port, const proto::Frame& frame, std::optional<proto::Frame>* pending) {
  proto::ExecMsg msg;
  if (!msg.decode(frame.payload)) {
    port.sendError(frame.request, EINVAL, "malformed exec request");
    return;
  }
  ExecRun run(port, frame.request, std::move(msg));
  run.run(pending);
}

}  // namespace dsec::guest
