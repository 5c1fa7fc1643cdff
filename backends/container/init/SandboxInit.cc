// dsec-sandbox-init: PID 1 of every container sandbox. Started by the agent (clone with new pid, uts, ipc
// and network namespaces; often ahead of time, waiting in a pool), it reads its setup from fd 3, joins the
// sandbox's cgroup, unshares its mount namespace,
// builds the sandbox root (overlay of the layers over a size-limited upper, /proc, /dev, pivot_root),
// reports "ok" (or the failed step) on fd 4, and then only reaps orphans until the agent SIGKILLs it.
//
// It is linked statically and written C-style (no heap, no iostreams, no exceptions): a thousand of these
// sit idle on a node, so every private page counts, and a static exec saves ~0.7 ms per create.
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../src/InitProtocol.h"

namespace {

namespace proto = dsec::backends::init_protocol;

struct Config {
  const char* fail_at = "";
  const char* hostname = "sandbox";
  const char* scratch = nullptr;
  const char* lowers[proto::kMaxLowers];
  int nlowers = 0;
  const char* upper_dir = nullptr;
  const char* cgroup_files[proto::kMaxCgroupFiles];
  int ncgroup_files = 0;
  long long disk_bytes = 0;
  bool network_host = false;
  bool read_only_root = false;
  const sock_filter* bpf = nullptr;
  int bpf_len = 0;
};

// Static buffers: zero pages until touched, so an idle init costs only what it used.
char g_config_buf[proto::kMaxConfigBytes];
sock_filter g_bpf[proto::kMaxBpfInstructions];
char g_path[4096];
char g_opts[4096];
Config g_cfg;

size_t appendStr(char* buf, size_t pos, size_t cap, const char* s) {
  while (*s != '\0' && pos + 1 < cap) buf[pos++] = *s++;
  buf[pos] = '\0';
  return pos;
}

size_t appendNum(char* buf, size_t pos, size_t cap, long long v) {
  char tmp[24];
  int n = 0;
  bool neg = v < 0;
  unsigned long long u = neg ? 0ULL - static_cast<unsigned long long>(v) : static_cast<unsigned long long>(v);
  do {
    tmp[n++] = static_cast<char>('0' + u % 10);
    u /= 10;
  } while (u != 0 && n < 22);
  if (neg) tmp[n++] = '-';
  while (n > 0 && pos + 1 < cap) buf[pos++] = tmp[--n];
  buf[pos] = '\0';
  return pos;
}

void writeAll(int fd, const char* data, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, data, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    data += n;
    len -= static_cast<size_t>(n);
  }
}

[[noreturn]] void fail(const char* step, int err, const char* what) {
  char line[1024];
  size_t p = appendStr(line, 0, sizeof line, "err ");
  p = appendStr(line, p, sizeof line, step);
  p = appendStr(line, p, sizeof line, " ");
  p = appendNum(line, p, sizeof line, err);
  p = appendStr(line, p, sizeof line, " ");
  p = appendStr(line, p, sizeof line, what);
  p = appendStr(line, p, sizeof line, "\n");
  writeAll(proto::kStatusFd, line, p);
  _exit(1);
}

// Fails the step if the test harness armed a fault there.
void step(const char* name) {
  if (strcmp(g_cfg.fail_at, name) == 0) fail(name, 0, "injected fault");
}

void check(const char* step_name, int rc, const char* what) {
  if (rc < 0) fail(step_name, errno, what);
}

const char* joinPath(const char* a, const char* b) {
  size_t p = appendStr(g_path, 0, sizeof g_path, a);
  p = appendStr(g_path, p, sizeof g_path, "/");
  appendStr(g_path, p, sizeof g_path, b);
  return g_path;
}

int mkdirIfMissing(const char* path, mode_t mode) {
  if (mkdir(path, mode) == 0 || errno == EEXIST) return 0;
  return -1;
}

