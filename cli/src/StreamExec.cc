#include "StreamExec.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <iostream>
#include <memory>
#include <thread>

#include "dsec/common/Fd.h"
#include "dsec/common/FdIo.h"
#include "dsec/common/Strings.h"

namespace dsec::cli {

void printAll(int fd, const std::string& data) { (void)writeAll(fd, data, "output"); }

namespace {

constexpr size_t kStdinPiece = size_t{256} * 1024;

// Copies our stdin to a running exec until EOF (then sends it), the exec's end (409/404), or stop() (the exec
// stream is over): waits on stdin and an eventfd together, so it is always joinable.
class StdinForwarder {
 public:
  StdinForwarder(const ApiClient& client, std::string target, double connect_s, double request_s)
      : client_(client.address()), target_(std::move(target)), stop_(eventfd(0, EFD_CLOEXEC)) {
    client_.setTimeouts(connect_s, request_s);
    thread_ = std::thread([this] { run(); });
  }
  ~StdinForwarder() {
    uint64_t one = 1;
    (void)!write(stop_.get(), &one, sizeof one);
    thread_.join();
  }

 private:
  void run() {
    std::string buf(kStdinPiece, '\0');
    for (;;) {
      pollfd fds[2] = {{STDIN_FILENO, POLLIN, 0}, {stop_.get(), POLLIN, 0}};
      if (poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[1].revents != 0) return;
      ssize_t n = read(STDIN_FILENO, buf.data(), buf.size());
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      const bool eof = n <= 0;
      auto sent = client_.postBytes(target_ + (eof ? "?eof=true" : ""), eof ? "" : buf.substr(0, n));
      if (eof || !sent.ok()) return;  // the command exited (or stopped reading): nothing more to send
    }
  }

  ApiClient client_;
  std::string target_;
  UniqueFd stop_;
  std::thread thread_;
};

}  // namespace

Result<nlohmann::json> streamExec(ApiClient& client, const std::string& id, const nlohmann::json& body,
                                  bool forward_stdin) {
  nlohmann::json request = body;
  if (forward_stdin) request["stdin_stream"] = true;
  std::unique_ptr<StdinForwarder> forwarder;
  const double exec_timeout = body.value("timeout", 0.0);
  auto result =
      client.stream("/v1/sandboxes/" + percentEncode(id) + "/exec/stream", request, [&](const nlohmann::json& line) {
        if (!line.is_object()) return;
        if (forward_stdin && !forwarder && line.value("started", false) && line.contains("exec_id") &&
            line["exec_id"].is_string()) {
          forwarder = std::make_unique<StdinForwarder>(
              client, "/v1/sandboxes/" + percentEncode(id) + "/exec/" + line["exec_id"].get<std::string>() + "/stdin",
              10, exec_timeout > 0 ? exec_timeout + 30 : 0);
        }
        if (line.contains("stdout") && line["stdout"].is_string() && !line.contains("done")) {
          printAll(STDOUT_FILENO, line["stdout"].get<std::string>());
        }
        if (line.contains("stderr") && line["stderr"].is_string() && !line.contains("done")) {
          printAll(STDERR_FILENO, line["stderr"].get<std::string>());
        }
      });
  forwarder.reset();
  return result;
}

int exitCodeOf(const nlohmann::json& result, const std::string& command_name) {
  int code = result.value("exit_code", 1);
  if (result.value("timed_out", false)) {
    std::cerr << "dsec " << command_name << ": the command timed out and was killed\n";
  } else if (result.value("oom_killed", false)) {
    std::cerr << "dsec " << command_name << ": the command was killed: the sandbox ran out of memory\n";
  }
  if (code < 0 || code > 255) code = 1;
  return code;
}

}  // namespace dsec::cli
