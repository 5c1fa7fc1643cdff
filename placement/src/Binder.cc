// BindTarget and the recording binder used by tests (and by dry runs of the node agent).
#include "dsec/placement/Binder.h"

#include <string>

namespace dsec::placement {

std::string BindTarget::describe() const {
  if (isCgroup()) return "cgroup " + cgroup_dir;
  return pid == 0 ? std::string("the calling thread") : "pid " + std::to_string(pid);
}

Status RecordingBinder::bindCpus(const BindTarget& target, const std::string& cpuset) {
  return record("cpus", target, cpuset);
}

Status RecordingBinder::bindMemory(const BindTarget& target, const std::string& mems) {
  return record("mems", target, mems);
}

Status RecordingBinder::setSchedPolicy(const BindTarget& target, int policy) {
  return record("sched", target, std::to_string(policy));
}

Status RecordingBinder::record(const std::string& op, const BindTarget& target, std::string value) {
  if (fail_) {
    Error error = std::move(*fail_);
    fail_.reset();
    return error;
  }
  calls_.push_back({op, target, std::move(value)});
  return okStatus();
}

std::string RecordingBinder::last(const std::string& op, const BindTarget& target) const {
  for (auto it = calls_.rbegin(); it != calls_.rend(); ++it) {
    if (it->op == op && it->target.pid == target.pid && it->target.cgroup_dir == target.cgroup_dir) return it->value;
  }
  return "";
}

}  // namespace dsec::placement
