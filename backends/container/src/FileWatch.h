// The file watch: which file-changing calls of a sandbox with protected paths the kernel refused, recorded as
// violations of kind "file" (docs/security.md, "Violations"). BPF programs on the per-syscall tracepoints of the
// calls that change files (bpf/filewatch.bpf.c) remember the path arguments of a watched sandbox's calls and report
// those that failed with EROFS, EXDEV, EBUSY, EPERM or EACCES; the agent resolves each path as the sandbox sees it
// and records it only when it falls under one of the sandbox's protected paths. A watched sandbox is named by its
// mount namespace, which its processes cannot leave.
//
// Started with the first sandbox that gets protected paths; a host that cannot run the programs (no BTF, no syscall
// tracepoints) keeps its protection, without the record, and says so once.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "BpfEventThread.h"
#include "ViolationLog.h"
#include "dsec/common/Result.h"

struct dsec_filewatch;
struct dsec_fw_event;
struct bpf_link;

namespace dsec::backends {

class FileWatch {
 public:
  struct Watched {
    std::weak_ptr<ViolationLog> log;
    std::vector<std::string> protected_paths;  // normalised, as in force
    pid_t init_pid = -1;                       // resolves absolute paths once the caller is gone
  };

  // Loads the programs and attaches them to the syscall tracepoints.
  static Result<std::unique_ptr<FileWatch>> start();
  ~FileWatch();
  FileWatch(const FileWatch&) = delete;
  FileWatch& operator=(const FileWatch&) = delete;

  // Watches (or updates) the sandbox whose mount namespace has inode mntns.
  Status watch(uint32_t mntns, Watched sandbox);
  void unwatch(uint32_t mntns);
  // The calls attached (a kernel without some of them, such as the legacy ones on arm64, has fewer).
  size_t watchedCalls() const { return watched_calls_; }

 private:
  FileWatch() = default;
  Status attach();
  void deliver(const dsec_fw_event& event);

  dsec_filewatch* skeleton_ = nullptr;
  std::vector<bpf_link*> links_;
  size_t watched_calls_ = 0;
  bool callers_visible_ = false;  // the agent sees the callers' pids (it is in the initial pid namespace)
  std::mutex mu_;
  std::map<uint32_t, Watched> sandboxes_;
  std::unique_ptr<BpfEventThread> events_;  // last: stopped first, before what deliver() uses goes
};

// The inode of the mount namespace of the process pidfd names (pid: the same process, for kernels before 6.11).
Result<uint32_t> mountNamespaceOf(int pidfd, pid_t pid);

// What the agent makes of one refused call (FileWatchPaths.cc).
struct RefusedFileCall {
  std::string call;                     // the syscall's name
  int error = 0;                        // errno
  std::vector<std::string> candidates;  // the paths it named, as the sandbox sees them (links resolved or not)
};
// The paths of event as the sandbox sees them, resolved through the caller's /proc entries while it lives (its
// working directory, its fds, its root), else through the sandbox init's root (absolute paths only).
RefusedFileCall resolveRefusedCall(const dsec_fw_event& event, pid_t init_pid);
// The violation a refused call is, when one of its paths is (or, refused with EBUSY, is a parent of) a protected
// path; nullopt otherwise.
std::optional<Violation> protectedPathViolation(const RefusedFileCall& call,
                                                const std::vector<std::string>& protected_paths);

}  // namespace dsec::backends
