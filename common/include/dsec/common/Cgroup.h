// One cgroup per sandbox, on cgroup v1 (controllers in separate hierarchies: this machine) or v2 (one tree:
// real clusters). The driver is detected once per node; the file system underneath sits behind CgroupFs so
// the logic is unit-tested against an in-memory tree as well as the real /sys/fs/cgroup.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dsec/common/Result.h"

namespace dsec {

struct CgroupLimits {
  int64_t memory_bytes = 0;  // 0 = unlimited; hard limit (v2 memory.max, v1 memory.limit_in_bytes)
  double cpus = 0;           // 0 = unlimited; quota as CPUs (v2 cpu.max, v1 cfs_quota/period)
  int64_t pids = 0;          // 0 = unlimited
  uint64_t cpu_weight = 0;   // 0 = default; v2 cpu.weight (1..10000), v1 shares scaled from it
  // cpuset.cpus / cpuset.mems in list format ("2-3", "0"); "" = the parent's (the node's shared pool). v1 needs
  // both set before a cgroup takes tasks, so the driver copies the parent's when not given; v2 inherits.
  std::string cpuset_cpus = {};
  std::string cpuset_mems = {};
  // cpu.idle = 1 (Linux >= 5.15, v1 and v2): the cgroup's group entity is SCHED_IDLE among its siblings, so a
  // normal task waking next to it preempts it at once (a task's own SCHED_IDLE only counts inside its group).
  // Skipped where the kernel has no cpu.idle.
  bool cpu_idle = false;
};

struct CgroupStats {
  int64_t memory_current = 0;  // bytes charged now
  int64_t memory_peak = 0;     // high-water mark where the kernel reports it, else 0
  int64_t oom_kills = 0;       // OOM kills inside this cgroup
  int64_t pids_current = 0;
  uint64_t cpu_usage_usec = 0;
  bool frozen = false;
};

// The file operations a cgroup driver needs. RealCgroupFs talks to the kernel; tests use an in-memory one.
class CgroupFs {
 public:
  virtual ~CgroupFs() = default;
  virtual Status makeDir(const std::string& path) = 0;
  virtual Status removeDir(const std::string& path) = 0;
  virtual bool exists(const std::string& path) = 0;
  virtual Status writeFile(const std::string& path, const std::string& value) = 0;
  virtual Result<std::string> readFile(const std::string& path) = 0;
  // Names of the subdirectories of path (child cgroups); a missing path is an error with ENOENT.
  virtual Result<std::vector<std::string>> listDirs(const std::string& path) = 0;
  // Sends a signal to a process (v1 killAll); a process already gone (ESRCH) is not an error. Behind the
  // interface so unit tests over a fake tree never signal real pids.
  virtual Status signalProcess(pid_t pid, int signal) = 0;
};
std::unique_ptr<CgroupFs> makeRealCgroupFs();

class Cgroup {
 public:
  virtual ~Cgroup() = default;
  virtual const std::string& name() const = 0;
  // Moves a process (all its threads) into this cgroup in every hierarchy.
  virtual Status attach(pid_t pid) = 0;
  // The cgroup.procs/tasks files a freshly forked child writes "0" into to join (async-signal-safe to use).
  virtual std::vector<std::string> procsFiles() const = 0;
  // A directory path usable with clone3(CLONE_INTO_CGROUP) (v2 only), else "".
  virtual std::string cloneIntoPath() const = 0;
  virtual Status setLimits(const CgroupLimits& limits) = 0;
  // Moves the cgroup to other CPUs / memory nodes (the shared pool grew or shrank); "" leaves that one as it is.
  // kUnsupported when the node has no cpuset controller for this cgroup (v1 not mounted, v2 not enabled).
  virtual Status setCpuset(const std::string& cpus, const std::string& mems) = 0;
  virtual Status freeze() = 0;  // returns when every task is frozen
  virtual Status thaw() = 0;
  virtual Result<CgroupStats> stats() = 0;
  virtual Result<std::vector<pid_t>> pids() = 0;
  // Pushes reclaimable memory out: v2 memory.reclaim, v1 memory.force_empty (page cache) where allowed.
  virtual Status reclaim() = 0;
  // SIGKILLs every process in the cgroup (v2 cgroup.kill; v1 freeze, kill each, thaw) and waits until empty.
  virtual Status killAll() = 0;
  // Removes the directories (the cgroup must be empty).
  virtual Status remove() = 0;
};

class CgroupDriver {
 public:
  virtual ~CgroupDriver() = default;
  virtual int version() const = 0;  // 1 or 2
  // Creates <parent>/<name> with the limits; fails with kAlreadyExists if present.
  virtual Result<std::unique_ptr<Cgroup>> create(const std::string& name, const CgroupLimits& limits) = 0;
  // Opens an existing cgroup (re-adoption after an agent restart). On v1 a cgroup present in only some
  // hierarchies (a crash mid-create) opens too, so it can be killed and removed.
  virtual Result<std::unique_ptr<Cgroup>> open(const std::string& name) = 0;
  // Names of existing child cgroups under the driver's parent (to reap what cannot be adopted); on v1 the
  // union over all hierarchies.
  virtual Result<std::vector<std::string>> list() = 0;
  // Human-readable description for `dsec doctor`: "v1 (memory, cpu, pids, freezer at /sys/fs/cgroup)".
  virtual std::string describe() const = 0;
};

// Limit conversions shared by both drivers (public so they are unit-tested on their own).
constexpr int64_t kCpuPeriodUsec = 100000;
// CFS quota in microseconds per kCpuPeriodUsec for a CPU count; -1 = unlimited (cpus <= 0). At least 1 ms,
// the kernel's minimum.
int64_t cpuQuotaUsec(double cpus);
// v1 cpu.shares for a v2-style weight (default 100 <-> 1024 shares), clamped to [2, 262144]; 0 -> 1024.
uint64_t cpuWeightToShares(uint64_t weight);
// A cpuset list ("0-3,8"): digits, ',' and '-' only, each range ascending; "" is valid (= the parent's).
Status validateCpusetList(const std::string& list, const std::string& field);
// Rejects negative or impossible limits (kInvalidArgument, message naming the field).
Status validateCgroupLimits(const CgroupLimits& limits);

// Detects v2 (cgroup.controllers at the root) or v1 (controllers mounted under root/<controller>) and
// returns a driver whose sandboxes live under <parent> (e.g. "dsec" -> /sys/fs/cgroup/memory/dsec/<id>).
// root defaults to /sys/fs/cgroup. Missing controllers give kUnsupported naming them.
Result<std::unique_ptr<CgroupDriver>> detectCgroupDriver(const std::string& parent,
                                                         const std::string& root = "/sys/fs/cgroup");
// Explicit constructors for tests over a fake CgroupFs. v1: the parent holds at most cpuset_shard_capacity
// sandbox cgroups in the cpuset hierarchy, the rest go to sub-parents <parent>/shard@N of as many each (made on
// demand, removed when empty): making a cpuset cgroup walks its siblings. 0: the default, 256.
std::unique_ptr<CgroupDriver> makeCgroupV1Driver(std::unique_ptr<CgroupFs> fs, const std::string& root,
                                                 const std::string& parent, int cpuset_shard_capacity = 0);
std::unique_ptr<CgroupDriver> makeCgroupV2Driver(std::unique_ptr<CgroupFs> fs, const std::string& root,
                                                 const std::string& parent);

}  // namespace dsec
