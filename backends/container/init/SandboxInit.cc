// dsec-sandbox-init: PID 1 of every container sandbox (InitProtocol.h has the protocol). The agent execs it as a
// plain child; as stage 1 it makes the sandbox's user namespace (root mapped to the sandbox's own host id range by
// the agent), pid, uts, ipc and network namespaces, clones the sandbox's PID 1 as the agent's child and exits. PID 1
// (stage 2, often waiting in a pool) reads its setup from fd 3: the layers arrive as detached (idmapped) mounts, so
// nothing of the host's layer tree is needed. It unshares its mount and cgroup namespaces, builds the sandbox root
// (overlay of the layers over a size-limited upper, /proc, /dev, pivot_root), drops every capability, makes itself
// undumpable, reports "ok" (or the failed step) on fd 4, and then only reaps orphans until the agent SIGKILLs it.
//
// It is linked statically and written C-style (no heap, no iostreams, no exceptions): a thousand of these
// sit idle on a node, so every private page counts, and a static exec saves ~0.7 ms per create.
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/mount.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <net/route.h>
#include <netinet/in.h>
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
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../src/InitProtocol.h"

namespace {

namespace proto = dsec::backends::init_protocol;

// Terminals one sandbox may hold at once (its devpts instance's max=): plenty for shells, tmux and test harnesses.
constexpr int kMaxPtys = 128;

enum class Network { kNone, kEgress, kHost };

struct Config {
  const char* fail_at = "";
  const char* hostname = "sandbox";
  const char* scratch = nullptr;
  int nlowers = 0;         // the first nlowers received fds: layer mounts, bottom first
  bool has_upper = false;  // the next received fd: the host directory holding upper/ and work/
  long long disk_bytes = 0;
  Network network = Network::kNone;
  bool read_only_root = false;
  const char* egress_address = nullptr;  // network egress: eth0's address, the node end, the netmask
  const char* egress_gateway = nullptr;
  const char* egress_netmask = nullptr;
  const sock_filter* bpf = nullptr;
  int bpf_len = 0;
};

// Static buffers: zero pages until touched, so an idle init costs only what it used.
char g_config_buf[proto::kMaxConfigBytes];
sock_filter g_bpf[proto::kMaxBpfInstructions];
int g_fds[proto::kMaxLowers + 1];
int g_nfds = 0;
char g_path[4096];
char g_opts[8192];
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

long long parseNumber(const char* value) {
  long long n = 0;
  for (const char* d = value; *d >= '0' && *d <= '9'; ++d) n = n * 10 + (*d - '0');
  return n;
}

// Reads the whole config from the socket until the agent shuts its end down, collecting the mounts it passes.
size_t receiveConfig() {
  size_t used = 0;
  for (;;) {
    if (used >= sizeof g_config_buf - 1) fail("read_config", E2BIG, "config too large");
    iovec iov = {g_config_buf + used, sizeof g_config_buf - 1 - used};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * (proto::kMaxLowers + 1))];
    msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t n = recvmsg(proto::kConfigFd, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("read_config", errno, "read config");
    if ((msg.msg_flags & MSG_CTRUNC) != 0) fail("read_config", E2BIG, "too many mounts passed");
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        if (g_nfds >= proto::kMaxLowers + 1) fail("read_config", E2BIG, "too many mounts passed");
        memcpy(&g_fds[g_nfds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      }
    }
    if (n == 0) break;
    used += static_cast<size_t>(n);
  }
  if (used == 0) _exit(0);  // the agent went away before it had a sandbox for us: nothing to report to
  close(proto::kConfigFd);
  return used;
}

