// Exec into a running sandbox from outside: the spawner starts the command (Spawn.h), then stdin/stdout/stderr
// are pumped with poll() until it exits, enforcing the output cap and the timeout.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "CommandControl.h"
#include "ContainerSandbox.h"
#include "SandboxTerminal.h"
#include "Spawn.h"
#include "SpawnProtocol.h"
#include "dsec/common/SigpipeBlock.h"
#include "dsec/common/Strings.h"

namespace dsec::backends {
namespace {

constexpr const char* kDefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
constexpr size_t kReadChunk = size_t{64} * 1024;
// After the command exits, what its background children still write is not waited for; this bounds how
// long already-buffered output is drained.
constexpr double kDrainSeconds = 0.2;
// The steps between the spawner's clone and the exec take microseconds. A command that has not got there by
// then was stopped by a process inside (it can signal the command once it is in the sandbox's user namespace):
// it is killed rather than holding the caller, whatever the exec's own timeout.
constexpr double kStartSeconds = 10;

struct Pipe {
  UniqueFd read_end, write_end;
};

Result<Pipe> makePipe() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) < 0) return Error::sys(errno, "pipe");
  return Pipe{UniqueFd(fds[0]), UniqueFd(fds[1])};
}

void setNonBlocking(int fd) {
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

Status validateRequest(const ExecRequest& r) {
  if (r.argv.empty() || r.argv[0].empty()) return Error::invalid("exec needs a command");
  for (const auto& a : r.argv) {
    if (a.find('\0') != std::string::npos) return Error::invalid("argument contains a NUL byte");
  }
  for (const auto& [k, v] : r.env) {
    if (k.empty() || k.find('=') != std::string::npos || k.find('\0') != std::string::npos ||
        v.find('\0') != std::string::npos) {
      return Error::invalid("bad environment variable name or value: " + k);
    }
  }
  if (r.cwd.empty() || r.cwd[0] != '/' || r.cwd.find('\0') != std::string::npos) {
    return Error::invalid("cwd must be an absolute path");
  }
  if (r.timeout_seconds < 0) return Error::invalid("timeout must not be negative");
  if (r.output_cap < 0) return Error::invalid("output cap must not be negative");
  if (r.stdin_fd >= 0 && fcntl(r.stdin_fd, F_GETFD) < 0) return Error::invalid("stdin fd is not open");
  if (r.tty && !r.stdin_data.empty())
    return Error::invalid("a terminal exec takes its input as a stream, not stdin data");
  if (r.tty && !validTerminalSize(r.tty_rows, r.tty_cols)) {
    return Error::invalid("terminal size must be 1..4096 rows and columns");
  }
  return okStatus();
}

// One captured stream: keeps the first `cap` bytes (or hands them to the sink), drops the rest.
struct Stream {
  UniqueFd fd;
  std::string* buffer = nullptr;
  bool is_stdout = true;
  int64_t kept = 0;
};

}  // namespace

