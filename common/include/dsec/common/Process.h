// Helpers for host-side processes: run a tool and capture its output, pidfds, process start times.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"

namespace dsec {

struct CommandResult {
  int exit_code = -1;  // -1 if killed by a signal
  int signal = 0;
  std::string output;  // stdout and stderr interleaved, capped at 1 MiB (tail kept)
};

struct CommandOptions {
  std::map<std::string, std::string> extra_env;  // added to the inherited environment
  std::string cwd;
  double timeout_seconds = 0;  // 0 = none; on expiry the process group is killed
  // Each line of output as it arrives (without its newline; a last line without one at the end), for progress.
  std::function<void(std::string_view line)> on_line;
};

// Runs argv[0] (searched on PATH) and waits. An error only if it could not be started or timed out;
// a non-zero exit is reported in the result.
Result<CommandResult> runCommand(const std::vector<std::string>& argv, const CommandOptions& options = {});
// Same, but a non-zero exit becomes an error whose message has the command and the tail of its output.
Result<std::string> runCommandChecked(const std::vector<std::string>& argv, const CommandOptions& options = {});

Result<UniqueFd> pidfdOpen(pid_t pid);
// Start time of a process in clock ticks since boot (field 22 of /proc/PID/stat): with the pid it names
// one process for ever, so a re-adopted sandbox init cannot be confused with a recycled pid.
Result<uint64_t> processStartTime(pid_t pid);
// Looks up a program on PATH; empty if missing.
std::string findProgram(const std::string& name);
// Directory holding the running executable (to find sibling binaries such as dsec-sandbox-init).
std::string selfExeDir();

}  // namespace dsec
