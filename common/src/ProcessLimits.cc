#include "dsec/common/ProcessLimits.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "dsec/common/Strings.h"

namespace dsec {
namespace {

std::mutex g_mu;
std::optional<rlimit> g_original_nofile;

std::string limitText(rlim_t v) { return v == RLIM_INFINITY ? std::string("unlimited") : std::to_string(v); }

int64_t readSysctl(const char* path) {
  auto text = readFile(path);
  return text.ok() ? std::atoll(trim(*text).c_str()) : 0;
}

// RLIMIT_NOFILE: the soft limit up to the hard one, and the hard one up to fs.nr_open if we may.
void raiseFileLimit(RaisedLimits* out) {
  rlimit now{};
  if (getrlimit(RLIMIT_NOFILE, &now) != 0) return;
  out->nofile_before = now;
  out->nr_open = readSysctl("/proc/sys/fs/nr_open");
  rlimit want = now;
  if (out->nr_open > 0 && now.rlim_max != RLIM_INFINITY && static_cast<rlim_t>(out->nr_open) > now.rlim_max) {
    want.rlim_max = static_cast<rlim_t>(out->nr_open);
  }
  want.rlim_cur = want.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &want) != 0) {
    // Without CAP_SYS_RESOURCE the hard limit stays: the soft one can still come up to it.
    if (want.rlim_max != now.rlim_max) {
      out->notes.push_back("RLIMIT_NOFILE hard limit stays at " + limitText(now.rlim_max) +
                           " (raising it to fs.nr_open " + std::to_string(out->nr_open) + ": " + std::strerror(errno) +
                           ")");
    }
    want = now;
    want.rlim_cur = now.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &want);
  }
  getrlimit(RLIMIT_NOFILE, &out->nofile);
  if (out->nofile.rlim_cur != now.rlim_cur) {
    out->notes.push_back("RLIMIT_NOFILE " + limitText(now.rlim_cur) + " -> " + limitText(out->nofile.rlim_cur));
    std::lock_guard lock(g_mu);
    if (!g_original_nofile) g_original_nofile = now;
  }
}

void raiseProcessCountLimit(RaisedLimits* out) {
  rlimit now{};
  if (getrlimit(RLIMIT_NPROC, &now) != 0) return;
  out->nproc_before = now;
  if (now.rlim_cur < now.rlim_max) {
    rlimit want = now;
    want.rlim_cur = now.rlim_max;
    if (setrlimit(RLIMIT_NPROC, &want) == 0) {
      out->notes.push_back("RLIMIT_NPROC " + limitText(now.rlim_cur) + " -> " + limitText(now.rlim_max));
    }
  }
  getrlimit(RLIMIT_NPROC, &out->nproc);
}

}  // namespace

RaisedLimits raiseProcessLimits() {
  RaisedLimits out;
  raiseFileLimit(&out);
  raiseProcessCountLimit(&out);
  return out;
}

std::optional<rlimit> originalFileLimit() {
  std::lock_guard lock(g_mu);
  return g_original_nofile;
}

Result<PidRoom> readPidRoom() {
  PidRoom room;
  room.pid_max = readSysctl("/proc/sys/kernel/pid_max");
  room.threads_max = readSysctl("/proc/sys/kernel/threads-max");
  // "0.52 0.61 0.70 3/1234 5678": the fourth field is runnable/total scheduling entities (threads).
  DSEC_ASSIGN_OR_RETURN(std::string loadavg, readFile("/proc/loadavg"));
  auto fields = split(trim(loadavg), ' ');
  if (fields.size() < 4 || fields[3].find('/') == std::string::npos) {
    return Error::internal("unexpected /proc/loadavg: " + loadavg);
  }
  room.threads = std::atoll(fields[3].substr(fields[3].find('/') + 1).c_str());
  return room;
}

Status SandboxRoom::checkFiles(int64_t live_sandboxes, rlim_t soft_limit) const {
  if (soft_limit == RLIM_INFINITY) return okStatus();
  const int64_t needed = (live_sandboxes + 1) * fds_per_sandbox_ + fd_reserve_;
  if (needed <= static_cast<int64_t>(soft_limit)) return okStatus();
  return Error(ErrorCode::kResourceExhausted,
               "the agent's open files limit (RLIMIT_NOFILE " + std::to_string(soft_limit) + ") has no room for " +
                   "another sandbox: " + std::to_string(live_sandboxes) + " sandboxes hold about " +
                   std::to_string(fds_per_sandbox_) + " fd each and " + std::to_string(fd_reserve_) +
                   " are kept for connections and commands; raise the agent's hard limit (LimitNOFILE= of its "
                   "service, ulimit -Hn, or run it with CAP_SYS_RESOURCE, which lets it raise the limit to "
                   "fs.nr_open itself)");
}

Status SandboxRoom::checkPids(const PidRoom& room) const {
  auto full = [&](const char* name, int64_t limit) -> Status {
    if (limit <= 0 || room.threads + pid_reserve_ < limit) return okStatus();
    return Error(ErrorCode::kResourceExhausted,
                 std::string("the host has no room for another sandbox's processes: ") + std::to_string(room.threads) +
                     " threads run and " + name + " is " + std::to_string(limit) + " (" + std::to_string(pid_reserve_) +
                     " kept for the rest of the host); raise it (sysctl -w " + name + "=...)");
  };
  DSEC_TRY(full("kernel.pid_max", room.pid_max));
  return full("kernel.threads-max", room.threads_max);
}

Status SandboxRoom::check(int64_t live_sandboxes) {
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0) DSEC_TRY(checkFiles(live_sandboxes, nofile.rlim_cur));
  PidRoom room;
  {
    std::lock_guard lock(mu_);
    const double now = monotonicSeconds();
    if (now - sysctls_read_at_ > 5) {
      auto fresh = readPidRoom();
      if (!fresh.ok()) return okStatus();  // nothing to go by: the create finds out itself
      sysctls_ = *fresh;
      sysctls_read_at_ = now;
    }
    room = sysctls_;
  }
  auto threads = readPidRoom();  // the thread count moves with every sandbox; the sysctls hardly ever
  if (threads.ok()) room.threads = threads->threads;
  return checkPids(room);
}

Error explainLimitError(const Error& e, int64_t live_sandboxes) {
  if (e.sysErrno() == EMFILE) {
    rlimit nofile{};
    getrlimit(RLIMIT_NOFILE, &nofile);
    return Error(ErrorCode::kResourceExhausted,
                 "the agent reached its open files limit (RLIMIT_NOFILE " + limitText(nofile.rlim_cur) + ") with " +
                     std::to_string(live_sandboxes) +
                     " sandboxes; raise its hard limit (LimitNOFILE=, ulimit -Hn): " + e.message(),
                 EMFILE);
  }
  if (e.sysErrno() == ENFILE) {
    return Error(ErrorCode::kResourceExhausted,
                 "the host reached its open files limit (fs.file-max " +
                     std::to_string(readSysctl("/proc/sys/fs/file-max")) + "); raise it: " + e.message(),
                 ENFILE);
  }
  return e;
}

}  // namespace dsec
