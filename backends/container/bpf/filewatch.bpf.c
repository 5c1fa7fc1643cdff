/* The file watch: records which calls of a watched sandbox's processes were refused on a file (docs/security.md,
 * "Violations"). Per-syscall tracepoints (syscalls/sys_enter_<call>, sys_exit_<call>) fire only for the calls listed
 * in FileWatchMaps.h, so every other syscall of the node pays nothing but the kernel's one bit test for an
 * unwatched syscall event.
 *
 * Whose call: a watched sandbox is named by its mount namespace (the namespace its protected paths are mounts in).
 * A sandbox's processes cannot leave it: the seccomp filter refuses unshare, setns and new namespaces, and they
 * lack CAP_SYS_ADMIN. The namespace is read from the current task (task->nsproxy->mnt_ns->ns.inum) with CO-RE:
 * the few fields are declared below with preserve_access_index and libbpf relocates them against the running
 * kernel's BTF at load, so no vmlinux.h is needed at build time. (The cgroup id would not do: on a cgroup v1 host
 * every sandbox's commands share one cgroup v2 directory.)
 *
 * Entry: a call that cannot change a file (an open without write, create or truncate flags) returns at once; any
 * other looks its task's namespace up in `sandboxes` and, for a watched one, remembers its path arguments. Exit: a
 * remembered call that failed with EROFS, EXDEV, EBUSY, EPERM or EACCES sends an event with the paths read from the
 * caller's memory; the agent decides whether the path is a protected one. Calls that seccomp refuses (mount and
 * friends) never reach sys_enter, so they are not seen here. */
#include <linux/bpf.h>
#include <linux/errno.h>
#include <linux/fcntl.h>
/* after linux/bpf.h, whose types they use */
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>

#include "FileWatchMaps.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* The kernel's types, only the fields read here; libbpf finds them by name in the kernel's BTF. */
struct ns_common {
  unsigned int inum;
} __attribute__((preserve_access_index));
struct mnt_namespace {
  struct ns_common ns;
} __attribute__((preserve_access_index));
struct nsproxy {
  struct mnt_namespace *mnt_ns;
} __attribute__((preserve_access_index));
struct task_struct {
  struct nsproxy *nsproxy;
} __attribute__((preserve_access_index));

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 65536);
  __type(key, __u32);
  __type(value, struct dsec_fw_sandbox);
  __uint(map_flags, BPF_F_NO_PREALLOC);
} sandboxes SEC(".maps");

/* LRU: a task killed between entry and exit cannot leave an entry behind for good. */
struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, 16384);
  __type(key, __u64);
  __type(value, struct dsec_fw_pending);
} pending SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_RINGBUF);
  __uint(max_entries, 256 * 1024);
} events SEC(".maps");

/* The layout of every syscalls/sys_enter_* and sys_exit_* record (the tracepoints' format files). */
struct syscall_enter {
  __u64 common;
  __s32 nr;
  __u32 pad;
  __u64 args[6];
};
struct syscall_exit {
  __u64 common;
  __s32 nr;
  __u32 pad;
  __s64 ret;
};

static __always_inline int remember(__u16 call, __s64 dirfd0, __u64 path0, __s64 dirfd1, __u64 path1, __u32 flags) {
  struct task_struct *task = (struct task_struct *)bpf_get_current_task();
  __u32 mntns = BPF_CORE_READ(task, nsproxy, mnt_ns, ns.inum);
  if (!bpf_map_lookup_elem(&sandboxes, &mntns)) return 0; /* not a watched sandbox: the whole node's fast path */
  struct dsec_fw_pending p = {};
  p.path[0] = path0;
  p.path[1] = path1;
  p.dirfd[0] = (__s32)dirfd0;
  p.dirfd[1] = (__s32)dirfd1;
  p.mntns = mntns;
  p.flags = flags;
  p.call = call;
  __u64 id = bpf_get_current_pid_tgid();
  bpf_map_update_elem(&pending, &id, &p, BPF_ANY);
  return 0;
}

static __always_inline int writes(__u64 flags) { return (flags & (O_WRONLY | O_RDWR | O_CREAT | O_TRUNC)) != 0; }

static __always_inline int refused(__s64 ret) {
  return ret == -EROFS || ret == -EXDEV || ret == -EBUSY || ret == -EPERM || ret == -EACCES;
}

/* 1 = send; counts what the rate bound leaves out. The counts are added atomically (one sandbox's calls run on
 * every CPU at once), so a flood cannot lose increments and slip past the bound: between the check and the add at
 * most one call per CPU gets through beyond it. The window's reset and the hand-over of `suppressed` to an event
 * are plain stores: a count may be off by the calls racing them, never the bound. */
static __always_inline int within_rate(struct dsec_fw_sandbox *sb, __u64 now, __u32 *suppressed) {
  if (now - sb->window_start_ns > 1000000000ULL) {
    sb->window_start_ns = now;
    sb->sent = 0;
  }
  if (sb->sent >= DSEC_FW_EVENTS_PER_SECOND) {
    __sync_fetch_and_add(&sb->suppressed, 1);
    return 0;
  }
  __sync_fetch_and_add(&sb->sent, 1);
  *suppressed = sb->suppressed;
  sb->suppressed = 0;
  return 1;
}