void readConfig() {
  size_t used = 0;
  for (;;) {
    if (used >= sizeof g_config_buf - 1) fail("read_config", E2BIG, "config too large");
    ssize_t n = read(proto::kConfigFd, g_config_buf + used, sizeof g_config_buf - 1 - used);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("read_config", errno, "read config");
    if (n == 0) break;
    used += static_cast<size_t>(n);
  }
  close(proto::kConfigFd);
  char* p = g_config_buf;
  char* end = g_config_buf + used;
  while (p < end) {
    char* nl = static_cast<char*>(memchr(p, '\n', static_cast<size_t>(end - p)));
    if (nl == nullptr) fail("read_config", EINVAL, "unterminated config line");
    *nl = '\0';
    char* value = strchr(p, ' ');
    if (value == nullptr) fail("read_config", EINVAL, "config line without value");
    *value++ = '\0';
    if (strcmp(p, "fail_at") == 0) {
      g_cfg.fail_at = value;
    } else if (strcmp(p, "hostname") == 0) {
      g_cfg.hostname = value;
    } else if (strcmp(p, "scratch") == 0) {
      g_cfg.scratch = value;
    } else if (strcmp(p, "lower") == 0) {
      if (g_cfg.nlowers >= proto::kMaxLowers) fail("read_config", E2BIG, "too many layers");
      g_cfg.lowers[g_cfg.nlowers++] = value;
    } else if (strcmp(p, "cgroup") == 0) {
      if (g_cfg.ncgroup_files >= proto::kMaxCgroupFiles) fail("read_config", E2BIG, "too many cgroup files");
      g_cfg.cgroup_files[g_cfg.ncgroup_files++] = value;
    } else if (strcmp(p, "upper_dir") == 0) {
      g_cfg.upper_dir = value;
    } else if (strcmp(p, "disk_bytes") == 0) {
      g_cfg.disk_bytes = 0;
      for (const char* d = value; *d >= '0' && *d <= '9'; ++d) g_cfg.disk_bytes = g_cfg.disk_bytes * 10 + (*d - '0');
    } else if (strcmp(p, "network") == 0) {
      g_cfg.network_host = strcmp(value, "host") == 0;
    } else if (strcmp(p, "read_only_root") == 0) {
      g_cfg.read_only_root = strcmp(value, "1") == 0;
    } else if (strcmp(p, "bpf") == 0) {
      long n = 0;
      for (const char* d = value; *d >= '0' && *d <= '9'; ++d) n = n * 10 + (*d - '0');
      size_t bytes = static_cast<size_t>(n) * sizeof(sock_filter);
      if (n > proto::kMaxBpfInstructions || static_cast<size_t>(end - (nl + 1)) < bytes) {
        fail("read_config", EINVAL, "bad bpf length");
      }
      memcpy(g_bpf, nl + 1, bytes);
      g_cfg.bpf = g_bpf;
      g_cfg.bpf_len = static_cast<int>(n);
      break;  // the filter is the last thing in the config
    }
    p = nl + 1;
  }
  if (g_cfg.scratch == nullptr || g_cfg.nlowers == 0) fail("read_config", EINVAL, "config lacks scratch or lower");
  if (g_cfg.read_only_root && g_cfg.upper_dir != nullptr && g_cfg.upper_dir[0] != '\0') {
    fail("read_config", EINVAL, "read_only_root and upper_dir exclude each other");
  }
  step("read_config");
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
  check("mount_upper", mount("tmpfs", g_cfg.scratch, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m,nr_inodes=64"),
        "mount skeleton tmpfs");
  appendStr(root, 0, sizeof root, joinPath(g_cfg.scratch, "r"));
  check("mount_upper", mkdirIfMissing(root, 0755), "mkdir root");
  appendStr(skel, 0, sizeof skel, joinPath(g_cfg.scratch, "skel"));
  check("mount_upper", mkdirIfMissing(skel, 0755), "mkdir skeleton");
  static const char* const kDirs[] = {"proc", "dev", "tmp", "work", "etc"};
  for (const char* d : kDirs) check("mount_upper", mkdirIfMissing(joinPath(skel, d), 0755), "mkdir skeleton dir");
  check("mount_upper", chmod(joinPath(skel, "tmp"), 01777), "chmod skeleton /tmp");
  if (g_cfg.network_host) {  // bind targets for bindEtc (the root is read-only by then)
    static const char* const kEtcFiles[] = {"etc/resolv.conf", "etc/hosts"};
    for (const char* f : kEtcFiles) ensureFile(joinPath(skel, f));
  }

  step("mount_overlay");
  size_t p = appendStr(g_opts, 0, sizeof g_opts, "lowerdir=");
  p = appendStr(g_opts, p, sizeof g_opts, skel);
  for (int i = g_cfg.nlowers - 1; i >= 0; --i) {  // overlay wants the top layer first
    p = appendStr(g_opts, p, sizeof g_opts, ":");
    p = appendStr(g_opts, p, sizeof g_opts, g_cfg.lowers[i]);
  }
  if (p + 1 >= sizeof g_opts) fail("mount_overlay", E2BIG, "overlay options too long");
  check("mount_overlay", mount("overlay", root, "overlay", MS_RDONLY | MS_NODEV, g_opts), "mount read-only overlay");
  mountWritableTmpfs("mount_overlay", joinPath(root, "tmp"), "1777");
  mountWritableTmpfs("mount_overlay", joinPath(root, "work"), "0755");
  return root;
}

// Mounts the overlay root; returns its path (the directory pivot_root will switch to).
const char* mountRoot() {
  if (g_cfg.read_only_root) return mountReadOnlyRoot();
  static char root[4096];
  static char upper[4096];
  static char work[4096];
  const char* base;
  step("mount_upper");
  if (g_cfg.upper_dir != nullptr && g_cfg.upper_dir[0] != '\0') {
    base = g_cfg.upper_dir;  // a host directory (layer builds capture it); the root goes on the scratch dir
    appendStr(root, 0, sizeof root, g_cfg.scratch);
  } else {
    base = g_cfg.scratch;
    size_t p = appendStr(g_opts, 0, sizeof g_opts, "mode=0755,size=");
    appendNum(g_opts, p, sizeof g_opts, g_cfg.disk_bytes > 0 ? g_cfg.disk_bytes : (1LL << 30));
    check("mount_upper", mount("tmpfs", g_cfg.scratch, "tmpfs", MS_NOSUID | MS_NODEV, g_opts), "mount upper tmpfs");
    appendStr(root, 0, sizeof root, joinPath(g_cfg.scratch, "r"));
    check("mount_upper", mkdirIfMissing(root, 0755), "mkdir root");
  }
  appendStr(upper, 0, sizeof upper, joinPath(base, "upper"));
  appendStr(work, 0, sizeof work, joinPath(base, "work"));
  check("mount_upper", mkdirIfMissing(upper, 0755), "mkdir upper");
  check("mount_upper", mkdirIfMissing(work, 0700), "mkdir work");

  step("mount_overlay");
  size_t p = appendStr(g_opts, 0, sizeof g_opts, "lowerdir=");
  for (int i = g_cfg.nlowers - 1; i >= 0; --i) {  // overlay wants the top layer first
    p = appendStr(g_opts, p, sizeof g_opts, g_cfg.lowers[i]);
    if (i > 0) p = appendStr(g_opts, p, sizeof g_opts, ":");
  }
  p = appendStr(g_opts, p, sizeof g_opts, ",upperdir=");
  p = appendStr(g_opts, p, sizeof g_opts, upper);
  p = appendStr(g_opts, p, sizeof g_opts, ",workdir=");
  p = appendStr(g_opts, p, sizeof g_opts, work);
  if (p + 1 >= sizeof g_opts) fail("mount_overlay", E2BIG, "overlay options too long");
  // nodev: the layers may carry device nodes; the sandbox gets its own minimal /dev.
  check("mount_overlay", mount("overlay", root, "overlay", MS_NODEV, g_opts), "mount overlay");
  return root;
}

void mountDev(const char* root) {
  step("mount_dev");
  char dev[4096];
  appendStr(dev, 0, sizeof dev, joinPath(root, "dev"));
  check("mount_dev", mkdirIfMissing(dev, 0755), "mkdir /dev");
  check("mount_dev", mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=65536k,nr_inodes=4096"),
        "mount /dev tmpfs");
  struct Node {
    const char* name;
    unsigned maj, min;
  };
  static const Node kNodes[] = {{"null", 1, 3},   {"zero", 1, 5},    {"full", 1, 7},
                                {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}};
  for (const Node& n : kNodes) {
    check("mount_dev", mknod(joinPath(dev, n.name), S_IFCHR | 0666, makedev(n.maj, n.min)), "mknod");
  }
  check("mount_dev", mkdir(joinPath(dev, "pts"), 0755), "mkdir /dev/pts");
  check("mount_dev", mkdir(joinPath(dev, "shm"), 01777), "mkdir /dev/shm");
  check("mount_dev",
        mount("devpts", joinPath(dev, "pts"), "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"),
        "mount devpts");
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

// With the host network the sandbox needs the host's resolver and hosts file (read-only).
void bindEtc(const char* root) {
  step("bind_etc");
  if (!g_cfg.network_host) return;
  static const char* const kFiles[] = {"resolv.conf", "hosts"};
  char etc[4096];
  appendStr(etc, 0, sizeof etc, joinPath(root, "etc"));
  check("bind_etc", mkdirIfMissing(etc, 0755), "mkdir /etc");
  for (const char* f : kFiles) {
    char host[256];
    appendStr(host, appendStr(host, 0, sizeof host, "/etc/"), sizeof host, f);
    if (access(host, R_OK) != 0) continue;
    const char* target = joinPath(etc, f);
    ensureFile(target);
    check("bind_etc", mount(host, target, nullptr, MS_BIND, nullptr), "bind /etc file");
    check("bind_etc", mount(nullptr, target, nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY, nullptr),
          "remount /etc file read-only");
  }
}

void loopbackUp() {
  step("loopback");
  if (g_cfg.network_host) return;
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  check("loopback", fd, "socket");
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  memcpy(ifr.ifr_name, "lo", 3);
  check("loopback", ioctl(fd, SIOCGIFFLAGS, &ifr), "SIOCGIFFLAGS lo");
  ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP | IFF_RUNNING);
  check("loopback", ioctl(fd, SIOCSIFFLAGS, &ifr), "SIOCSIFFLAGS lo");
  close(fd);
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

void installSeccomp() {
  step("seccomp");
  if (g_cfg.bpf_len == 0) return;
  check("seccomp", prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs");
  sock_fprog prog;
  prog.len = static_cast<unsigned short>(g_cfg.bpf_len);
  prog.filter = const_cast<sock_filter*>(g_cfg.bpf);
  check("seccomp", prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0), "install seccomp filter");
}

// After setup init needs no privilege at all: a process that reaches it (ptrace from inside) gains nothing.
void dropCaps() {
  step("drop_caps");
  // The memory cgroup's OOM killer must pick a workload process, never the init holding the sandbox.
  int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (fd >= 0) {
    writeAll(fd, "-1000", 5);
    close(fd);
  }
  for (int cap = 0; cap <= 63; ++cap) {
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0) {
      if (errno == EINVAL) break;  // past the kernel's last capability
      fail("drop_caps", errno, "capbset drop");
    }
  }
  __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2];
  memset(data, 0, sizeof data);
  check("drop_caps", static_cast<int>(syscall(SYS_capset, &hdr, data)), "capset");
}