Result<SpawnedCommand> ContainerSandbox::startCommand(const ExecRequest& request, const CommandStdio& stdio) {
  std::map<std::string, std::string> env = spec_.env;
  for (const auto& [k, v] : request.env) env[k] = v;
  env.try_emplace("PATH", kDefaultPath);
  env.try_emplace("HOME", "/root");
  CommandSpawnRequest spawn;
  for (const auto& [k, v] : env) spawn.env.push_back(k + "=" + v);
  spawn.argv = request.argv;
  const std::string& prog = request.argv[0];
  if (prog.find('/') != std::string::npos) {
    spawn.candidates.push_back(prog);
  } else {
    for (const auto& dir : split(env["PATH"], ':')) spawn.candidates.push_back((dir.empty() ? "." : dir) + "/" + prog);
  }
  spawn.cwd = request.cwd;
  // The cgroup's files, opened on the host (inside, they are not visible); kept open until the spawner has them.
  DSEC_ASSIGN_OR_RETURN(JoinFdCache::Fds procs, shared_->join_fds->get(spec_.id, procs_files_));
  for (const auto& fd : *procs) spawn.procs_fds.push_back(fd.get());
  spawn.init_pidfd = init_.pidfd.get();
  spawn.user_namespace = owner_.has_value();
  spawn.namespace_flags = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWCGROUP;
  if (spec_.network != NetworkMode::kHost) spawn.namespace_flags |= CLONE_NEWNET;
  spawn.keep_caps = shared_->keep_caps;
  spawn.sched_policy = sandboxSchedPolicy(spec_, shared_->options.cpu_qos);  // CPU QoS (D2)
  spawn.stdin_fd = stdio.stdin_fd;
  spawn.stdout_fd = stdio.stdout_fd;
  spawn.stderr_fd = stdio.stderr_fd;
  spawn.controlling_tty = request.tty;
  if (!shared_->options.commands) {
    return Error(ErrorCode::kUnsupported, "this backend starts no commands inside its sandboxes");
  }
  return shared_->spawner->spawn(spawn);
}

namespace {

// A step before exec failed: a bad cwd is the caller's mistake, anything else the node's.
Error startError(const ExecRequest& request, const ExecStart& started) {
  Error e = Error::sys(started.exec_errno, spawn_protocol::childStepName(started.step));
  if (started.step == spawn_protocol::kStepChdir) {
    return Error(ErrorCode::kInvalidArgument, "cwd " + request.cwd + ": " + e.message());
  }
  return e.wrap("start command");
}

void killAndReap(SpawnedCommand& cmd) {
  (void)syscall(SYS_pidfd_send_signal, cmd.pidfd.get(), SIGKILL, nullptr, 0);
  siginfo_t info{};
  while (waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(cmd.pidfd.get()), &info, WEXITED) < 0 &&
         errno == EINTR) {
  }
}

}  // namespace

Result<LongRunningProcess> ContainerSandbox::spawn(const ExecRequest& request) {
  DSEC_TRY(validateRequest(request));
  DSEC_ASSIGN_OR_RETURN(Use use, acquire(true));
  DSEC_ASSIGN_OR_RETURN(Pipe in, makePipe());
  DSEC_ASSIGN_OR_RETURN(Pipe out, makePipe());
  DSEC_ASSIGN_OR_RETURN(Pipe err, makePipe());
  DSEC_ASSIGN_OR_RETURN(SpawnedCommand cmd,
                        startCommand(request, {in.read_end.get(), out.write_end.get(), err.write_end.get()}));
  auto started = awaitExec(cmd, monotonicSeconds() + kStartSeconds);
  if (!started.ok() || started->exec_errno != 0) {
    killAndReap(cmd);
    if (!started.ok()) return started.error().wrap("spawn " + request.argv[0] + " in " + spec_.id);
    const int e = started->exec_errno;
    if (started->step != spawn_protocol::kStepExec) return startError(request, *started);
    return Error(e == ENOENT || e == ENOTDIR ? ErrorCode::kNotFound : ErrorCode::kSystem,
                 "spawn " + request.argv[0] + " in " + spec_.id + ": " + std::strerror(e), e);
  }
  keepSpawned(cmd.pidfd.get());
  LongRunningProcess proc;
  proc.pid = cmd.pid;
  proc.pidfd = std::move(cmd.pidfd);
  proc.stdin_fd = std::move(in.write_end);
  proc.stdout_fd = std::move(out.read_end);
  proc.stderr_fd = std::move(err.read_end);
  return proc;
}

