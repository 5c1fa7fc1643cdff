// A sandbox with protected paths under the file watch (FileWatch.h): watched from the moment its list is non-empty
// (create, a change, adoption) until it is empty again or the sandbox is gone.
#include "ContainerSandbox.h"
#include "dsec/common/Logging.h"

namespace dsec::backends {

Result<FileWatch*> startedFileWatch(ContainerShared& shared) {
  std::lock_guard lock(shared.filewatch_mu);
  if (shared.filewatch) return shared.filewatch.get();
  if (!shared.filewatch_problem.empty()) return Error(ErrorCode::kUnsupported, shared.filewatch_problem);
  auto started = FileWatch::start();
  if (!started.ok()) {
    // Said once: protection holds without the watch, only its refusals go unrecorded.
    shared.filewatch_problem = "refused writes to protected paths are not recorded: " + started.error().message();
    DSEC_LOG(kWarn, "container") << shared.filewatch_problem;
    return Error(ErrorCode::kUnsupported, shared.filewatch_problem);
  }
  shared.filewatch = std::move(*started);
  DSEC_LOG(kInfo, "container") << "file watch: refused writes to protected paths recorded ("
                               << shared.filewatch->watchedCalls() << " syscalls watched)";
  return shared.filewatch.get();
}

void ContainerSandbox::watchProtectedPaths() {
  const std::vector<std::string> paths = protection_->paths();
  if (paths.empty()) {
    forgetFileWatch();
    return;
  }
  auto watch = startedFileWatch(*shared_);
  if (!watch.ok()) return;  // reported once by startedFileWatch
  if (mntns_ == 0) {
    auto mntns = mountNamespaceOf(init_.pidfd.get(), init_.pid);
    if (!mntns.ok()) {
      DSEC_LOG(kWarn, "container") << spec_.id
                                   << ": not watched for writes to protected paths: " << mntns.error().message();
      return;
    }
    mntns_ = *mntns;
  }
  if (auto s = (*watch)->watch(mntns_, {violations_, paths, init_.pid}); !s.ok()) {
    DSEC_LOG(kWarn, "container") << spec_.id << ": not watched for writes to protected paths: " << s.error().message();
  }
}

void ContainerSandbox::rewatchProtectedPaths() {
  std::lock_guard lock(policy_mu_);
  watchProtectedPaths();
}

void ContainerSandbox::forgetFileWatch() {
  if (mntns_ == 0) return;
  std::lock_guard lock(shared_->filewatch_mu);
  if (shared_->filewatch) shared_->filewatch->unwatch(mntns_);
  mntns_ = 0;
}

std::string fileWatchSupportProblem() {
  auto watch = FileWatch::start();
  return watch.ok() ? "" : watch.error().message();
}

}  // namespace dsec::backends