[[noreturn]] void reapForever() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  for (;;) {
    while (waitpid(-1, nullptr, WNOHANG | __WALL) > 0) {
    }
    struct timespec ts = {60, 0};  // a backstop: re-scan even if a SIGCHLD was coalesced away
    sigtimedwait(&set, nullptr, &ts);
  }
}

}  // namespace

int main() {
  // The agent clones us with every signal blocked; keep only SIGCHLD blocked (consumed by sigtimedwait).
  // As PID 1 of the namespace, signals without a handler are ignored anyway, SIGKILL from the agent is not.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  sigprocmask(SIG_SETMASK, &set, nullptr);
  umask(0);

  readConfig();
  // Into the sandbox cgroup first: everything init does from here on is charged and limited there. A single
  // thread writing "0" moves just itself (on v1 `tasks` skips the global threadgroup lock).
  step("join_cgroup");
  for (int i = 0; i < g_cfg.ncgroup_files; ++i) {
    int fd = open(g_cfg.cgroup_files[i], O_WRONLY | O_CLOEXEC);
    check("join_cgroup", fd, "open cgroup file");
    if (write(fd, "0", 1) != 1) fail("join_cgroup", errno, "join cgroup");
    close(fd);
  }
  // The mount namespace is made only now, so it copies the host's mounts as they are when the sandbox is
  // created (layers mounted while this init waited in the pool included).
  step("unshare_mount");
  check("unshare_mount", unshare(CLONE_NEWNS), "unshare mount namespace");
  step("unshare_cgroup");
  // The agent put us in the sandbox cgroup before sending the config: this makes it our cgroup root.
  check("unshare_cgroup", unshare(CLONE_NEWCGROUP), "unshare cgroup namespace");
  step("make_private");
  check("make_private", mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr), "make / private");
  const char* root = mountRoot();
  mountDev(root);
  mountProc(root);
  bindEtc(root);
  step("hostname");
  check("hostname", sethostname(g_cfg.hostname, strlen(g_cfg.hostname)), "sethostname");
  loopbackUp();
  pivotInto(root);
  umask(022);
  installSeccomp();
  dropCaps();
  step("ready");
  writeAll(proto::kStatusFd, "ok\n", 3);
  close(proto::kStatusFd);
  reapForever();
}