namespace {

// What became of a command that did not get to run: an error, or a finished result (its exec failed, or the
// exec's own timeout passed before it started). nullopt: it is running.
std::optional<Result<ExecResult>> unstartedOutcome(const ExecRequest& request, const std::string& sandbox_id,
                                                   SpawnedCommand& cmd, double start, double deadline, ExecSink* sink) {
  const double start_deadline =
      deadline > 0 ? std::min(deadline, monotonicSeconds() + kStartSeconds) : monotonicSeconds() + kStartSeconds;
  auto started = awaitExec(cmd, start_deadline);
  ExecResult result;
  if (!started.ok()) {
    killAndReap(cmd);
    if (started.error().code() != ErrorCode::kTimeout) return started.error();
    if (deadline > 0 && monotonicSeconds() >= deadline) {  // the exec's own timeout came first
      result.timed_out = true;
      result.exit_code = 137;
      result.signal = SIGKILL;
      result.duration_seconds = monotonicSeconds() - start;
      return result;
    }
    return Error(ErrorCode::kConflict, "the command was stopped before it could start (by a process in sandbox " +
                                           sandbox_id + "); it was killed");
  }
  if (started->exec_errno == 0) return std::nullopt;
  if (started->step != spawn_protocol::kStepExec) {
    killAndReap(cmd);
    return startError(request, *started);
  }
  // The exec itself failed: reported the way a shell does (127 not found, 126 not executable).
  const int exec_errno = started->exec_errno;
  killAndReap(cmd);
  result.exit_code = (exec_errno == ENOENT || exec_errno == ENOTDIR) ? 127 : 126;
  std::string msg = "dsec: exec " + request.argv[0] + ": " + std::strerror(exec_errno) + "\n";
  if (sink != nullptr) {
    sink->onStderr(msg.data(), msg.size());
  } else {
    result.stderr_data = msg;
  }
  result.duration_seconds = monotonicSeconds() - start;
  return result;
}

// Moves bytes between a running command and the caller until it exits: stdin_data in, the first output_cap
// bytes of stdout and stderr out (to the sink, or into the result). The command's process group is killed at
// the deadline, or when the sink wants no more.
class CommandPump {
 public:
  CommandPump(const ExecRequest& request, ExecSink* sink, SpawnedCommand& cmd, ExecResult& result, double deadline)
      : request_(request), sink_(sink), cmd_(cmd), result_(result), deadline_(deadline), buf_(kReadChunk) {}

  // stdin_fd: the write end of the command's stdin pipe, or closed when there is nothing to write.
  void attach(UniqueFd stdin_fd, UniqueFd stdout_fd, UniqueFd stderr_fd) {
    stdin_fd_ = std::move(stdin_fd);
    if (stdin_fd_) setNonBlocking(stdin_fd_.get());
    streams_[0].fd = std::move(stdout_fd);
    streams_[0].buffer = &result_.stdout_data;
    streams_[0].is_stdout = true;
    streams_[1].fd = std::move(stderr_fd);
    streams_[1].buffer = &result_.stderr_data;
    streams_[1].is_stdout = false;
    for (auto& s : streams_) setNonBlocking(s.fd.get());
  }

  // A terminal exec: its output is the terminal's master end; input, when the caller streams it, is read from
  // input_fd and typed into the terminal (its EOF types the terminal's end-of-file character).
  void attachTerminal(UniqueFd master_read, UniqueFd master_write, int input_fd) {
    streams_[0].fd = std::move(master_read);
    streams_[0].buffer = &result_.stdout_data;
    streams_[0].is_stdout = true;
    setNonBlocking(streams_[0].fd.get());
    term_in_ = std::move(master_write);
    input_fd_ = input_fd;
    if (input_fd_ >= 0) setNonBlocking(input_fd_);
  }

  // Polls the command's pidfd, its output and its stdin until the pidfd says it exited (it is not reaped).
  Status untilExit();

  // The caller wants no more (its sink refused the start).
  void stop() { killGroup(); }

  // The command is reaped: its pid, and so its group's id, may now name another process; nothing is signalled.
  void reaped() { killed_ = true; }

