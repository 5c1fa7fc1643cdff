// dsec-sandbox-init: the sandbox's root file system. An overlay of the layers the agent passed (over a size-limited
// upper, or read-only), /dev, /proc and the host's resolver files, then pivot_root into it.
#include <errno.h>
#include <fcntl.h>
#include <linux/mount.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "InitSupport.h"

namespace dsec::backends::sandbox_init {
namespace {

// Terminals one sandbox may hold at once (its devpts instance's max=): plenty for shells, tmux and test harnesses.
constexpr int kMaxPtys = 128;

// Attaches a mount the agent passed (a detached tree, idmapped to this sandbox's user namespace) at dir.
void attachMount(const char* step_name, int fd, const char* dir) {
  check(step_name, mkdirIfMissing(dir, 0755), "mkdir mount point");
  check(step_name, static_cast<int>(syscall(SYS_move_mount, fd, "", AT_FDCWD, dir, MOVE_MOUNT_F_EMPTY_PATH)),
        "attach layer mount");
  close(fd);
}

// Attaches the layers at <scratch>/l<i> and appends "<top>:...:<bottom>" to g_opts at pos.
size_t attachLowers(const char* step_name, size_t pos) {
  static char dir[64];
  for (int i = 0; i < g_cfg.nlowers; ++i) {
    size_t p = appendStr(dir, 0, sizeof dir, "l");
    appendNum(dir, p, sizeof dir, i);
    attachMount(step_name, g_fds[i], joinPath(g_cfg.scratch, dir));
  }
  for (int i = g_cfg.nlowers - 1; i >= 0; --i) {  // overlay wants the top layer first
    pos = appendStr(g_opts, pos, sizeof g_opts, g_cfg.scratch);
    pos = appendStr(g_opts, pos, sizeof g_opts, "/l");
    pos = appendNum(g_opts, pos, sizeof g_opts, i);
    if (i > 0) pos = appendStr(g_opts, pos, sizeof g_opts, ":");
  }
  return pos;
}

void ensureFile(const char* path) {
  int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd >= 0) close(fd);
}

// The writable tmpfs of a read-only root (size-limited: disk_bytes each; the memory cgroup caps the sum).
void mountWritableTmpfs(const char* step_name, const char* dir, const char* mode) {
  size_t p = appendStr(g_opts, 0, sizeof g_opts, "mode=");
  p = appendStr(g_opts, p, sizeof g_opts, mode);
  p = appendStr(g_opts, p, sizeof g_opts, ",size=");
  appendNum(g_opts, p, sizeof g_opts, g_cfg.disk_bytes > 0 ? g_cfg.disk_bytes : (1LL << 30));
  check(step_name, mount("tmpfs", dir, "tmpfs", MS_NOSUID | MS_NODEV, g_opts), "mount writable tmpfs");
}

// read_only_root: no upper at all. The layers are stacked under a tiny skeleton layer that only provides the
// mount points (/proc, /dev, /tmp, /work; the image need not have them), mounted read-only; /tmp and /work
// are size-limited tmpfs (and /dev/shm, in mountDev). Nothing outside those survives what a process writes.
const char* mountReadOnlyRoot() {
  static char root[4096];
  static char skel[4096];
  step("mount_upper");
  check("mount_upper", mount("tmpfs", g_cfg.scratch, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m,nr_inodes=256"),
        "mount skeleton tmpfs");
  appendStr(root, 0, sizeof root, joinPath(g_cfg.scratch, "r"));
  check("mount_upper", mkdirIfMissing(root, 0755), "mkdir root");
  appendStr(skel, 0, sizeof skel, joinPath(g_cfg.scratch, "skel"));
  check("mount_upper", mkdirIfMissing(skel, 0755), "mkdir skeleton");
  static const char* const kDirs[] = {"proc", "dev", "tmp", "work", "etc"};
  for (const char* d : kDirs) check("mount_upper", mkdirIfMissing(joinPath(skel, d), 0755), "mkdir skeleton dir");
  check("mount_upper", chmod(joinPath(skel, "tmp"), 01777), "chmod skeleton /tmp");
  if (g_cfg.network != Network::kNone) {  // bind targets for bindEtc (the root is read-only by then)
    static const char* const kEtcFiles[] = {"etc/resolv.conf", "etc/hosts"};
    for (const char* f : kEtcFiles) ensureFile(joinPath(skel, f));
  }

  step("mount_overlay");
  size_t p = appendStr(g_opts, 0, sizeof g_opts, "userxattr,lowerdir=");
  p = appendStr(g_opts, p, sizeof g_opts, skel);
  p = appendStr(g_opts, p, sizeof g_opts, ":");
  p = attachLowers("mount_overlay", p);
  if (p + 1 >= sizeof g_opts) fail("mount_overlay", E2BIG, "overlay options too long");
  check("mount_overlay", mount("overlay", root, "overlay", MS_RDONLY | MS_NODEV | MS_NOSUID, g_opts),
        "mount read-only overlay");
  mountWritableTmpfs("mount_overlay", joinPath(root, "tmp"), "1777");
  mountWritableTmpfs("mount_overlay", joinPath(root, "work"), "0755");
  return root;
}

}  // namespace

// Mounts the overlay root; returns its path (the directory pivot_root will switch to). The upper is the scratch
// tmpfs (its size is the disk quota), or, for layer builds, the host directory the agent passed.
const char* mountRoot() {
  if (g_cfg.read_only_root) return mountReadOnlyRoot();
  static char root[4096];
  static char base[4096];
  static char upper[4096];
  static char work[4096];
  step("mount_upper");
  size_t p = appendStr(g_opts, 0, sizeof g_opts, "mode=0755,size=");
  appendNum(g_opts, p, sizeof g_opts,
            g_cfg.has_upper        ? (1LL << 20)
            : g_cfg.disk_bytes > 0 ? g_cfg.disk_bytes
                                   : (1LL << 30));
  check("mount_upper", mount("tmpfs", g_cfg.scratch, "tmpfs", MS_NOSUID | MS_NODEV, g_opts), "mount upper tmpfs");
  appendStr(root, 0, sizeof root, joinPath(g_cfg.scratch, "r"));
  check("mount_upper", mkdirIfMissing(root, 0755), "mkdir root");
  if (g_cfg.has_upper) {
    appendStr(base, 0, sizeof base, joinPath(g_cfg.scratch, "u"));
    attachMount("mount_upper", g_fds[g_cfg.nlowers], base);
  } else {
    appendStr(base, 0, sizeof base, g_cfg.scratch);
  }
  appendStr(upper, 0, sizeof upper, joinPath(base, "upper"));
  appendStr(work, 0, sizeof work, joinPath(base, "work"));
  check("mount_upper", mkdirIfMissing(upper, 0755), "mkdir upper");
  check("mount_upper", mkdirIfMissing(work, 0700), "mkdir work");

  step("mount_overlay");
  // userxattr: overlay keeps its opaque-directory marks in user.overlay.* xattrs, which a user namespace may
  // write; layers captured from an upper carry them the same way whoever mounted the overlay.
  p = appendStr(g_opts, 0, sizeof g_opts, "userxattr,lowerdir=");
  p = attachLowers("mount_overlay", p);
  p = appendStr(g_opts, p, sizeof g_opts, ",upperdir=");
  p = appendStr(g_opts, p, sizeof g_opts, upper);
  p = appendStr(g_opts, p, sizeof g_opts, ",workdir=");
  p = appendStr(g_opts, p, sizeof g_opts, work);
  if (p + 1 >= sizeof g_opts) fail("mount_overlay", E2BIG, "overlay options too long");
  // nosuid: a setuid file in a layer or the upper never raises privilege; nodev: the layers may carry device
  // nodes; the sandbox gets its own minimal /dev.
  check("mount_overlay", mount("overlay", root, "overlay", MS_NODEV | MS_NOSUID, g_opts), "mount overlay");
  // Kept open (every layer's fd is closed by now, so kUpperFd is free) for the agent's snapshots (it takes a copy with
  // pidfd_getfd): after pivot_root the upper is reachable by no path, and init is undumpable, so nothing inside the
  // sandbox can reach this fd.
  int upper_fd = open(upper, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  check("mount_overlay", upper_fd, "open upper");
  if (upper_fd != proto::kUpperFd) {
    check("mount_overlay", dup3(upper_fd, proto::kUpperFd, O_CLOEXEC), "keep upper fd");
    close(upper_fd);
  }
  return root;
}

namespace {

// Makes path (a new empty file) the host's device node src, by a bind mount: a user namespace may not mknod.
void bindDevice(const char* path, const char* src) {
  int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
  check("mount_dev", fd, "create device mount point");
  close(fd);
  check("mount_dev", mount(src, path, nullptr, MS_BIND, nullptr), "bind device node");
  // A device node must keep working (no nodev), but nothing on it is a program.
  check("mount_dev", mount(nullptr, path, nullptr, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NOEXEC, nullptr),
        "remount device node nosuid");
}

}  // namespace

void mountDev(const char* root) {
  step("mount_dev");
  char dev[4096];
  appendStr(dev, 0, sizeof dev, joinPath(root, "dev"));
  check("mount_dev", mkdirIfMissing(dev, 0755), "mkdir /dev");
  check("mount_dev", mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=65536k,nr_inodes=4096"),
        "mount /dev tmpfs");
  static const char* const kNodes[] = {"null", "zero", "full", "random", "urandom", "tty"};
  char src[64];
  for (const char* n : kNodes) {
    appendStr(src, appendStr(src, 0, sizeof src, "/dev/"), sizeof src, n);
    bindDevice(joinPath(dev, n), src);
  }
  check("mount_dev", mkdir(joinPath(dev, "pts"), 0755), "mkdir /dev/pts");
  check("mount_dev", mkdir(joinPath(dev, "shm"), 01777), "mkdir /dev/shm");
  // max: every devpts instance but the host's draws from one node-wide pool (kernel.pty.max less pty.reserve, 3072
  // by default); without a cap one sandbox took all of it and no other sandbox could open a terminal.
  appendNum(g_opts, appendStr(g_opts, 0, sizeof g_opts, "newinstance,ptmxmode=0666,mode=0620,max="), sizeof g_opts,
            kMaxPtys);
  check("mount_dev", mount("devpts", joinPath(dev, "pts"), "devpts", MS_NOSUID | MS_NOEXEC, g_opts), "mount devpts");
  if (g_cfg.read_only_root) {
    // Its own size-limited /dev/shm, and the ipc namespace's POSIX message queues made visible, so whoever
    // runs work in turns (fncall) can list and remove what one turn left there.
    mountWritableTmpfs("mount_dev", joinPath(dev, "shm"), "1777");
    check("mount_dev", mkdir(joinPath(dev, "mqueue"), 0755), "mkdir /dev/mqueue");
    check("mount_dev", mount("mqueue", joinPath(dev, "mqueue"), "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr),
          "mount /dev/mqueue");
  }
  static const char* const kLinks[][2] = {{"pts/ptmx", "ptmx"},
                                          {"/proc/self/fd", "fd"},
                                          {"/proc/self/fd/0", "stdin"},
                                          {"/proc/self/fd/1", "stdout"},
                                          {"/proc/self/fd/2", "stderr"}};
  for (const auto& l : kLinks) check("mount_dev", symlink(l[0], joinPath(dev, l[1])), "symlink in /dev");
}

void mountProc(const char* root) {
  step("mount_proc");
  char proc[4096];
  appendStr(proc, 0, sizeof proc, joinPath(root, "proc"));
  check("mount_proc", mkdirIfMissing(proc, 0555), "mkdir /proc");
  check("mount_proc", mount("proc", proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr), "mount /proc");

  step("mask_proc");
  // Files that leak host state or act on the host (sysrq-trigger reboots it): hide behind /dev/null.
  static const char* const kMasked[] = {"kcore", "kpagecgroup", "kpagecount",   "kpageflags",
                                        "keys",  "timer_list",  "sysrq-trigger"};
  char null_path[4096];
  appendStr(null_path, 0, sizeof null_path, joinPath(root, "dev/null"));
  for (const char* m : kMasked) {
    const char* target = joinPath(proc, m);
    if (access(target, F_OK) != 0) continue;  // not in this kernel
    check("mask_proc", mount(null_path, target, nullptr, MS_BIND, nullptr), "mask /proc file");
    check("mask_proc", mount(nullptr, target, nullptr, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NOEXEC, nullptr),
          "remount masked /proc file nosuid");
  }
  // Kernel-wide knobs: /proc/sys writes as root would change the host (core_pattern...), so read-only.
  static const char* const kReadOnly[] = {"sys", "irq", "bus"};
  for (const char* r : kReadOnly) {
    const char* target = joinPath(proc, r);
    if (access(target, F_OK) != 0) continue;
    check("mask_proc", mount(target, target, nullptr, MS_BIND | MS_REC, nullptr), "bind /proc dir");
    check("mask_proc",
          mount(nullptr, target, nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr),
          "remount /proc dir read-only");
  }
}

namespace {

// /etc/resolv.conf naming only the node's resolver for sandboxes, written on the scratch tmpfs (outside the root,
// gone with the mount namespace) for bindEtc to bind: "nameserver ADDRESS\n".
const char* writeResolvConf() {
  static char path[4096];
  static char text[128];
  appendStr(path, 0, sizeof path, joinPath(g_cfg.scratch, "resolv.conf"));
  size_t n = appendStr(text, 0, sizeof text, "nameserver ");
  n = appendStr(text, n, sizeof text, g_cfg.nameserver);
  n = appendStr(text, n, sizeof text, "\n");
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  check("bind_etc", fd, "create resolv.conf");
  writeAll(fd, text, n);
  close(fd);
  return path;
}

}  // namespace

// A sandbox with a network needs a resolver and a hosts file: the node's hosts file read-only, and for egress a
// resolv.conf naming the node's resolver for sandboxes (else the host's).
void bindEtc(const char* root) {
  step("bind_etc");
  if (g_cfg.network == Network::kNone) return;
  static const char* const kFiles[] = {"resolv.conf", "hosts"};
  char etc[4096];
  appendStr(etc, 0, sizeof etc, joinPath(root, "etc"));
  check("bind_etc", mkdirIfMissing(etc, 0755), "mkdir /etc");
  const char* generated = g_cfg.nameserver != nullptr ? writeResolvConf() : nullptr;
  for (const char* f : kFiles) {
    char host[4096];
    if (generated != nullptr && strcmp(f, "resolv.conf") == 0) {
      appendStr(host, 0, sizeof host, generated);
    } else {
      appendStr(host, appendStr(host, 0, sizeof host, "/etc/"), sizeof host, f);
    }
    if (access(host, R_OK) != 0) continue;
    const char* target = joinPath(etc, f);
    ensureFile(target);
    check("bind_etc", mount(host, target, nullptr, MS_BIND, nullptr), "bind /etc file");
    check("bind_etc", mount(nullptr, target, nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, nullptr),
          "remount /etc file read-only");
  }
}

void pivotInto(const char* root) {
  step("pivot_root");
  char tmp[4096];
  appendStr(tmp, 0, sizeof tmp, joinPath(root, "tmp"));
  check("pivot_root", mkdirIfMissing(tmp, 01777), "mkdir /tmp");
  check("pivot_root", chdir(root), "chdir new root");
  // pivot_root(".", ".") stacks the old root on top of the new one; detaching it leaves only the new root.
  check("pivot_root", static_cast<int>(syscall(SYS_pivot_root, ".", ".")), "pivot_root");
  check("pivot_root", umount2(".", MNT_DETACH), "detach old root");
  check("pivot_root", chdir("/"), "chdir /");
}

}  // namespace dsec::backends::sandbox_init
