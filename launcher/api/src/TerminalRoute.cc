// GET /v1/sandboxes/{id}/terminal: a command on a terminal of the sandbox's own, over WebSocket (docs/api.md,
// "Terminals"). Binary messages carry the terminal's bytes both ways; text messages are JSON control messages:
// from the client resize, signal and eof; from the node started, then exit (or error) before the close.
//
// Two threads serve a session: this connection's thread runs the exec (the backend's pump moves the terminal's
// output into binary messages), and a reader thread takes the client's messages (input goes into a pipe the
// pump types into the terminal, controls to the exec's ExecControl). Sends are serialised by one mutex.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "dsec/common/SigpipeBlock.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/api/ApiServer.h"
#include "dsec/launcher/api/Requests.h"
#include "dsec/launcher/api/StdinFeeds.h"
#include "dsec/launcher/api/WebSocket.h"

namespace dsec::launcher {
namespace {

using nlohmann::json;
// The largest message a client may send (typed input or a control message); input beyond the pipe waits.
constexpr uint64_t kMaxInputMessage = uint64_t{64} * 1024;
// A client that takes none of the terminal's output for this long is gone.
constexpr int kSendStallMs = 60 * 1000;
// The default program: the sandbox's bash if it has one, else its sh, as a login shell.
const std::vector<std::string> kDefaultShell = {
    "/bin/sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi"};

int signalNumber(const json& value) {
  if (value.is_number_integer()) return value.get<int>();
  if (!value.is_string()) return -1;
  std::string name = value.get<std::string>();
  if (name.rfind("SIG", 0) == 0) name = name.substr(3);
  static const std::pair<const char*, int> kNames[] = {
      {"HUP", SIGHUP},   {"INT", SIGINT},   {"QUIT", SIGQUIT}, {"KILL", SIGKILL}, {"TERM", SIGTERM},
      {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"TSTP", SIGTSTP}, {"CONT", SIGCONT}, {"WINCH", SIGWINCH}};
  for (const auto& [n, sig] : kNames) {
    if (name == n) return sig;
  }
  return -1;
}

class TerminalSession : public backends::ExecSink {
 public:
  TerminalSession(int fd, int stop_fd, UniqueFd input_write)
      : fd_(fd), stop_fd_(stop_fd), input_(std::move(input_write)) {
    ended_ = UniqueFd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  }

  bool onStarted(const std::shared_ptr<backends::ExecControl>& control) override {
    {
      std::lock_guard lock(control_mu_);
      // The client left (or the server stops) before the command started: it is stopped now, not left running
      // with nobody on the other end.
      if (hung_up_) return false;
      control_ = control;
    }
    return sendText(json{{"type", "started"}});
  }
  bool onStdout(const char* data, size_t size) override { return send(ws::Opcode::kBinary, {data, size}); }
  bool onStderr(const char* data, size_t size) override { return send(ws::Opcode::kBinary, {data, size}); }

  bool sendText(const json& j) { return send(ws::Opcode::kText, j.dump()); }
  void close(uint16_t code, const std::string& reason) {
    send(ws::Opcode::kClose, ws::closePayload(code, reason));
    closed_sent_ = true;
  }

  // Takes the client's messages until the exec ends, the client closes, or the server stops.
  void readLoop(std::string early) {
    ws::Decoder decoder(true, kMaxInputMessage);
    decoder.feed(early.data(), early.size());
    std::vector<char> buf(size_t{64} * 1024);
    for (;;) {
      while (auto msg = decoder.next()) {
        if (!handle(*msg)) return;
      }
      if (decoder.violation()) {
        hangUp();
        close(decoder.violation()->close_code, decoder.violation()->reason);
        return;
      }
      pollfd fds[3] = {{fd_, POLLIN, 0}, {ended_.get(), POLLIN, 0}, {stop_fd_, POLLIN, 0}};
      if (poll(fds, 3, -1) < 0) {
        if (errno == EINTR) continue;
        hangUp();
        return;
      }
      if (fds[1].revents != 0) return;
      if (fds[2].revents != 0) {
        hangUp();
        return;
      }
      ssize_t n = read(fd_, buf.data(), buf.size());
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n <= 0) {  // the client is gone: so is its session
        hangUp();
        return;
      }
      decoder.feed(buf.data(), static_cast<size_t>(n));
    }
  }

