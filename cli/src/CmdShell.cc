// dsec shell ID [--rows --cols --timeout] [-- CMD...]: an interactive terminal in a sandbox (GET
// /v1/sandboxes/{id}/terminal over WebSocket; docs/api.md, "Terminals"). Our terminal goes into raw mode for the
// session and is restored however it ends; SIGWINCH sends the new size. Exits with the command's exit code.
// Our own terminal never reaches the sandbox: only its bytes do, relayed, into a terminal of the sandbox's own.
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <iostream>

#include "ClientCommon.h"
#include "Commands.h"
#include "dsec/common/Endpoint.h"
#include "dsec/common/Fd.h"
#include "dsec/common/FdIo.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/api/HttpClient.h"
#include "dsec/launcher/api/WebSocket.h"

namespace dsec::cli {
namespace {

namespace ws = launcher::ws;
using nlohmann::json;

// Raw mode on a terminal for as long as it lives; the saved settings come back on every way out.
class RawTerminal {
 public:
  explicit RawTerminal(int fd) : fd_(fd) {
    if (isatty(fd) == 0 || tcgetattr(fd, &saved_) < 0) return;
    termios raw = saved_;
    cfmakeraw(&raw);
    if (tcsetattr(fd, TCSANOW, &raw) == 0) active_ = true;  // type-ahead is kept for the session
  }
  ~RawTerminal() {
    if (active_) tcsetattr(fd_, TCSADRAIN, &saved_);
  }
  RawTerminal(const RawTerminal&) = delete;
  RawTerminal& operator=(const RawTerminal&) = delete;

 private:
  int fd_;
  termios saved_{};
  bool active_ = false;
};

bool sendAll(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EINTR) return false;
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, 60000) <= 0) return false;
  }
  return true;
}

bool sendFrame(int fd, ws::Opcode op, std::string_view payload) {
  std::string frame;
  ws::encodeClientFrame(op, payload, &frame);
  return sendAll(fd, frame);
}

std::string percent(const std::string& s) { return percentEncode(s); }

// The handshake; on a 101 returns the bytes that came after its head, else the node's error.
Result<std::string> handshake(int fd, const FleetAddress& address, const std::string& target, int timeout_ms) {
  DSEC_ASSIGN_OR_RETURN(auto ep, parseEndpoint(address.endpoint, 80));
  const std::string key = ws::newClientKey();
  std::string head = "GET " + target + " HTTP/1.1\r\nHost: " + ep.hostPort() + "\r\nAuthorization: Bearer " +
                     address.token +
                     "\r\nUser-Agent: dsec-cli\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: " +
                     key + "\r\n\r\n";
  if (!sendAll(fd, head)) return Error(ErrorCode::kUnavailable, "sending the terminal request failed");
  std::string answer;
  size_t end;
  while ((end = answer.find("\r\n\r\n")) == std::string::npos) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) return Error(ErrorCode::kTimeout, "no answer to the terminal request");
    char buf[4096];
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) return Error(ErrorCode::kUnavailable, "the connection closed during the terminal request");
    answer.append(buf, static_cast<size_t>(n));
    if (answer.size() > 65536) return Error(ErrorCode::kUnavailable, "the terminal answer's head is too long");
  }
  std::string rest = answer.substr(end + 4);
  const int status = answer.size() > 12 ? std::atoi(answer.c_str() + 9) : 0;
  if (status == 101) {
    if (answer.find(ws::acceptKey(key)) == std::string::npos) {
      return Error(ErrorCode::kUnavailable, "the terminal answer does not match our WebSocket key");
    }
    return rest;
  }
  // An HTTP error: its JSON body follows the head (closed after it).
  for (int i = 0; i < 50 && rest.find('}') == std::string::npos; ++i) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) break;
    char buf[4096];
    ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) break;
    rest.append(buf, static_cast<size_t>(n));
  }
  return errorFromResponse(status, rest);
}

std::pair<int, int> windowSize(int fd, int rows, int cols) {
  winsize ws{};
  if (rows == 0 && cols == 0 && ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0 && ws.ws_col > 0) {
    return {ws.ws_row, ws.ws_col};
  }
  return {rows > 0 ? rows : 24, cols > 0 ? cols : 80};
}

}  // namespace

