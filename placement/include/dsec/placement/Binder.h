// Binding a sandbox's processes to CPUs and memory nodes. Behind an interface because binding on a modelled
// (synthetic or XML) node must not touch the machine we run on: tests record, the node agent binds for real.
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dsec/common/Result.h"

namespace dsec::placement {

// Either a process (pid; 0 = the calling thread) or a cgroup directory holding cpuset.cpus/cpuset.mems (the
// cpuset hierarchy's directory on cgroup v1, the sandbox's directory on v2).
struct BindTarget {
  pid_t pid = 0;
  std::string cgroup_dir;

  static BindTarget process(pid_t pid) { return {pid, ""}; }
  static BindTarget cgroup(std::string dir) { return {0, std::move(dir)}; }
  bool isCgroup() const { return !cgroup_dir.empty(); }
  std::string describe() const;
};

class Binder {
 public:
  virtual ~Binder() = default;
  // cpuset in list format ("0-11,96-107").
  virtual Status bindCpus(const BindTarget& target, const std::string& cpuset) = 0;
  // NUMA node OS indices in list format ("0" or "0-1"); memory is allocated only there.
  virtual Status bindMemory(const BindTarget& target, const std::string& mems) = 0;
  // SCHED_IDLE for best-effort sandboxes, SCHED_OTHER otherwise. A cgroup target uses cgroup v2 cpu.idle.
  virtual Status setSchedPolicy(const BindTarget& target, int policy) = 0;
};

// Talks to the kernel: sched_setaffinity / set_mempolicy / sched_setscheduler for processes, cpuset.cpus /
// cpuset.mems / cpu.idle for cgroups. set_mempolicy only applies to the calling thread, so memory binding of
// another process needs its cgroup (kUnsupported otherwise, saying so).
std::unique_ptr<Binder> makeRealBinder();

// Remembers every call (and can be told to fail) so tests check what would have been bound.
class RecordingBinder : public Binder {
 public:
  struct Call {
    std::string op;  // "cpus", "mems" or "sched"
    BindTarget target;
    std::string value;  // the list, or the policy number
  };
  Status bindCpus(const BindTarget& target, const std::string& cpuset) override;
  Status bindMemory(const BindTarget& target, const std::string& mems) override;
  Status setSchedPolicy(const BindTarget& target, int policy) override;

  const std::vector<Call>& calls() const { return calls_; }
  void clear() { calls_.clear(); }
  // The last value recorded for (op, target), or "" if none.
  std::string last(const std::string& op, const BindTarget& target) const;
  void failNext(Error error) { fail_ = std::move(error); }

 private:
  Status record(const std::string& op, const BindTarget& target, std::string value);
  std::vector<Call> calls_;
  std::optional<Error> fail_;
};

}  // namespace dsec::placement
