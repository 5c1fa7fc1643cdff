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
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "InitSupport.h"

using namespace dsec::backends::sandbox_init;  // init's own parts (InitSupport.h)

namespace {

// Static buffers: zero pages until touched, so an idle init costs only what it used.
char g_config_buf[proto::kMaxConfigBytes];
sock_filter g_bpf[proto::kMaxBpfInstructions];

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
    } else if (strcmp(p, "nameserver") == 0) {
      g_cfg.nameserver = value;
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
