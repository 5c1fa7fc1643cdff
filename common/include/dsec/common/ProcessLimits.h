// The kernel limits that bound how many sandboxes one agent holds (docs/density.md, "Limits"). The agent raises
// its own where it may, at start (raiseProcessLimits), and checks before each create what it cannot raise
// (SandboxRoom), so a full node refuses a create naming the limit instead of failing somewhere inside with EMFILE
// or EAGAIN.
#pragma once

#include <sys/resource.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dsec/common/Result.h"

namespace dsec {

struct RaisedLimits {
  rlimit nofile_before{}, nofile{};  // RLIMIT_NOFILE before and after
  rlimit nproc_before{}, nproc{};    // RLIMIT_NPROC before and after
  int64_t nr_open = 0;               // fs.nr_open: how far a privileged process may raise RLIMIT_NOFILE
  std::vector<std::string> notes;    // what was raised, and what could not be and why
};

// Raises this process's RLIMIT_NOFILE (soft to hard, and hard to fs.nr_open where CAP_SYS_RESOURCE allows) and
// RLIMIT_NPROC (soft to hard). The limits it found are kept for children that must not inherit the raised ones
// (originalFileLimit). Idempotent.
RaisedLimits raiseProcessLimits();

// RLIMIT_NOFILE as this process started (before raiseProcessLimits), or nullopt if it raised none: processes it
// starts for sandboxes get it back, so raising the agent's limit changes nothing inside.
std::optional<rlimit> originalFileLimit();

// The host's thread and pid room: kernel.pid_max, kernel.threads-max and the threads running now.
struct PidRoom {
  int64_t pid_max = 0, threads_max = 0, threads = 0;
};
Result<PidRoom> readPidRoom();

// Whether one more sandbox fits under the limits the agent cannot raise: its open files (RLIMIT_NOFILE, counted
// as fds_per_sandbox for each live sandbox plus a reserve for connections and commands) and the host's pids and
// threads (kernel.pid_max, kernel.threads-max, with a reserve for the rest of the host). kResourceExhausted naming
// the limit, its value and how to raise it. The sysctls are read again at most every few seconds; the thread
// count at every check (one read of /proc/loadavg: no walk over processes or fds).
class SandboxRoom {
 public:
  SandboxRoom(int64_t fds_per_sandbox, int64_t fd_reserve, int64_t pid_reserve)
      : fds_per_sandbox_(fds_per_sandbox), fd_reserve_(fd_reserve), pid_reserve_(pid_reserve) {}
  Status check(int64_t live_sandboxes);
  // The fd part alone, for a given soft limit (tests).
  Status checkFiles(int64_t live_sandboxes, rlim_t soft_limit) const;
  Status checkPids(const PidRoom& room) const;

 private:
  const int64_t fds_per_sandbox_, fd_reserve_, pid_reserve_;
  std::mutex mu_;
  double sysctls_read_at_ = -1e9;
  PidRoom sysctls_;
};

// "open files limit" errors (EMFILE, ENFILE) anywhere in a create, told as the limit they are.
Error explainLimitError(const Error& e, int64_t live_sandboxes);

}  // namespace dsec
