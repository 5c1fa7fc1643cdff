#include "CliRunner.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "ApiClient.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {

namespace {

std::vector<std::string> buildEnv(const std::map<std::string, std::string>& overrides) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    auto eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  for (const auto& [k, v] : overrides) {
    if (v.empty()) {
      env.erase(k);
    } else {
      env[k] = v;
    }
  }
  std::vector<std::string> out;
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

pid_t spawn(const std::vector<std::string>& args, const std::map<std::string, std::string>& env, int in_fd, int out_fd,
            int err_fd) {
  std::vector<std::string> argv_s = {DSEC_CLI_PATH};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<std::string> env_s = buildEnv(env);
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    int null_fd = in_fd >= 0 ? in_fd : open("/dev/null", O_RDONLY);
    dup2(null_fd, 0);
    dup2(out_fd, 1);
    dup2(err_fd, 2);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  return pid;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int decodeStatus(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }

}  // namespace

CliResult runDsec(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
                  double timeout_seconds, int stdin_fd) {
  char out_path[] = "/tmp/dsec-cli-out.XXXXXX";
  char err_path[] = "/tmp/dsec-cli-err.XXXXXX";
  int out_fd = mkstemp(out_path);
  int err_fd = mkstemp(err_path);
  pid_t pid = spawn(args, env, stdin_fd, out_fd, err_fd);
  close(out_fd);
  close(err_fd);
  CliResult result;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  int status = 0;
  for (;;) {
    pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) {
      result.exit_code = decodeStatus(status);
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      result.err = "[timed out after " + std::to_string(timeout_seconds) + " s]\n";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  result.out = slurp(out_path);
  result.err += slurp(err_path);
  unlink(out_path);
  unlink(err_path);
  return result;
}

BackgroundDsec::BackgroundDsec(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
                               const std::string& log_path) {
  int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_ = spawn(args, env, -1, log_fd, log_fd);
  close(log_fd);
}

BackgroundDsec::~BackgroundDsec() { stop(); }

bool BackgroundDsec::running() {
  if (pid_ < 0) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    pid_ = -1;
    return false;
  }
  return true;
}

int BackgroundDsec::stop() {
  if (pid_ < 0) return -1;
  kill(pid_, SIGTERM);
  int status = 0;
  for (int i = 0; i < 1000; ++i) {  // 10 s, then SIGKILL
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return decodeStatus(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(-pid_, SIGKILL);
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return -1;
}

int pickFreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) throw std::runtime_error("bind");
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

ServedNode startServe(const std::string& root, const std::string& home, const std::vector<std::string>& args) {
  ServedNode node;
  node.endpoint = "http://127.0.0.1:" + std::to_string(pickFreePort());
  std::vector<std::string> argv = {"serve", "--listen", node.endpoint.substr(7), "--root", root};
  argv.insert(argv.end(), args.begin(), args.end());
  const std::string log_path = home + "/serve.log";
  node.process = std::make_unique<BackgroundDsec>(argv, std::map<std::string, std::string>{{"HOME", home}}, log_path);
  cli::ApiClient probe(cli::FleetAddress{node.endpoint, ""});
  for (int i = 0; i < 300 && node.process->running(); ++i) {
    if (probe.call(cli::HttpMethod::kGet, "/healthz").ok() && ::access((root + "/token").c_str(), F_OK) == 0) {
      node.token = trim(readFile(root + "/token").value());
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (node.token.empty()) node.log = readFile(log_path).ok() ? readFile(log_path).value() : "(no log)";
  node.env = {{"HOME", home}, {"DSEC_ENDPOINT", node.endpoint}, {"DSEC_TOKEN", node.token}};
  return node;
}

}  // namespace dsec::testing