void readConfig() {
  size_t used = receiveConfig();
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
    } else if (strcmp(p, "lowers") == 0) {
      g_cfg.nlowers = static_cast<int>(parseNumber(value));
    } else if (strcmp(p, "upper_fd") == 0) {
      g_cfg.has_upper = strcmp(value, "1") == 0;
    } else if (strcmp(p, "disk_bytes") == 0) {
      g_cfg.disk_bytes = parseNumber(value);
    } else if (strcmp(p, "network") == 0) {
      if (strcmp(value, "none") == 0) {
        g_cfg.network = Network::kNone;
      } else if (strcmp(value, "egress") == 0) {
        g_cfg.network = Network::kEgress;
      } else if (strcmp(value, "host") == 0) {
        g_cfg.network = Network::kHost;
      } else {
        fail("read_config", EINVAL, "unknown network mode");
      }
    } else if (strcmp(p, "egress") == 0) {
      // "ADDRESS GATEWAY NETMASK"
      g_cfg.egress_address = value;
      char* gw = strchr(value, ' ');
      if (gw == nullptr) fail("read_config", EINVAL, "egress wants address, gateway and netmask");
      *gw++ = '\0';
      char* mask = strchr(gw, ' ');
      if (mask == nullptr) fail("read_config", EINVAL, "egress wants address, gateway and netmask");
      *mask++ = '\0';
      g_cfg.egress_gateway = gw;
      g_cfg.egress_netmask = mask;
    } else if (strcmp(p, "read_only_root") == 0) {
      g_cfg.read_only_root = strcmp(value, "1") == 0;
    } else if (strcmp(p, "bpf") == 0) {
      long long n = parseNumber(value);
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
  if (g_cfg.scratch == nullptr || g_cfg.nlowers <= 0) fail("read_config", EINVAL, "config lacks scratch or lowers");
  if (g_cfg.nlowers + (g_cfg.has_upper ? 1 : 0) != g_nfds) fail("read_config", EINVAL, "mounts do not match config");
  if (g_cfg.read_only_root && g_cfg.has_upper)
    fail("read_config", EINVAL, "read_only_root and an upper dir exclude each other");
  if ((g_cfg.network == Network::kEgress) != (g_cfg.egress_address != nullptr)) {
    fail("read_config", EINVAL, "network egress needs its addresses (and only it)");
  }
  step("read_config");
}

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
  return root;
}

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

// A sandbox with a network needs a resolver and a hosts file: the host's, read-only.
void bindEtc(const char* root) {
  step("bind_etc");
  if (g_cfg.network == Network::kNone) return;
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
    check("bind_etc", mount(nullptr, target, nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, nullptr),
          "remount /etc file read-only");
  }
}

bool parseIp(const char* text, in_addr* out) { return inet_pton(AF_INET, text, out) == 1; }

void setAddress(int fd, unsigned long request, const char* ifname, const char* text) {
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  strncpy(ifr.ifr_name, ifname, IFNAMSIZ - 1);
  auto* sin = reinterpret_cast<sockaddr_in*>(&ifr.ifr_addr);
  sin->sin_family = AF_INET;
  if (!parseIp(text, &sin->sin_addr)) fail("egress", EINVAL, "bad address");
  check("egress", ioctl(fd, request, &ifr), "set address of eth0");
}

// Network egress: eth0 (the agent made it, the node end is the gateway) gets its address and the default route.
void egressUp() {
  step("egress");
  if (g_cfg.network != Network::kEgress) return;
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  check("egress", fd, "socket");
  setAddress(fd, SIOCSIFADDR, "eth0", g_cfg.egress_address);
  setAddress(fd, SIOCSIFNETMASK, "eth0", g_cfg.egress_netmask);
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  memcpy(ifr.ifr_name, "eth0", 5);
  check("egress", ioctl(fd, SIOCGIFFLAGS, &ifr), "SIOCGIFFLAGS eth0");
  ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP | IFF_RUNNING);
  check("egress", ioctl(fd, SIOCSIFFLAGS, &ifr), "SIOCSIFFLAGS eth0");
  struct rtentry route;
  memset(&route, 0, sizeof route);
  auto* dst = reinterpret_cast<sockaddr_in*>(&route.rt_dst);
  auto* gw = reinterpret_cast<sockaddr_in*>(&route.rt_gateway);
  auto* mask = reinterpret_cast<sockaddr_in*>(&route.rt_genmask);
  dst->sin_family = gw->sin_family = mask->sin_family = AF_INET;
  if (!parseIp(g_cfg.egress_gateway, &gw->sin_addr)) fail("egress", EINVAL, "bad gateway");
  route.rt_flags = RTF_UP | RTF_GATEWAY;
  char dev[] = "eth0";
  route.rt_dev = dev;
  check("egress", ioctl(fd, SIOCADDRT, &route), "add the default route");
  close(fd);
}

