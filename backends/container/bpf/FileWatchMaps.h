/* The file watch's maps and events as both sides see them: the BPF programs (filewatch.bpf.c) and the agent
 * (FileWatch.cc). Plain C, fixed-width. */
#pragma once

#include <linux/types.h>

/* The file-changing calls the programs watch, named as the syscalls (the agent's names come from this list). */
/* clang-format off */
#define DSEC_FW_CALLS(X)                                                                                              \
  X(open) X(openat) X(openat2) X(creat) X(truncate) X(unlink) X(unlinkat) X(rmdir) X(mkdir) X(mkdirat) X(mknod)      \
  X(mknodat) X(rename) X(renameat) X(renameat2) X(link) X(linkat) X(symlink) X(symlinkat) X(chmod) X(fchmod)         \
  X(fchmodat) X(fchmodat2) X(chown) X(lchown) X(fchown) X(fchownat) X(utime) X(utimes) X(futimesat) X(utimensat)     \
  X(setxattr) X(lsetxattr) X(fsetxattr) X(setxattrat) X(removexattr) X(lremovexattr) X(fremovexattr)                \
  X(removexattrat) X(umount)
/* clang-format on */

#define DSEC_FW_ENUM(name) DSEC_FW_##name,
enum dsec_fw_call { DSEC_FW_CALLS(DSEC_FW_ENUM) DSEC_FW_CALL_COUNT };
#undef DSEC_FW_ENUM

#define DSEC_FW_PATH_MAX 256
/* At most this many events per sandbox per second leave the kernel; the rest are counted (rate bound). */
#define DSEC_FW_EVENTS_PER_SECOND 64

/* A watched sandbox, keyed by its mount namespace's inode number: the rate bound's state. */
struct dsec_fw_sandbox {
  __u64 window_start_ns;
  __u32 sent;       /* events sent in the current one-second window */
  __u32 suppressed; /* refusals not sent since the last event (added atomically; the hand-over may miss a racing few) */
};

/* A watched call between its entry and its exit, keyed by pid_tgid. */
struct dsec_fw_pending {
  __u64 path[2]; /* user pointers; 0 = none */
  __s32 dirfd[2];
  __u32 mntns;
  __u32 flags; /* open flags (open, openat, openat2), else 0 */
  __u16 call;  /* enum dsec_fw_call */
  __u16 pad[3];
};

/* One refused call, to the agent through the ring buffer. */
struct dsec_fw_event {
  __u64 time_boot_ns;
  __u32 mntns;
  __u32 tgid;       /* the caller's process id in the initial pid namespace */
  __s32 dirfd[2];   /* AT_FDCWD, or the fd a relative path (or, with no path, the call) works on */
  __s32 error;      /* positive errno */
  __u32 suppressed; /* refusals of this sandbox left out by the rate bound since its previous event */
  __u32 flags;
  __u16 call;
  __u16 pad;
  char path[2][DSEC_FW_PATH_MAX];
};