int cmdShell(const Invocation& inv) {
  auto [before, command] = splitAtDoubleDash(inv.args);
  CommonOptions common;
  po::options_description desc("options");
  addCommonOptions(desc, &common, true);
  desc.add_options()("id", po::value<std::string>()->required(), "sandbox id")(
      "rows", po::value<int>()->default_value(0), "terminal rows (default: ours, else 24)")(
      "cols", po::value<int>()->default_value(0), "terminal columns (default: ours, else 80)")(
      "timeout", po::value<double>()->default_value(0), "end the session after this many seconds (0 = never)")(
      "cmd", po::value<std::vector<std::string>>(), "command (default: the sandbox's login shell; prefer after --)");
  po::positional_options_description positional;
  positional.add("id", 1).add("cmd", -1);
  po::variables_map vm;
  if (!parseCommandLine(inv, before, desc, positional, "ID [options] [-- CMD...]", &vm, &common)) return kExitOk;
  if (vm.count("cmd") != 0) {
    auto extra = vm["cmd"].as<std::vector<std::string>>();
    command.insert(command.begin(), extra.begin(), extra.end());
  }
  const int rows_opt = vm["rows"].as<int>(), cols_opt = vm["cols"].as<int>();
  if (rows_opt < 0 || rows_opt > 4096 || cols_opt < 0 || cols_opt > 4096) {
    throw UsageError("--rows and --cols must be 1..4096");
  }
  const double timeout = vm["timeout"].as<double>();
  if (!(timeout >= 0)) throw UsageError("--timeout must be >= 0 seconds");

  auto client = connectFleet(common);
  if (!client.ok()) return reportError(inv, client.error());
  const FleetAddress& address = (*client)->address();
  auto [rows, cols] = windowSize(STDIN_FILENO, rows_opt, cols_opt);
  std::string target = sandboxPath(vm["id"].as<std::string>()) + "/terminal?rows=" + std::to_string(rows) +
                       "&cols=" + std::to_string(cols);
  for (const auto& arg : command) target += "&cmd=" + percent(arg);
  if (timeout > 0) target += "&timeout=" + std::to_string(timeout);
  if (const char* term = getenv("TERM"); term != nullptr && *term != '\0') target += "&term=" + percent(term);

  launcher::client::CallOptions options;
  options.connect_timeout_ms = static_cast<int>(common.connect_timeout * 1000);
  auto fd = launcher::client::connectTo(address.endpoint, options);
  if (!fd.ok()) return reportError(inv, fd.error());
  const int request_ms = common.request_timeout > 0 ? static_cast<int>(common.request_timeout * 1000) : -1;
  auto early = handshake(fd->get(), address, target, request_ms);
  if (!early.ok()) return reportError(inv, early.error());

  // SIGWINCH (a new size) and the signals that end us come through a signalfd, so the terminal is restored.
  sigset_t mask;
  sigemptyset(&mask);
  for (int sig : {SIGWINCH, SIGTERM, SIGHUP, SIGINT, SIGQUIT}) sigaddset(&mask, sig);
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  UniqueFd sigfd(signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));

  int exit_code = 1;
  bool got_exit = false;
  std::string error_text;
  {
    RawTerminal raw(STDIN_FILENO);
    ws::Decoder decoder(false, size_t{16} << 20);
    decoder.feed(early->data(), early->size());
    bool stdin_open = true, done = false;
    std::vector<char> buf(size_t{64} * 1024);
    while (!done) {
      while (auto msg = decoder.next()) {
        if (msg->op == ws::Opcode::kBinary) {
          (void)writeAll(STDOUT_FILENO, msg->payload, "terminal output");
        } else if (msg->op == ws::Opcode::kText) {
          json j = json::parse(msg->payload, nullptr, false);
          const std::string type = j.is_object() ? j.value("type", "") : "";
          if (type == "exit") {
            got_exit = true;
            exit_code = j.value("exit_code", 1);
            if (j.value("timed_out", false)) error_text = "the session timed out and was ended";
          } else if (type == "error") {
            error_text = j.value("message", "terminal error");
          }
        } else if (msg->op == ws::Opcode::kPing) {
          sendFrame(fd->get(), ws::Opcode::kPong, msg->payload);
        } else if (msg->op == ws::Opcode::kClose) {
          sendFrame(fd->get(), ws::Opcode::kClose, msg->payload.substr(0, 2));
          done = true;
          break;
        }
      }
      if (done || decoder.violation()) break;
      pollfd fds[3] = {{fd->get(), POLLIN, 0}, {sigfd.get(), POLLIN, 0}, {stdin_open ? STDIN_FILENO : -1, POLLIN, 0}};
      if (poll(fds, 3, -1) < 0) {
        if (errno == EINTR) continue;
        break;
      }
      if (fds[1].revents != 0) {
        signalfd_siginfo si{};
        while (read(sigfd.get(), &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
          if (si.ssi_signo == SIGWINCH) {
            auto [r, c] = windowSize(STDIN_FILENO, 0, 0);
            sendFrame(fd->get(), ws::Opcode::kText, json{{"type", "resize"}, {"rows", r}, {"cols", c}}.dump());
          } else if (si.ssi_signo == SIGINT || si.ssi_signo == SIGQUIT) {
            // Not in raw mode (stdin is no terminal): the keys' signals go to the session's foreground job.
            sendFrame(fd->get(), ws::Opcode::kText,
                      json{{"type", "signal"}, {"signal", si.ssi_signo == SIGINT ? "INT" : "QUIT"}}.dump());
          } else {
            sendFrame(fd->get(), ws::Opcode::kClose, ws::closePayload(ws::kCloseGoingAway, "client ended"));
            error_text = "ended by a signal";
            done = true;
          }
        }
      }
      if (!done && fds[2].revents != 0) {
        ssize_t n = read(STDIN_FILENO, buf.data(), buf.size());
        if (n > 0) {
          if (!sendFrame(fd->get(), ws::Opcode::kBinary, std::string_view(buf.data(), static_cast<size_t>(n)))) break;
        } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
          stdin_open = false;  // our input ended: so does the terminal's
          sendFrame(fd->get(), ws::Opcode::kText, json{{"type", "eof"}}.dump());
        }
      }
      if (!done && fds[0].revents != 0) {
        ssize_t n = read(fd->get(), buf.data(), buf.size());
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (n <= 0) break;
        decoder.feed(buf.data(), static_cast<size_t>(n));
      }
    }
  }
  sigprocmask(SIG_UNBLOCK, &mask, nullptr);
  if (!error_text.empty()) std::cerr << "dsec " << inv.name << ": " << error_text << "\n";
  if (!got_exit) {
    if (error_text.empty()) std::cerr << "dsec " << inv.name << ": the session ended without an exit status\n";
    return 1;
  }
  return exit_code < 0 || exit_code > 255 ? 1 : exit_code;
}

}  // namespace dsec::cli