  // Whatever the command wrote is in the pipes now; background children may hold them open for ever, so this
  // reads only what is already there, for at most kDrainSeconds.
  void drain() {
    const double drain_until = monotonicSeconds() + kDrainSeconds;
    for (auto& s : streams_) {
      while (s.fd && monotonicSeconds() < drain_until) {
        pollfd p{s.fd.get(), POLLIN, 0};
        if (poll(&p, 1, 0) <= 0) break;
        if (!pump(s)) break;
      }
    }
  }

 private:
  void killGroup() {
    if (!killed_) {
      kill(-cmd_.pid, SIGKILL);  // setsid() made the command its group's leader
      (void)syscall(SYS_pidfd_send_signal, cmd_.pidfd.get(), SIGKILL, nullptr, 0);
    }
    killed_ = true;
  }

  // Reads what is available on one stream; false at EOF.
  bool pump(Stream& s) {
    for (int round = 0; round < 16; ++round) {  // bounded, so a flood cannot starve the timeout check
      ssize_t n = read(s.fd.get(), buf_.data(), buf_.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return errno == EAGAIN;
      if (n == 0) return false;
      keep(s, static_cast<size_t>(n));
      if (static_cast<size_t>(n) < buf_.size()) return true;  // likely drained for now
    }
    return true;
  }

  // Keeps what fits under the output cap of the n bytes just read into buf_.
  void keep(Stream& s, size_t n) {
    int64_t room = request_.output_cap - s.kept;
    size_t keep = room <= 0 ? 0 : static_cast<size_t>(std::min<int64_t>(room, static_cast<int64_t>(n)));
    if (keep < n) result_.truncated = true;
    s.kept += static_cast<int64_t>(keep);
    if (keep == 0) return;
    if (sink_ != nullptr) {
      bool more = s.is_stdout ? sink_->onStdout(buf_.data(), keep) : sink_->onStderr(buf_.data(), keep);
      if (!more) killGroup();
    } else {
      s.buffer->append(buf_.data(), keep);
    }
  }

  // Writes the next part of stdin_data; closes stdin when all is written or the command stopped reading.
  void feedStdin(short revents) {
    if (revents & (POLLERR | POLLHUP)) {
      stdin_fd_.reset();
      return;
    }
    const std::string& data = request_.stdin_data;
    ssize_t n = write(stdin_fd_.get(), data.data() + stdin_off_, data.size() - stdin_off_);
    if (n > 0) stdin_off_ += static_cast<size_t>(n);
    if ((n < 0 && errno != EAGAIN && errno != EINTR) || stdin_off_ >= data.size()) stdin_fd_.reset();
  }

  // Terminal input: reads the next piece from the caller, or at its EOF queues the end-of-file character.
  void readInput() {
    char buf[4096];
    ssize_t n = read(input_fd_, buf, sizeof buf);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n > 0) {
      pending_in_.assign(buf, static_cast<size_t>(n));
      return;
    }
    input_fd_ = -1;  // EOF (or a broken pipe): the terminal's end-of-file character, as a typed ^D
    termios t{};
    pending_in_.assign(1, tcgetattr(term_in_.get(), &t) == 0 ? static_cast<char>(t.c_cc[VEOF]) : '\x04');
  }
  void typeInput(short revents) {
    if (revents & (POLLERR | POLLHUP)) {
      pending_in_.clear();
      term_in_.reset();
      input_fd_ = -1;
      return;
    }
    ssize_t n = write(term_in_.get(), pending_in_.data(), pending_in_.size());
    if (n > 0) pending_in_.erase(0, static_cast<size_t>(n));
    if (n < 0 && errno != EAGAIN && errno != EINTR) {
      pending_in_.clear();
      input_fd_ = -1;
    }
  }

  // Until the deadline (none once the command is killed: then its exit is what is waited for).
  int pollTimeoutMs() const {
    if (deadline_ <= 0 || killed_) return -1;
    double left = deadline_ - monotonicSeconds();
    return left <= 0 ? 0 : static_cast<int>(left * 1000) + 1;
  }

