// The task's seccomp filter and capabilities, taken from the container backend so a Slurm task is held to
// exactly what a process of a `dsec serve` sandbox is held to.
#include "TaskLockdown.h"

#include <linux/capability.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

// The backend's private headers (spank/CMakeLists.txt adds backends/container/src to this library's include
// path): the sandbox's filter and capability set are not part of the backend's public interface yet.
#include "dsec/backends/container/SandboxPolicy.h"

namespace dsec::spank {

Result<TaskPolicy> sandboxTaskPolicy() {
  TaskPolicy policy;
  DSEC_ASSIGN_OR_RETURN(policy.seccomp, backends::buildSandboxSeccompFilter());
  if (policy.seccomp.empty() || policy.seccomp.size() > BPF_MAXINSNS) {
    return Error::internal("the sandbox seccomp filter has " + std::to_string(policy.seccomp.size()) + " instructions");
  }
  policy.keep_caps = backends::defaultSandboxCaps();
  return policy;
}

Status lockDownTask(const TaskPolicy& policy) {
  if (policy.seccomp.empty()) return Error::internal("no seccomp filter to install");
  for (int cap = 0; cap <= 63; ++cap) {
    if ((policy.keep_caps >> cap) & 1) continue;
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0) {
      if (errno == EINVAL) break;  // past the kernel's last capability
      return Error::sys(errno, "drop capability " + std::to_string(cap) + " from the bounding set");
    }
  }
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0) return Error::sys(errno, "clear ambient caps");
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (syscall(SYS_capget, &header, data) < 0) return Error::sys(errno, "read the task's capabilities");
  for (int i = 0; i < 2; ++i) data[i].inheritable &= static_cast<uint32_t>(policy.keep_caps >> (32 * i));
  if (syscall(SYS_capset, &header, data) < 0) return Error::sys(errno, "cut the inheritable capabilities");
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) return Error::sys(errno, "set no_new_privs");
  sock_fprog prog{};
  prog.len = static_cast<unsigned short>(policy.seccomp.size());
  prog.filter = const_cast<sock_filter*>(policy.seccomp.data());
  if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) < 0) {
    return Error::sys(errno, "install the sandbox's seccomp filter");
  }
  return okStatus();
}

}  // namespace dsec::spank