  // The exec is over: the reader stops waiting.
  void ended() {
    uint64_t one = 1;
    (void)!write(ended_.get(), &one, sizeof one);
    std::lock_guard lock(control_mu_);
    control_.reset();
  }
  bool closeSent() const { return closed_sent_; }
  bool peerClosed() const { return peer_closed_.load(); }

 private:
  bool handle(const ws::Message& msg) {
    switch (msg.op) {
      case ws::Opcode::kBinary:
        return typeInput(msg.payload);
      case ws::Opcode::kText:
        return control(msg.payload);
      case ws::Opcode::kPing:
        send(ws::Opcode::kPong, msg.payload);
        return true;
      case ws::Opcode::kPong:
        return true;
      case ws::Opcode::kClose:
      default:
        peer_closed_ = true;
        hangUp();
        return false;
    }
  }

  bool typeInput(const std::string& data) {
    if (!input_) return true;  // after eof: dropped, as a closed terminal input would
    SigpipeBlock no_sigpipe;
    size_t off = 0;
    while (off < data.size()) {
      pollfd fds[3] = {{input_.get(), POLLOUT, 0}, {ended_.get(), POLLIN, 0}, {stop_fd_, POLLIN, 0}};
      if (poll(fds, 3, -1) < 0 && errno != EINTR) return false;
      if (fds[1].revents != 0 || fds[2].revents != 0) return false;
      if (fds[0].revents & (POLLERR | POLLHUP)) return true;
      ssize_t n = write(input_.get(), data.data() + off, data.size() - off);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n < 0) return true;
      off += static_cast<size_t>(n);
    }
    return true;
  }

  bool control(const std::string& text) {
    json j = json::parse(text, nullptr, false);
    if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
      return reply(
          {{"type", "error"}, {"code", "invalid"}, {"message", "control messages are JSON objects with a type"}});
    }
    const std::string type = j["type"].get<std::string>();
    std::shared_ptr<backends::ExecControl> c;
    {
      std::lock_guard lock(control_mu_);
      c = control_;
    }
    if (type == "eof") {
      input_.reset();  // the pump types the terminal's end-of-file character
      return true;
    }
    if (c == nullptr)
      return reply({{"type", "error"}, {"code", "conflict"}, {"message", "the command is not running"}});
    Status st = okStatus();
    if (type == "resize") {
      if (!j.contains("rows") || !j.contains("cols") || !j["rows"].is_number_integer() ||
          !j["cols"].is_number_integer()) {
        return reply({{"type", "error"}, {"code", "invalid"}, {"message", "resize needs integer rows and cols"}});
      }
      st = c->resize(j["rows"].get<int>(), j["cols"].get<int>());
    } else if (type == "signal") {
      int sig = j.contains("signal") ? signalNumber(j["signal"]) : -1;
      if (sig <= 0) {
        return reply({{"type", "error"}, {"code", "invalid"}, {"message", "signal: a name (INT, TERM...) or number"}});
      }
      st = c->signal(sig);
    } else {
      return reply(
          {{"type", "error"}, {"code", "invalid"}, {"message", "unknown control message type '" + type + "'"}});
    }
    if (!st.ok()) {
      auto [status, code] = httpStatusFor(st.error().code());
      (void)status;
      return reply({{"type", "error"}, {"code", code}, {"message", st.error().message()}});
    }
    return true;
  }

  bool reply(const json& j) {
    sendText(j);
    return true;
  }

  // The client left (or broke the protocol, or the server stops): the session's command goes with it.
  void hangUp() {
    std::shared_ptr<backends::ExecControl> c;
    {
      std::lock_guard lock(control_mu_);
      hung_up_ = true;
      c = control_;
    }
    if (c != nullptr) (void)c->signal(SIGKILL);
    input_.reset();
  }

  bool send(ws::Opcode op, std::string_view payload) {
    std::lock_guard lock(send_mu_);
    if (broken_ || closed_sent_) return false;
    frame_.clear();
    ws::encodeFrame(op, payload, &frame_);
    SigpipeBlock no_sigpipe;
    size_t off = 0;
    while (off < frame_.size()) {
      pollfd fds[2] = {{fd_, POLLOUT, 0}, {stop_fd_, POLLIN, 0}};
      int rc = poll(fds, 2, kSendStallMs);
      if (rc < 0 && errno == EINTR) continue;
      if (rc <= 0 || fds[1].revents != 0 || (fds[0].revents & (POLLERR | POLLHUP))) {
        broken_ = true;
        return false;
      }
      ssize_t n = ::send(fd_, frame_.data() + off, frame_.size() - off, MSG_NOSIGNAL);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n < 0) {
        broken_ = true;
        return false;
      }
      off += static_cast<size_t>(n);
    }
    return true;
  }

  const int fd_;
  const int stop_fd_;
  UniqueFd input_;  // reader thread only
  UniqueFd ended_;
  std::mutex control_mu_;
  std::shared_ptr<backends::ExecControl> control_;
  bool hung_up_ = false;  // under control_mu_: the session is over, a command starting now is stopped
  std::mutex send_mu_;
  std::string frame_;
  bool broken_ = false;
  std::atomic<bool> closed_sent_{false};
  std::atomic<bool> peer_closed_{false};
};