void loopbackUp() {
  step("loopback");
  if (g_cfg.network == Network::kHost) return;
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

// After setup init needs no privilege at all, and nothing inside may read or steer it: with no capabilities and
// undumpable, a sandbox process (whose capabilities never include CAP_SYS_PTRACE) cannot ptrace it or open its
// /proc files, so the lease fd it holds and what it read stay out of reach.
void dropCaps() {
  step("drop_caps");
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
  check("drop_caps", prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "make init undumpable");
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

// Reads one byte of the handshake; EOF means the agent is gone.
void awaitMapped() {
  char c = 0;
  ssize_t n;
  do {
    n = read(proto::kConfigFd, &c, 1);
  } while (n < 0 && errno == EINTR);
  if (n == 0) _exit(0);
  if (n < 0) fail("userns", errno, "wait for id maps");
  if (c != proto::kMappedByte) fail("userns", EPROTO, "unexpected handshake byte");
}

// Stage 1: makes the sandbox's namespaces and clones its PID 1 (the agent's child, by CLONE_PARENT); returns in
// that child only. owner >= 0: the user namespace is made by that host id (the root of the sandbox's range), so the
// kernel's per-user counts of everything inside (inotify instances, namespaces, message queues) are charged to the
// sandbox's own id, never to host root.
void makeNamespaces(bool userns, long long owner, bool netns) {
  // The memory cgroup's OOM killer must pick a workload process, never the init holding the sandbox. Written while
  // still root of the host: from inside a user namespace lowering it is refused.
  int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (fd >= 0) {
    writeAll(fd, "-1000", 5);
    close(fd);
  }
  if (userns) {
    if (owner >= 0) {
      check("userns", setgroups(0, nullptr), "drop supplementary groups");
      check("userns", setresgid(static_cast<gid_t>(owner), static_cast<gid_t>(owner), static_cast<gid_t>(owner)),
            "take the sandbox's host gid");
      check("userns", setresuid(static_cast<uid_t>(owner), static_cast<uid_t>(owner), static_cast<uid_t>(owner)),
            "take the sandbox's host uid");
    }
    check("userns", unshare(CLONE_NEWUSER), "unshare user namespace");
    writeAll(proto::kStatusFd, "userns\n", 7);
    awaitMapped();
    check("userns", setresgid(0, 0, 0), "become group root of the user namespace");
    check("userns", setgroups(0, nullptr), "drop supplementary groups");
    check("userns", setresuid(0, 0, 0), "become root of the user namespace");
  }
  // Owned by the new user namespace: its root may mount /proc, set the hostname, bring up loopback.
  check("namespaces", unshare(CLONE_NEWPID | CLONE_NEWUTS | CLONE_NEWIPC | (netns ? CLONE_NEWNET : 0)),
        "unshare pid, uts, ipc and net namespaces");
  // The first process made after unsharing the pid namespace is its PID 1.
  long child = syscall(SYS_clone, CLONE_PARENT | SIGCHLD, nullptr, nullptr, nullptr, 0);
  check("clone_init", static_cast<int>(child), "clone PID 1");
  if (child == 0) return;
  char line[64];
  size_t p = appendStr(line, 0, sizeof line, "init ");
  p = appendNum(line, p, sizeof line, child);
  p = appendStr(line, p, sizeof line, "\n");
  writeAll(proto::kStatusFd, line, p);
  _exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  // The agent starts us with every signal blocked; keep only SIGCHLD blocked (consumed by sigtimedwait).
  // As PID 1 of the namespace, signals without a handler are ignored anyway, SIGKILL from the agent is not.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  sigprocmask(SIG_SETMASK, &set, nullptr);
  umask(0);
  if (argc != 3) fail("args", EINVAL, "usage: dsec-sandbox-init userns=HOSTID|userns=root|nouserns netns|hostnet");
  const bool userns = strncmp(argv[1], "userns=", 7) == 0;
  const long long owner = userns && strcmp(argv[1] + 7, "root") != 0 ? parseNumber(argv[1] + 7) : -1;
  makeNamespaces(userns, owner, strcmp(argv[2], "netns") == 0);

  readConfig();
  // The mount namespace is made only now, so it copies the host's mounts as they are when the sandbox is
  // created (the device nodes and /etc files it binds); the layers come as detached mounts.
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
  egressUp();
  pivotInto(root);
  umask(022);
  installSeccomp();
  dropCaps();
  step("ready");
  writeAll(proto::kStatusFd, "ok\n", 3);
  close(proto::kStatusFd);
  reapForever();
}
