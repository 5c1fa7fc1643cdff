// The attacker process and the source-bound raw client of the HTTP edge security tests (Attacker.h).
#include "Attacker.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "dsec/common/Strings.h"

namespace dsec::testing {

Result<std::unique_ptr<AttackerProcess>> AttackerProcess::start(const std::vector<std::string>& args) {
  if (::geteuid() != 0) return Error(ErrorCode::kUnsupported, "running the attacker as another user needs root");
  const std::string tool = DSEC_HTTP_ATTACKER_PATH;
  if (::access(tool.c_str(), X_OK) != 0) return Error::sys(errno, "attacker tool " + tool);
  std::vector<std::string> argv_text = {tool};
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_text) argv.push_back(a.data());
  argv.push_back(nullptr);
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) return Error::sys(errno, "pipe");
  UniqueFd read_end(pipefd[0]), write_end(pipefd[1]);
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) return Error::sys(errno, "fork");
  if (pid == 0) {
    // Only async-signal-safe calls from here to exec: become the other user, then run the tool.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(126);
    ::dup2(pipefd[1], STDOUT_FILENO);
    if (::setgroups(0, nullptr) != 0 || ::setresgid(kAttackerUid, kAttackerUid, kAttackerUid) != 0 ||
        ::setresuid(kAttackerUid, kAttackerUid, kAttackerUid) != 0) {
      ::_exit(125);
    }
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  write_end.reset();
  return std::unique_ptr<AttackerProcess>(new AttackerProcess(pid, std::move(read_end)));
}

AttackerProcess::~AttackerProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
}

Result<nlohmann::json> AttackerProcess::finish() {
  std::string text;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(out_.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Error(ErrorCode::kInternal, "the attacker tool failed (status " + std::to_string(status) + "): " + text);
  }
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.contains("connections")) return Error(ErrorCode::kInternal, "bad report: " + text);
  return j;
}

std::string rawRequest(int port, const std::string& source, const std::string& request, double timeout_seconds) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return "";
  struct sockaddr_in src {};
  src.sin_family = AF_INET;
  ::inet_pton(AF_INET, source.c_str(), &src.sin_addr);
  if (::bind(fd.get(), reinterpret_cast<struct sockaddr*>(&src), sizeof(src)) != 0) return "";
  struct sockaddr_in dst {};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
  if (::connect(fd.get(), reinterpret_cast<struct sockaddr*>(&dst), sizeof(dst)) != 0) return "";
  if (::send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size())) {
    return "";
  }
  std::string answer;
  const double deadline = monotonicSeconds() + timeout_seconds;
  char buf[16384];
  while (monotonicSeconds() < deadline) {
    struct pollfd p = {fd.get(), POLLIN, 0};
    int n = ::poll(&p, 1, 100);
    if (n <= 0) continue;
    ssize_t r = ::recv(fd.get(), buf, sizeof(buf), 0);
    if (r <= 0) break;
    answer.append(buf, static_cast<size_t>(r));
  }
  return answer;
}

int statusOf(const std::string& answer) {
  if (answer.rfind("HTTP/1.", 0) != 0 || answer.size() < 12) return 0;
  return std::atoi(answer.substr(9, 3).c_str());
}

nlohmann::json bodyOf(const std::string& answer) {
  auto end = answer.find("\r\n\r\n");
  if (end == std::string::npos) return nullptr;
  return nlohmann::json::parse(answer.substr(end + 4), nullptr, false);
}

}  // namespace dsec::testing