  const ExecRequest& request_;
  ExecSink* sink_;
  SpawnedCommand& cmd_;
  ExecResult& result_;
  const double deadline_;  // 0: none
  std::vector<char> buf_;
  Stream streams_[2];  // stdout, stderr
  UniqueFd stdin_fd_;
  size_t stdin_off_ = 0;
  UniqueFd term_in_;        // terminal execs: the master end input is typed into
  int input_fd_ = -1;       // terminal execs: the caller's input stream (theirs), -1 once at EOF
  std::string pending_in_;  // read from input_fd_, not yet taken by the terminal
  bool killed_ = false;
};

Status CommandPump::untilExit() {
  bool exited = false;
  while (!exited) {
    pollfd fds[5];
    int nfds = 0;
    fds[nfds++] = {cmd_.pidfd.get(), POLLIN, 0};
    int stream_index[2] = {-1, -1};
    for (int i = 0; i < 2; ++i) {
      if (streams_[i].fd) {
        stream_index[i] = nfds;
        fds[nfds++] = {streams_[i].fd.get(), POLLIN, 0};
      }
    }
    int stdin_index = -1;
    if (stdin_fd_) {
      stdin_index = nfds;
      fds[nfds++] = {stdin_fd_.get(), POLLOUT, 0};
    }
    int input_index = -1;
    if (term_in_ && !pending_in_.empty()) {
      input_index = nfds;
      fds[nfds++] = {term_in_.get(), POLLOUT, 0};
    } else if (term_in_ && input_fd_ >= 0) {
      input_index = nfds;
      fds[nfds++] = {input_fd_, POLLIN, 0};
    }
    int rc = poll(fds, static_cast<nfds_t>(nfds), pollTimeoutMs());
    if (rc < 0 && errno != EINTR) {
      killGroup();
      return Error::sys(errno, "poll exec");
    }
    if (deadline_ > 0 && !killed_ && monotonicSeconds() >= deadline_) {
      result_.timed_out = true;
      killGroup();
    }
    if (rc <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (stream_index[i] >= 0 && fds[stream_index[i]].revents != 0 && !pump(streams_[i])) streams_[i].fd.reset();
    }
    if (stdin_index >= 0 && fds[stdin_index].revents != 0) feedStdin(fds[stdin_index].revents);
    if (input_index >= 0 && fds[input_index].revents != 0) {
      if (fds[input_index].fd == input_fd_) {
        readInput();
      } else {
        typeInput(fds[input_index].revents);
      }
    }
    if (fds[0].revents & POLLIN) exited = true;
  }
  return okStatus();
}

// Reaps the exited command into the result's exit code and signal (a timed-out command exits 137).
void reapInto(SpawnedCommand& cmd, ExecResult& result) {
  siginfo_t info{};
  while (waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(cmd.pidfd.get()), &info, WEXITED) < 0 &&
         errno == EINTR) {
  }
  if (info.si_code == CLD_EXITED) {
    result.exit_code = info.si_status;
  } else {
    result.signal = info.si_status;
    result.exit_code = 128 + info.si_status;
  }
  if (result.timed_out) result.exit_code = 137;
}

}  // namespace

