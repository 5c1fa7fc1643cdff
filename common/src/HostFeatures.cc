// Host probes for `dsec doctor`. Each probe tries the real thing in the least invasive way: namespaces and the
// EROFS mount in a forked child (so nothing leaks into this process or the host's mount table), KVM by creating
// and closing a VM, Landlock by asking for its ABI.
#include "dsec/common/HostFeatures.h"

#include <fcntl.h>
#include <linux/kvm.h>
#include <linux/landlock.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "dsec/common/Cgroup.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"

#ifndef SYS_landlock_create_ruleset
#define SYS_landlock_create_ruleset 444
#endif
#ifndef SYS_lsm_list_modules
#define SYS_lsm_list_modules 461  // Linux 6.8; one number on every architecture
#endif

namespace dsec {
namespace {

constexpr uint64_t kLsmIdBpf = 109;  // include/uapi/linux/lsm.h (Debian 12's headers predate it)
constexpr uint64_t kLsmIdLandlock = 110;

std::string errnoText(int err) {
  char buf[128];
  return strerror_r(err, buf, sizeof buf);
}

bool fileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

HostFeature feature(const char* name, const char* why, bool required) {
  HostFeature f;
  f.name = name;
  f.why = why;
  f.required = required;
  return f;
}

void set(HostFeature& f, FeatureState state, std::string detail) {
  f.state = state;
  f.detail = std::move(detail);
}

// Runs body in a forked child and returns its exit status (or -errno if fork failed). The child must only
// make system calls: the caller may have threads.
template <typename Body>
int inChild(Body body) {
  pid_t pid = ::fork();
  if (pid < 0) return -errno;
  if (pid == 0) ::_exit(body());
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 255;
}

void probeNamespace(HostFeature& f, int flag, const char* flag_name, const char* proc_name) {
  if (!fileExists(std::string("/proc/self/ns/") + proc_name)) {
    set(f, FeatureState::kMissing, std::string("/proc/self/ns/") + proc_name + " absent: kernel built without it");
    return;
  }
  int rc = inChild([flag]() { return ::unshare(flag) == 0 ? 0 : errno; });
  if (rc < 0) {
    set(f, FeatureState::kUnknown, "fork: " + errnoText(-rc));
  } else if (rc == 0) {
    set(f, FeatureState::kOk, std::string("unshare(") + flag_name + ") works");
  } else if (rc == EPERM && ::geteuid() != 0) {
    set(f, FeatureState::kUnknown, std::string("unshare(") + flag_name + "): EPERM - not root");
  } else {
    set(f, FeatureState::kMissing, std::string("unshare(") + flag_name + "): " + errnoText(rc));
  }
}

void probeCgroups(HostFeatures& h) {
  auto driver = detectCgroupDriver("dsec");
  h.cgroup_hybrid =
      !fileExists("/sys/fs/cgroup/cgroup.controllers") && fileExists("/sys/fs/cgroup/unified/cgroup.controllers");
  if (!driver.ok()) {
    set(h.cgroups, FeatureState::kMissing, driver.error().message());
    return;
  }
  h.cgroup_version = (*driver)->version();
  std::string detail = (*driver)->describe();
  if (h.cgroup_hybrid) {
    auto unified = readFile("/sys/fs/cgroup/unified/cgroup.controllers");
    std::string controllers = unified.ok() ? trim(*unified) : "";
    detail += "; hybrid: cgroup2 at /sys/fs/cgroup/unified with " +
              (controllers.empty() ? std::string("no controllers") : "controllers: " + controllers);
  }
  set(h.cgroups, FeatureState::kOk, detail);
}

// In /proc/filesystems, or a module that the first mount will load.
void probeFilesystem(HostFeature& f, const std::string& fs, const std::string& module_dir) {
  auto text = readFile("/proc/filesystems");
  if (!text.ok()) {
    set(f, FeatureState::kUnknown, text.error().message());
    return;
  }
  for (const auto& line : split(*text, '\n')) {
    auto fields = split(line, '\t');
    if (!fields.empty() && trim(fields.back()) == fs) {
      set(f, FeatureState::kOk, "in /proc/filesystems");
      return;
    }
  }
  struct utsname u;
  if (::uname(&u) == 0 && fileExists(std::string("/lib/modules/") + u.release + "/kernel/fs/" + module_dir)) {
    set(f, FeatureState::kOk, "kernel module present (loads on first mount)");
    return;
  }
  set(f, FeatureState::kMissing, "not in /proc/filesystems and no kernel module");
}

void probeErofsFileMount(HostFeatures& h, const HostProbeOptions& options) {
  HostFeature& f = h.erofs_file_mount;
  if (!options.try_erofs_mount) {
    set(f, FeatureState::kUnknown, "not tried");
    return;
  }
  if (!h.erofs.ok()) {
    set(f, FeatureState::kMissing, "no erofs file system");
    return;
  }
  if (::geteuid() != 0) {
    set(f, FeatureState::kUnknown, "needs root to try a mount");
    return;
  }
  std::string mkfs = findProgram("mkfs.erofs");
  if (mkfs.empty()) {
    set(f, FeatureState::kUnknown, "mkfs.erofs not found, cannot build a test image");
    return;
  }
  char tmpl[] = "/tmp/dsec-doctor-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    set(f, FeatureState::kUnknown, "mkdtemp: " + errnoText(errno));
    return;
  }
  std::string base = tmpl;
  std::string src = base + "/src", image = base + "/image.erofs", mnt = base + "/mnt";
  Status prepared = makeDirs(src);
  if (prepared.ok()) prepared = writeFile(src + "/probe", "dsec");
  if (prepared.ok()) prepared = makeDirs(mnt);
  if (!prepared.ok()) {
    set(f, FeatureState::kUnknown, prepared.error().message());
    (void)removeTree(base);
    return;
  }
  CommandOptions command_options;
  command_options.timeout_seconds = 30;
  auto built = runCommand({mkfs, "--quiet", image, src}, command_options);
  if (!built.ok() || built->exit_code != 0) {
    set(f, FeatureState::kUnknown,
        "mkfs.erofs failed: " + (built.ok() ? trim(built->output).substr(0, 200) : built.error().message()));
    (void)removeTree(base);
    return;
  }
  std::string probe = mnt + "/probe";  // built before fork: the child only makes system calls
  // The mount lives in the child's private mount namespace and disappears with it.
  int rc = inChild([&]() -> int {
    if (::unshare(CLONE_NEWNS) != 0) return 98;
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return 98;
    if (::mount(image.c_str(), mnt.c_str(), "erofs", MS_RDONLY, nullptr) != 0) return 100 + errno;
    int fd = ::open(probe.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 97;
    char buf[8] = {};
    ssize_t n = ::read(fd, buf, sizeof buf);
    ::close(fd);
    return n == 4 && std::memcmp(buf, "dsec", 4) == 0 ? 0 : 97;
  });
  (void)removeTree(base);
  if (rc == 0) {
    set(f, FeatureState::kOk, "mount(image file, dir, \"erofs\") works without a loop device");
  } else if (rc >= 100 && rc < 255) {
    int err = rc - 100;
    set(f, FeatureState::kMissing,
        "mount of an image file: " + errnoText(err) + (err == ENOTBLK ? " (file-backed EROFS needs Linux 6.12+)" : ""));
  } else {
    set(f, FeatureState::kUnknown, "probe child failed (" + std::to_string(rc) + ")");
  }
}

void probeKvm(HostFeatures& h) {
  HostFeature& f = h.kvm;
  h.kvm_pvm = fileExists("/sys/module/kvm_pvm");
  UniqueFd kvm(::open("/dev/kvm", O_RDWR | O_CLOEXEC));
  if (!kvm) {
    set(f, FeatureState::kMissing, "open /dev/kvm: " + errnoText(errno));
    return;
  }
  int api = ::ioctl(kvm.get(), KVM_GET_API_VERSION, 0);
  UniqueFd vm(::ioctl(kvm.get(), KVM_CREATE_VM, 0));
  if (!vm) {
    set(f, FeatureState::kMissing, "KVM_CREATE_VM: " + errnoText(errno));
    return;
  }
  std::string detail = "/dev/kvm: KVM_CREATE_VM works (API " + std::to_string(api) + ")";
  if (h.kvm_pvm) {
    detail += "; kvm_pvm loaded: this is PVM, which runs only PVM-enabled guest kernels (stock kernels need TCG)";
  }
  set(f, FeatureState::kOk, detail);
}

// The active LSMs, from securityfs or (Linux 6.8+) lsm_list_modules(2) when securityfs is not mounted.
void probeLsms(HostFeatures& h) {
  auto lsm = readFile("/sys/kernel/security/lsm");
  bool bpf = false, landlock_listed = false;
  std::string source;
  if (lsm.ok()) {
    for (const auto& name : split(trim(*lsm), ',')) {
      bpf = bpf || name == "bpf";
      landlock_listed = landlock_listed || name == "landlock";
    }
    source = "LSMs: " + trim(*lsm);
  } else {
    uint64_t ids[64];
    uint32_t size = sizeof ids;
    long n = ::syscall(SYS_lsm_list_modules, ids, &size, 0);
    if (n < 0) {
      set(h.bpf_lsm, FeatureState::kUnknown,
          "securityfs not mounted and lsm_list_modules: " + errnoText(errno) + " (Linux < 6.8)");
    } else {
      for (long i = 0; i < n; ++i) {
        bpf = bpf || ids[i] == kLsmIdBpf;
        landlock_listed = landlock_listed || ids[i] == kLsmIdLandlock;
      }
      source = "lsm_list_modules lists " + std::to_string(n) + " LSMs";
    }
  }
  if (!source.empty()) {
    if (bpf) {
      set(h.bpf_lsm, FeatureState::kOk,
          source + ", bpf among them (lsm/ programs may still be refused, e.g. EPERM on PVM hosts)");
    } else {
      set(h.bpf_lsm, FeatureState::kMissing, source + ", bpf not among them (boot with lsm=...,bpf)");
    }
  }
  long abi = ::syscall(SYS_landlock_create_ruleset, nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
  if (abi > 0) {
    h.landlock_abi = static_cast<int>(abi);
    set(h.landlock, FeatureState::kOk, "ABI " + std::to_string(abi));
  } else {
    int err = errno;
    set(h.landlock, FeatureState::kMissing,
        "landlock_create_ruleset: " + errnoText(err) +
            (err == EOPNOTSUPP ? " (built in but not enabled: add landlock to lsm=)" : "") +
            (!source.empty() && !landlock_listed ? "; not among the active LSMs" : ""));
  }
}

void probeSeccomp(HostFeature& f) {
  int mode = ::prctl(PR_GET_SECCOMP, 0, 0, 0, 0);
  if (mode < 0) {
    set(f, FeatureState::kMissing, "prctl(PR_GET_SECCOMP): " + errnoText(errno) + " (kernel without CONFIG_SECCOMP)");
    return;
  }
  // With a NULL filter the kernel answers EFAULT when filter mode exists and EINVAL when it does not; nothing is
  // installed either way.
  errno = 0;
  int rc = ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, nullptr, 0, 0);
  if (rc == 0 || errno != EFAULT) {
    set(f, FeatureState::kMissing, "seccomp filter mode not available: " + errnoText(errno));
    return;
  }
  set(f, FeatureState::kOk,
      std::string("filter mode available") + (mode == 0 ? "" : "; this process already runs under a filter"));
}

void probePsi(HostFeature& f) {
  auto text = readFile("/proc/pressure/memory");
  if (!text.ok()) {
    set(f, FeatureState::kMissing, text.error().message() + " (boot with psi=1)");
    return;
  }
  auto lines = split(trim(*text), '\n');
  set(f, FeatureState::kOk, "/proc/pressure/memory: " + (lines.empty() ? std::string() : lines[0]));
}

void probeProgram(HostFeature& f, const std::string& name) {
  std::string path = findProgram(name);
  for (const char* dir : {"/usr/sbin/", "/sbin/", "/usr/local/sbin/"}) {
    if (!path.empty()) break;
    std::string candidate = dir + name;
    if (::access(candidate.c_str(), X_OK) == 0) path = candidate;
  }
  if (path.empty()) {
    set(f, FeatureState::kMissing, name + " not on PATH");
  } else {
    set(f, FeatureState::kOk, path);
  }
}

}  // namespace

const char* featureStateName(FeatureState state) {
  switch (state) {
    case FeatureState::kOk:
      return "ok";
    case FeatureState::kMissing:
      return "MISSING";
    case FeatureState::kUnknown:
      return "unknown";
  }
  return "?";
}

std::vector<const HostFeature*> HostFeatures::all() const {
  return {&mount_ns, &pid_ns,           &net_ns,  &uts_ns,   &ipc_ns,  &cgroup_ns, &user_ns, &cgroups,    &overlayfs,
          &erofs,    &erofs_file_mount, &seccomp, &landlock, &bpf_lsm, &kvm,       &psi,     &mkfs_erofs, &debootstrap};
}

std::vector<std::string> HostFeatures::missingRequired() const {
  std::vector<std::string> out;
  for (const HostFeature* f : all()) {
    if (f->required && !f->ok()) out.push_back(f->name);
  }
  return out;
}

HostFeatures probeHostFeatures(const HostProbeOptions& options) {
  HostFeatures h;
  h.mount_ns = feature("mount namespace", "the sandbox's own root file system (overlay + pivot_root)", true);
  h.pid_ns = feature("pid namespace", "sandboxes see only their own processes", true);
  h.net_ns = feature("network namespace", "network isolation (sandboxes get loopback only by default)", true);
  h.uts_ns = feature("uts namespace", "each sandbox has its own hostname", true);
  h.ipc_ns = feature("ipc namespace", "System V IPC and POSIX queues are not shared with the host", true);
  h.cgroup_ns = feature("cgroup namespace", "sandboxes see their own cgroup as the root", true);
  h.user_ns = feature("user namespace", "unprivileged (rootless) sandboxes; not needed when dsec runs as root", false);
  h.cgroups = feature("cgroups", "memory, CPU and pids limits, pause/resume (freezer), killing every process", true);
  h.overlayfs = feature("overlayfs", "each sandbox's writable layer over the read-only image", true);
  h.erofs = feature("erofs", "image layers are EROFS images", true);
  h.erofs_file_mount =
      feature("erofs file-backed mount", "layers mount straight from their image files, no loop device", false);
  h.seccomp = feature("seccomp", "the syscall filter that blocks what a sandbox never needs", true);
  h.landlock = feature("landlock", "extra file-access rules inside sandboxes (defence in depth)", false);
  h.bpf_lsm =
      feature("bpf lsm", "optional BPF LSM file protection; mount layout, Landlock and seccomp otherwise", false);
  h.kvm = feature("kvm", "VM sandboxes run accelerated; without it they fall back to TCG emulation (slow)", false);
  h.psi = feature("psi", "memory pressure signals for node admission and metrics", false);
  h.mkfs_erofs = feature("mkfs.erofs", "building layers (dsec layer build)", false);
  h.debootstrap = feature("debootstrap", "building Debian base layers (dsec layer build --debootstrap)", false);

  probeNamespace(h.mount_ns, CLONE_NEWNS, "CLONE_NEWNS", "mnt");
  probeNamespace(h.pid_ns, CLONE_NEWPID, "CLONE_NEWPID", "pid");
  probeNamespace(h.net_ns, CLONE_NEWNET, "CLONE_NEWNET", "net");
  probeNamespace(h.uts_ns, CLONE_NEWUTS, "CLONE_NEWUTS", "uts");
  probeNamespace(h.ipc_ns, CLONE_NEWIPC, "CLONE_NEWIPC", "ipc");
  probeNamespace(h.cgroup_ns, CLONE_NEWCGROUP, "CLONE_NEWCGROUP", "cgroup");
  probeNamespace(h.user_ns, CLONE_NEWUSER, "CLONE_NEWUSER", "user");
  probeCgroups(h);
  probeFilesystem(h.overlayfs, "overlay", "overlayfs");
  probeFilesystem(h.erofs, "erofs", "erofs");
  probeErofsFileMount(h, options);
  probeSeccomp(h.seccomp);
  probeLsms(h);
  probeKvm(h);
  probePsi(h.psi);
  probeProgram(h.mkfs_erofs, "mkfs.erofs");
  probeProgram(h.debootstrap, "debootstrap");
  return h;
}

std::string formatHostFeatures(const HostFeatures& h) {
  auto pad = [](std::string s, size_t width) {
    if (s.size() < width) s.append(width - s.size(), ' ');
    return s;
  };
  std::string out = pad("FEATURE", 26) + pad("STATE", 9) + "DETAIL\n";
  for (const HostFeature* f : h.all()) {
    out += pad(f->name, 26) + pad(featureStateName(f->state), 9) + f->detail + "\n";
  }
  std::string problems;
  for (const HostFeature* f : h.all()) {
    if (f->ok()) continue;
    problems += "  - " + f->name + (f->required ? " (required)" : " (optional)") + ": " + f->why + "\n";
  }
  if (!problems.empty()) out += "\nMissing or not verified, and what it is needed for:\n" + problems;
  auto missing = h.missingRequired();
  if (missing.empty()) {
    out += "\nVerdict: container sandboxes can run here";
    out += " (cgroup v" + std::to_string(h.cgroup_version) + (h.cgroup_hybrid ? ", hybrid layout" : "") + ").\n";
  } else {
    out += "\nVerdict: container sandboxes cannot run here; missing:";
    for (const auto& m : missing) out += " " + m;
    out += "\n";
  }
  return out;
}

}  // namespace dsec
