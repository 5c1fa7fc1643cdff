#include "SeccompFilter.h"

#include <errno.h>
#include <sched.h>
#include <seccomp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <memory>

#include "dsec/common/Fd.h"

namespace dsec::backends {
namespace {

// Blocked outright with EPERM.
constexpr const char* kDenied[] = {
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "kexec_load",
    "kexec_file_load",
    "mount",
    "umount2",
    "pivot_root",
    "swapon",
    "swapoff",
    "reboot",
    "bpf",
    "perf_event_open",
    "keyctl",
    "add_key",
    "request_key",
    "open_by_handle_at",
    "name_to_handle_at",
    "setns",
    "unshare",
    "iopl",
    "ioperm",
    "acct",
    "quotactl",
    "quotactl_fd",
    "userfaultfd",
    "syslog",
    "lookup_dcookie",
    "fsopen",
    "fsmount",
    "move_mount",
    "open_tree",
    "fsconfig",
    "fspick",
    "mount_setattr",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "vhangup",
    "nfsservctl",
    "uselib",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "kcmp",
    "pidfd_getfd",
    "fanotify_init",
    "get_kernel_syms",
    "query_module",
    "_sysctl",
    "ustat",
    "sysfs",
    "lsm_set_self_attr",
};

// clone flags refused: new namespaces, and CLONE_PARENT. Every command is the agent's child (the spawner clones it
// with CLONE_PARENT so the agent can wait for it); a command's own CLONE_PARENT children were the agent's too, which
// waits only for the commands it started: they stayed zombies in the sandbox's pid namespace, and its init, which
// on exit waits until every process of the namespace is reaped, never finished dying (destroy timed out, the init
// and the zombies kept their pids for good).
constexpr unsigned long kDeniedCloneFlags[] = {CLONE_NEWNS,  CLONE_NEWUTS, CLONE_NEWIPC,    CLONE_NEWUSER,
                                               CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWCGROUP, 0x00000080 /* NEWTIME */,
                                               CLONE_PARENT};

struct CtxDeleter {
  void operator()(scmp_filter_ctx ctx) const { seccomp_release(ctx); }
};

}  // namespace

Result<std::vector<sock_filter>> buildSandboxSeccompFilter() {
  std::unique_ptr<void, CtxDeleter> ctx(seccomp_init(SCMP_ACT_ALLOW));
  if (!ctx) return Error(ErrorCode::kSystem, "seccomp_init failed");
  // Foreign ABIs (i386 int 0x80, x32) would bypass a per-arch filter: kill instead.
  if (int rc = seccomp_attr_set(ctx.get(), SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS); rc < 0) {
    return Error::sys(-rc, "seccomp badarch action");
  }
  // A binary search over syscall numbers instead of a linear list. Besides fewer instructions per syscall,
  // this matters at install time: the kernel emulates the filter for every syscall number to build its
  // allow-cache (with interrupts off), which took ~0.2 ms per install with the linear list — paid by every
  // init and every exec.
  if (int rc = seccomp_attr_set(ctx.get(), SCMP_FLTATR_CTL_OPTIMIZE, 2); rc < 0) {
    return Error::sys(-rc, "seccomp binary-tree optimization");
  }
  for (const char* name : kDenied) {
    int nr = seccomp_syscall_resolve_name(name);
    if (nr == __NR_SCMP_ERROR) continue;  // unknown to this libseccomp/arch
    if (int rc = seccomp_rule_add(ctx.get(), SCMP_ACT_ERRNO(EPERM), nr, 0); rc < 0 && rc != -EEXIST) {
      return Error::sys(-rc, std::string("seccomp rule for ") + name);
    }
  }
  // clone3 passes flags in memory the filter cannot read: ENOSYS makes glibc fall back to clone.
  int clone3_nr = seccomp_syscall_resolve_name("clone3");
  if (clone3_nr != __NR_SCMP_ERROR) {
    if (int rc = seccomp_rule_add(ctx.get(), SCMP_ACT_ERRNO(ENOSYS), clone3_nr, 0); rc < 0) {
      return Error::sys(-rc, "seccomp rule for clone3");
    }
  }
  // Native AIO contexts come out of one node-wide budget (fs.aio-max-nr, not per namespace, user or cgroup): a
  // sandbox that took it all left every other process on the node, host root included, with EAGAIN. ENOSYS reads as
  // a kernel built without AIO, which portable callers handle (POSIX AIO in libc uses threads, not this).
  int io_setup_nr = seccomp_syscall_resolve_name("io_setup");
  if (io_setup_nr != __NR_SCMP_ERROR) {
    if (int rc = seccomp_rule_add(ctx.get(), SCMP_ACT_ERRNO(ENOSYS), io_setup_nr, 0); rc < 0) {
      return Error::sys(-rc, "seccomp rule for io_setup");
    }
  }
  for (unsigned long flag : kDeniedCloneFlags) {
    if (int rc = seccomp_rule_add(ctx.get(), SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                                  SCMP_A0(SCMP_CMP_MASKED_EQ, flag, flag));
        rc < 0) {
      return Error::sys(-rc, "seccomp rule for clone flags");
    }
  }
  UniqueFd mem(memfd_create("dsec-seccomp", MFD_CLOEXEC));
  if (!mem) return Error::sys(errno, "memfd_create");
  if (int rc = seccomp_export_bpf(ctx.get(), mem.get()); rc < 0) return Error::sys(-rc, "seccomp_export_bpf");
  off_t size = lseek(mem.get(), 0, SEEK_END);
  if (size <= 0 || size % sizeof(sock_filter) != 0) return Error::internal("seccomp export has a bad size");
  std::vector<sock_filter> prog(static_cast<size_t>(size) / sizeof(sock_filter));
  if (pread(mem.get(), prog.data(), static_cast<size_t>(size), 0) != size) return Error::sys(errno, "read bpf");
  return prog;
}

}  // namespace dsec::backends