Result<ExecResult> ContainerSandbox::run(const ExecRequest& request, ExecSink* sink) {
  DSEC_TRY(validateRequest(request));
  DSEC_ASSIGN_OR_RETURN(Use use, acquire(true));
  const double start = monotonicSeconds();

  // With a caller's stdin fd (a streamed upload) the command reads it directly: the spawner dups it into the
  // command, the caller's copy stays open and theirs to close, and stdin_data is ignored. A terminal exec's
  // stdin, stdout and stderr are all the terminal; the caller's stdin fd is typed into it by the pump.
  const bool caller_stdin = request.stdin_fd >= 0;
  Pipe in, out, err;
  TerminalPair terminal;
  if (request.tty) {
    DSEC_ASSIGN_OR_RETURN(UniqueFd root, openRoot());
    DSEC_ASSIGN_OR_RETURN(terminal, openSandboxTerminal(root.get(), request.tty_rows, request.tty_cols));
  } else {
    if (!caller_stdin) {
      DSEC_ASSIGN_OR_RETURN(in, makePipe());
    }
    DSEC_ASSIGN_OR_RETURN(out, makePipe());
    DSEC_ASSIGN_OR_RETURN(err, makePipe());
  }
  CommandStdio stdio;
  if (request.tty) {
    stdio = {terminal.slave.get(), terminal.slave.get(), terminal.slave.get()};
  } else {
    stdio = {caller_stdin ? request.stdin_fd : in.read_end.get(), out.write_end.get(), err.write_end.get()};
  }
  DSEC_ASSIGN_OR_RETURN(SpawnedCommand cmd, startCommand(request, stdio));
  in.read_end.reset();
  out.write_end.reset();
  err.write_end.reset();
  terminal.slave.reset();  // the command holds it now: the master reads EIO once every holder inside closed it

  const double deadline = request.timeout_seconds > 0 ? start + request.timeout_seconds : 0;
  if (auto unstarted = unstartedOutcome(request, spec_.id, cmd, start, deadline, sink)) return std::move(*unstarted);

  SigpipeBlock no_sigpipe;
  UniqueFd stdin_fd = std::move(in.write_end);
  if (caller_stdin || request.stdin_data.empty()) stdin_fd.reset();
  ExecResult result;
  CommandPump pump(request, sink, cmd, result, deadline);
  UniqueFd control_master;
  if (request.tty) {
    UniqueFd master_write(fcntl(terminal.master.get(), F_DUPFD_CLOEXEC, 3));
    control_master = UniqueFd(fcntl(terminal.master.get(), F_DUPFD_CLOEXEC, 3));
    if (!master_write || !control_master) {
      killAndReap(cmd);
      return Error::sys(errno, "dup the terminal's master end");
    }
    pump.attachTerminal(std::move(terminal.master), std::move(master_write), request.stdin_fd);
  } else {
    pump.attach(std::move(stdin_fd), std::move(out.read_end), std::move(err.read_end));
  }
  auto control = std::make_shared<CommandControl>(cmd.pid, UniqueFd(fcntl(cmd.pidfd.get(), F_DUPFD_CLOEXEC, 3)),
                                                  std::move(control_master));
  if (request.tty) trackTerminal(control);
  if (sink != nullptr && !sink->onStarted(control)) pump.stop();
  auto pumped = pump.untilExit();
  control->ended();  // before the reap: nothing signals a pid that may be reused
  if (!pumped.ok()) {
    killAndReap(cmd);
    return pumped.error();
  }
  reapInto(cmd, result);
  pump.reaped();
  pump.drain();
  // An OOM kill always shows as a failure; successful execs skip reading the cgroup's counters.
  if (result.exit_code != 0) noteOomKill(result);
  result.duration_seconds = monotonicSeconds() - start;
  return result;
}

void ContainerSandbox::trackTerminal(const std::shared_ptr<CommandControl>& control) {
  std::lock_guard lock(mu_);
  std::erase_if(terminals_, [](const std::weak_ptr<CommandControl>& t) { return t.expired(); });
  terminals_.push_back(control);
}

void ContainerSandbox::hangUpTerminalsLocked() {
  for (auto& weak : terminals_) {
    if (auto t = weak.lock()) t->hangUp(2);
  }
  terminals_.clear();
}

void ContainerSandbox::noteOomKill(ExecResult& result) {
  auto st = cgroup_->stats();
  if (!st.ok()) return;
  int64_t seen = oom_seen_.load();
  while (st->oom_kills > seen && !oom_seen_.compare_exchange_weak(seen, st->oom_kills)) {
  }
  result.oom_killed = st->oom_kills > seen;
}

}  // namespace dsec::backends
