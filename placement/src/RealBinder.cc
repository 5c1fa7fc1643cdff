// Binding through the kernel. Processes: sched_setaffinity, set_mempolicy (calling thread only),
// sched_setscheduler. Cgroups: cpuset.cpus, cpuset.mems, cpu.idle (v2; v1 has no per-cgroup SCHED_IDLE, so
// the node agent sets the policy on the sandbox's first process and its children inherit it).
#include <sched.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "dsec/common/Strings.h"
#include "dsec/placement/Binder.h"
#include "dsec/placement/CpuList.h"

namespace dsec::placement {

namespace {

constexpr int kMpolBind = 2;  // <numaif.h> is libnuma's; the syscall needs only this constant

class RealBinder : public Binder {
 public:
  Status bindCpus(const BindTarget& target, const std::string& cpuset) override {
    DSEC_ASSIGN_OR_RETURN(auto cpus, parseCpuList(cpuset));
    if (cpus.empty()) return Error::invalid("binding " + target.describe() + " to an empty cpuset");
    if (target.isCgroup()) return writeCgroup(target, "cpuset.cpus", cpuset);
    int max_cpu = cpus.back() + 1;
    cpu_set_t* set = CPU_ALLOC(max_cpu);
    if (set == nullptr) return Error::sys(ENOMEM, "CPU_ALLOC");
    size_t size = CPU_ALLOC_SIZE(max_cpu);
    CPU_ZERO_S(size, set);
    for (int cpu : cpus) CPU_SET_S(cpu, size, set);
    int rc = ::sched_setaffinity(target.pid, size, set);
    int err = errno;
    CPU_FREE(set);
    if (rc != 0) return Error::sys(err, "sched_setaffinity(" + target.describe() + ", " + cpuset + ")");
    return okStatus();
  }

  Status bindMemory(const BindTarget& target, const std::string& mems) override {
    DSEC_ASSIGN_OR_RETURN(auto nodes, parseCpuList(mems));
    if (nodes.empty()) return Error::invalid("binding the memory of " + target.describe() + " to no NUMA node");
    if (target.isCgroup()) return writeCgroup(target, "cpuset.mems", mems);
    if (target.pid != 0 && target.pid != ::getpid() && target.pid != ::gettid()) {
      return Error(ErrorCode::kUnsupported,
                   "cannot bind the memory of " + target.describe() +
                       ": set_mempolicy applies to the calling thread only; bind its cgroup (cpuset.mems)");
    }
    constexpr int kBitsPerWord = 8 * sizeof(unsigned long);
    int max_node = nodes.back() + 1;
    std::vector<unsigned long> mask(static_cast<size_t>(max_node / kBitsPerWord + 1), 0);
    for (int node : nodes) mask[node / kBitsPerWord] |= 1UL << (node % kBitsPerWord);
    // maxnode counts bits and the kernel ignores the last one, hence + 1.
    if (::syscall(SYS_set_mempolicy, kMpolBind, mask.data(), mask.size() * kBitsPerWord + 1) != 0) {
      return Error::sys(errno, "set_mempolicy(MPOL_BIND, " + mems + ")");
    }
    return okStatus();
  }

  Status setSchedPolicy(const BindTarget& target, int policy) override {
    if (target.isCgroup()) {
      std::string file = target.cgroup_dir + "/cpu.idle";
      struct stat st {};
      if (::stat(file.c_str(), &st) != 0) {
        return Error(ErrorCode::kUnsupported, "no cpu.idle in " + target.cgroup_dir +
                                                  " (cgroup v1 or kernel < 5.15): set SCHED_IDLE on the process");
      }
      return writeCgroup(target, "cpu.idle", policy == SCHED_IDLE ? "1" : "0");
    }
    sched_param param{};
    param.sched_priority = 0;
    if (::sched_setscheduler(target.pid, policy, &param) != 0) {
      return Error::sys(errno, "sched_setscheduler(" + target.describe() + ", " + std::to_string(policy) + ")");
    }
    return okStatus();
  }

 private:
  static Status writeCgroup(const BindTarget& target, const std::string& file, const std::string& value) {
    Status written = writeFile(target.cgroup_dir + "/" + file, value);
    if (!written.ok()) return written.error().wrap("binding " + target.describe());
    return okStatus();
  }
};

}  // namespace

std::unique_ptr<Binder> makeRealBinder() { return std::make_unique<RealBinder>(); }

}  // namespace dsec::placement