Result<backends::ExecRequest> terminalRequest(const QueryParams& q) {
  backends::ExecRequest req;
  req.argv = q.all("cmd");
  if (req.argv.empty()) req.argv = kDefaultShell;
  for (const auto& a : req.argv) {
    if (a.find('\0') != std::string::npos) return Error::invalid("cmd: contains a NUL byte");
  }
  if (req.argv[0].empty()) return Error::invalid("cmd: empty program name");
  req.tty = true;
  auto intParam = [&](const char* name, int fallback) -> Result<int> {
    if (!q.has(name)) return fallback;
    const std::string text = q.get(name);
    char* end = nullptr;
    long v = std::strtol(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || v < 1 || v > 4096)
      return Error::invalid(std::string(name) + ": expected 1..4096");
    return static_cast<int>(v);
  };
  DSEC_ASSIGN_OR_RETURN(req.tty_rows, intParam("rows", 24));
  DSEC_ASSIGN_OR_RETURN(req.tty_cols, intParam("cols", 80));
  if (q.has("timeout")) {
    char* end = nullptr;
    const std::string text = q.get("timeout");
    double d = std::strtod(text.c_str(), &end);
    if (end == text.c_str() || *end != '\0' || !(d >= 0) || d > 7 * 86400) {
      return Error::invalid("timeout: expected seconds, 0..604800");
    }
    req.timeout_seconds = d;
  }
  if (q.has("cwd")) {
    req.cwd = q.get("cwd");
    DSEC_TRY(validateSandboxPath(req.cwd, "cwd"));
  }
  req.env["TERM"] = q.has("term") ? q.get("term") : "xterm-256color";
  req.output_cap = kDefaultOutputCap;
  return req;
}

}  // namespace

void ApiServer::terminal(HttpExchange& ex, const RouteMatch& m) {
  auto key = ws::checkUpgradeRequest(ex.head());
  if (!key.ok()) return ex.sendError(426, "upgrade_required", key.error().message(), {{"Upgrade", "websocket"}});
  auto req = terminalRequest(m.query);
  if (!req.ok()) return sendError(ex, req.error());
  auto lease = agent_->use(m.sandbox_id);
  if (!lease.ok()) return sendError(ex, lease.error());
  int fds[2];
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) < 0) return sendError(ex, Error::sys(errno, "terminal input pipe"));
  UniqueFd input_read(fds[0]), input_write(fds[1]);
  req->stdin_fd = input_read.get();
  std::string early;
  if (!ex.switchProtocols(
          {{"Upgrade", "websocket"}, {"Connection", "Upgrade"}, {"Sec-WebSocket-Accept", ws::acceptKey(*key)}},
          &early)) {
    return;
  }
  agent_->metrics().execs_total++;
  TerminalSession session(ex.socketFd(), ex.stopFd(), std::move(input_write));
  std::thread reader([&session, early = std::move(early)]() mutable { session.readLoop(std::move(early)); });
  auto result = lease->sandbox().execStream(*req, session);
  session.ended();
  if (!result.ok()) {
    auto [status, code] = httpStatusFor(result.error().code());
    (void)status;
    session.sendText({{"type", "error"}, {"code", code}, {"message", result.error().message()}});
    session.close(ws::kCloseInternal, "the terminal could not run");
  } else {
    json exit = execResultToJson(*result);
    exit.erase("stdout");
    exit.erase("stderr");
    exit["type"] = "exit";
    session.sendText(exit);
    session.close(ws::kCloseNormal, "exited");
  }
  reader.join();
}

}  // namespace dsec::launcher
