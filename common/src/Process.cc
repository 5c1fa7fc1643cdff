#include "dsec/common/Process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>

#include "dsec/common/Strings.h"

extern char** environ;

namespace dsec {
namespace {

constexpr size_t kOutputCap = 1 << 20;

std::string describeCommand(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& a : argv) {
    if (!out.empty()) out += ' ';
    out += a;
  }
  if (out.size() > 200) out = out.substr(0, 200) + "...";
  return out;
}

// The caller's environment with options.extra_env replacing or adding variables.
std::vector<std::string> childEnvironment(const CommandOptions& options) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    auto eq = entry.find('=');
    if (eq != std::string::npos && options.extra_env.count(entry.substr(0, eq)) != 0) continue;
    env.push_back(std::move(entry));
  }
  for (const auto& [k, v] : options.extra_env) env.push_back(k + "=" + v);
  return env;
}

// A null-terminated array of pointers into `strings` (which must outlive it), as exec takes them.
std::vector<char*> cStringArray(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Starts argv (looked up on PATH) with stdin /dev/null and stdout and stderr on out_fd, in a process group of
// its own, with no signal blocked or ignored.
Result<pid_t> spawnCapturing(const std::vector<std::string>& argv, const CommandOptions& options, int out_fd) {
  // Everything the child needs is prepared here: posix_spawn runs it without touching our heap.
  std::vector<std::string> env_storage = childEnvironment(options);
  std::vector<char*> envp = cStringArray(env_storage);
  std::vector<std::string> argv_storage = argv;
  std::vector<char*> cargv = cStringArray(argv_storage);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out_fd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out_fd, STDERR_FILENO);
  if (!options.cwd.empty()) posix_spawn_file_actions_addchdir_np(&actions, options.cwd.c_str());
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t empty_mask;
  sigemptyset(&empty_mask);
  sigset_t default_signals;
  sigfillset(&default_signals);
  posix_spawnattr_setsigmask(&attr, &empty_mask);  // servers block SIGTERM/SIGINT; children must not inherit that
  posix_spawnattr_setsigdefault(&attr, &default_signals);
  posix_spawnattr_setpgroup(&attr, 0);  // own process group so a timeout kills the whole tree
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = -1;
  int rc = posix_spawnp(&pid, cargv[0], &actions, &attr, cargv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return Error::sys(rc, "starting " + describeCommand(argv));
  return pid;
}

// Reads fd until EOF, keeping the last kOutputCap bytes in *output; at the deadline (0: none) kills the
// process group `pid` leads and returns true (timed out).
// Hands complete lines of output to on_line; `partial` keeps the unfinished end (bounded: a line longer than
// the buffer is handed over in pieces).
void emitLines(const std::function<void(std::string_view)>& on_line, std::string* partial, const char* data,
               size_t size) {
  if (!on_line) return;
  partial->append(data, size);
  size_t start = 0;
  for (size_t nl = partial->find('\n'); nl != std::string::npos; nl = partial->find('\n', start)) {
    on_line(std::string_view(*partial).substr(start, nl - start));
    start = nl + 1;
  }
  partial->erase(0, start);
  if (partial->size() > 65536) {
    on_line(*partial);
    partial->clear();
  }
}

bool collectOutput(int fd, pid_t pid, double deadline, std::string* output,
                   const std::function<void(std::string_view)>& on_line) {
  bool timed_out = false;
  std::string partial;
  char buf[65536];
  while (true) {
    int wait_ms = -1;
    if (deadline > 0) {
      double left = deadline - monotonicSeconds();
      if (left <= 0) {
        ::kill(-pid, SIGKILL);
        timed_out = true;
        break;
      }
      wait_ms = static_cast<int>(left * 1000) + 1;
    }
    struct pollfd pfd = {fd, POLLIN, 0};
    int n = ::poll(&pfd, 1, wait_ms);
    if (n < 0 && errno != EINTR) break;
    if (n <= 0) continue;
    ssize_t got = ::read(fd, buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    output->append(buf, static_cast<size_t>(got));
    emitLines(on_line, &partial, buf, static_cast<size_t>(got));
    if (output->size() > 2 * kOutputCap) output->erase(0, output->size() - kOutputCap);
  }
  if (on_line && !partial.empty()) on_line(partial);
  if (output->size() > kOutputCap) output->erase(0, output->size() - kOutputCap);
  return timed_out;
}

}  // namespace

Result<CommandResult> runCommand(const std::vector<std::string>& argv, const CommandOptions& options) {
  if (argv.empty()) return Error::invalid("empty command");
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) return Error::sys(errno, "pipe");
  UniqueFd read_end(pipefd[0]);
  UniqueFd write_end(pipefd[1]);
  DSEC_ASSIGN_OR_RETURN(pid_t pid, spawnCapturing(argv, options, write_end.get()));
  write_end.reset();

  CommandResult result;
  double deadline = options.timeout_seconds > 0 ? monotonicSeconds() + options.timeout_seconds : 0;
  const bool timed_out = collectOutput(read_end.get(), pid, deadline, &result.output, options.on_line);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    return Error(ErrorCode::kTimeout,
                 describeCommand(argv) + " timed out after " + std::to_string(options.timeout_seconds) + " s");
  }
  if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.signal = WTERMSIG(status);
  }
  return result;
}

Result<std::string> runCommandChecked(const std::vector<std::string>& argv, const CommandOptions& options) {
  DSEC_ASSIGN_OR_RETURN(CommandResult r, runCommand(argv, options));
  if (r.exit_code != 0) {
    std::string tail = r.output.size() > 4000 ? r.output.substr(r.output.size() - 4000) : r.output;
    std::string how = r.signal != 0 ? "was killed by signal " + std::to_string(r.signal)
                                    : "exited with status " + std::to_string(r.exit_code);
    return Error(ErrorCode::kSystem, describeCommand(argv) + " " + how + ": " + trim(tail));
  }
  return std::move(r.output);
}

Result<UniqueFd> pidfdOpen(pid_t pid) {
  int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return Error::sys(errno, "pidfd_open " + std::to_string(pid));
  return UniqueFd(fd);
}

Result<uint64_t> processStartTime(pid_t pid) {
  DSEC_ASSIGN_OR_RETURN(std::string stat, readFile("/proc/" + std::to_string(pid) + "/stat"));
  // The command name (field 2) may hold spaces and parentheses: fields resume after the last ')'.
  auto close = stat.rfind(')');
  if (close == std::string::npos) return Error::internal("malformed /proc/" + std::to_string(pid) + "/stat");
  auto fields = split(trim(stat.substr(close + 1)), ' ');
  // fields[0] is field 3 (state); start time is field 22.
  if (fields.size() < 20) return Error::internal("short /proc/" + std::to_string(pid) + "/stat");
  return static_cast<uint64_t>(std::strtoull(fields[19].c_str(), nullptr, 10));
}

std::string findProgram(const std::string& name) {
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = std::getenv("PATH");
  std::string search = path != nullptr ? path : "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
  for (const auto& dir : split(search, ':')) {
    if (dir.empty()) continue;
    std::string candidate = dir + "/" + name;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return "";
}

std::string selfExeDir() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<size_t>(n));
  auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

}  // namespace dsec