static __always_inline void send(const struct dsec_fw_pending *p, __s64 ret) {
  struct dsec_fw_sandbox *sb = bpf_map_lookup_elem(&sandboxes, &p->mntns);
  if (!sb) return; /* unwatched meanwhile */
  __u64 now = bpf_ktime_get_boot_ns();
  __u32 suppressed = 0;
  if (!within_rate(sb, now, &suppressed)) return;
  struct dsec_fw_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
  if (!e) return; /* the agent is behind: the call was refused all the same */
  e->time_boot_ns = now;
  e->mntns = p->mntns;
  e->tgid = bpf_get_current_pid_tgid() >> 32; /* in the initial pid namespace */
  e->dirfd[0] = p->dirfd[0];
  e->dirfd[1] = p->dirfd[1];
  e->error = (__s32)-ret;
  e->suppressed = suppressed;
  e->flags = p->flags;
  e->call = p->call;
  e->pad = 0;
  e->path[0][0] = 0;
  e->path[1][0] = 0;
  if (p->path[0]) bpf_probe_read_user_str(e->path[0], DSEC_FW_PATH_MAX, (const void *)p->path[0]);
  if (p->path[1]) bpf_probe_read_user_str(e->path[1], DSEC_FW_PATH_MAX, (const void *)p->path[1]);
  bpf_ringbuf_submit(e, 0);
}

static __always_inline int finish(struct syscall_exit *ctx) {
  __u64 id = bpf_get_current_pid_tgid();
  struct dsec_fw_pending *found = bpf_map_lookup_elem(&pending, &id);
  if (!found) return 0;
  struct dsec_fw_pending p = *found;
  bpf_map_delete_elem(&pending, &id);
  if (refused(ctx->ret)) send(&p, ctx->ret);
  return 0;
}

#define EXIT(name) \
  SEC("tracepoint/syscalls/sys_exit_" #name) int exit_##name(struct syscall_exit *ctx) { return finish(ctx); }
/* A call with up to two (dirfd, path) pairs; the enter program returns early unless `cond` holds. */
#define WATCH_IF(name, cond, d0, p0, d1, p1, flags)                                         \
  SEC("tracepoint/syscalls/sys_enter_" #name) int enter_##name(struct syscall_enter *ctx) { \
    if (!(cond)) return 0;                                                                  \
    return remember(DSEC_FW_##name, d0, p0, d1, p1, flags);                                 \
  }                                                                                         \
  EXIT(name)
#define A(i) ctx->args[i]
#define CWD AT_FDCWD
/* path at argument i, relative to the working directory */
#define WATCH_PATH(name, i) WATCH_IF(name, 1, CWD, A(i), CWD, 0, 0)
/* path at argument i + 1, relative to the dirfd at argument i */
#define WATCH_AT(name, i) WATCH_IF(name, 1, A(i), A(i + 1), CWD, 0, 0)
/* an fd at argument 0, no path */
#define WATCH_FD(name) WATCH_IF(name, 1, A(0), 0, CWD, 0, 0)

WATCH_IF(open, writes(A(1)), CWD, A(0), CWD, 0, (__u32)A(1))
WATCH_IF(openat, writes(A(2)), A(0), A(1), CWD, 0, (__u32)A(2))

SEC("tracepoint/syscalls/sys_enter_openat2")
int enter_openat2(struct syscall_enter *ctx) {
  __u64 flags = 0; /* struct open_how starts with the flags */
  if (bpf_probe_read_user(&flags, sizeof(flags), (const void *)A(2)) != 0 || !writes(flags)) return 0;
  return remember(DSEC_FW_openat2, A(0), A(1), CWD, 0, (__u32)flags);
}
EXIT(openat2)

WATCH_PATH(creat, 0)
WATCH_PATH(truncate, 0)
WATCH_PATH(unlink, 0)
WATCH_AT(unlinkat, 0)
WATCH_PATH(rmdir, 0)
WATCH_PATH(mkdir, 0)
WATCH_AT(mkdirat, 0)
WATCH_PATH(mknod, 0)
WATCH_AT(mknodat, 0)
WATCH_IF(rename, 1, CWD, A(0), CWD, A(1), 0)
WATCH_IF(renameat, 1, A(0), A(1), A(2), A(3), 0)
WATCH_IF(renameat2, 1, A(0), A(1), A(2), A(3), 0)
WATCH_IF(link, 1, CWD, A(0), CWD, A(1), 0)
WATCH_IF(linkat, 1, A(0), A(1), A(2), A(3), 0)
WATCH_PATH(symlink, 1) /* argument 0 is the link's text, not a path */
WATCH_AT(symlinkat, 1)
WATCH_PATH(chmod, 0)
WATCH_FD(fchmod)
WATCH_AT(fchmodat, 0)
WATCH_AT(fchmodat2, 0)
WATCH_PATH(chown, 0)
WATCH_PATH(lchown, 0)
WATCH_FD(fchown)
WATCH_AT(fchownat, 0)
WATCH_PATH(utime, 0)
WATCH_PATH(utimes, 0)
WATCH_AT(futimesat, 0)
WATCH_AT(utimensat, 0) /* a NULL path: the call works on the dirfd itself */
WATCH_PATH(setxattr, 0)
WATCH_PATH(lsetxattr, 0)
WATCH_FD(fsetxattr)
WATCH_AT(setxattrat, 0)
WATCH_PATH(removexattr, 0)
WATCH_PATH(lremovexattr, 0)
WATCH_FD(fremovexattr)
WATCH_AT(removexattrat, 0)
/* umount2: seccomp refuses it before sys_enter, so it is never seen (the tests check it); watched should a filter
 * ever let it through. */
WATCH_PATH(umount, 0)
