// Runs the built `dsec` binary (path from the DSEC_CLI_PATH compile definition) as the user would.
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace dsec::testing {

struct CliResult {
  int exit_code = -1;  // -1: killed by a signal or timed out
  std::string out;
  std::string err;
};

// env entries are set (or, with an empty value, removed) on top of ours. HOME is always redirected by callers
// that care. Kills the process after timeout_seconds. Its stdin is stdin_fd when >= 0, else /dev/null.
CliResult runDsec(const std::vector<std::string>& args, const std::map<std::string, std::string>& env = {},
                  double timeout_seconds = 60, int stdin_fd = -1);

// A `dsec ...` left running in the background (dsec serve); SIGTERM + wait at destruction.
class BackgroundDsec {
 public:
  BackgroundDsec(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
                 const std::string& log_path);
  ~BackgroundDsec();
  BackgroundDsec(const BackgroundDsec&) = delete;
  BackgroundDsec& operator=(const BackgroundDsec&) = delete;
  pid_t pid() const { return pid_; }
  bool running();
  // Sends SIGTERM and waits; returns the exit code (-1 if killed by a signal).
  int stop();

 private:
  pid_t pid_ = -1;
};

// A TCP port on 127.0.0.1 that was free a moment ago.
int pickFreePort();

// `dsec serve --listen 127.0.0.1:<free port> --root ROOT ARGS...` with HOME=home (log at home/serve.log),
// up once /healthz answers and the token file exists. `token` stays empty if it never came up (`log` says why).
struct ServedNode {
  std::unique_ptr<BackgroundDsec> process;
  std::string endpoint;  // http://127.0.0.1:PORT
  std::string token;
  std::string log;                         // the log's contents when it did not come up
  std::map<std::string, std::string> env;  // HOME, DSEC_ENDPOINT, DSEC_TOKEN for `dsec` clients
};
ServedNode startServe(const std::string& root, const std::string& home, const std::vector<std::string>& args);

}  // namespace dsec::testing
