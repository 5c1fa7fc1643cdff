// The file watch's kernel side and its event thread (FileWatch.h).
#include "FileWatch.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fcntl.h>
#include <linux/perf_event.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "FileWatchMaps.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"
#include "dsec_filewatch.skel.h"  // generated from bpf/filewatch.bpf.c

#ifndef PIDFD_GET_MNT_NAMESPACE
#define PIDFD_GET_MNT_NAMESPACE _IO(0xFF, 3)  // linux/pidfd.h of 6.11
#endif

namespace dsec::backends {
namespace {

constexpr uint64_t kInitialPidNamespaceInode = 0xEFFFFFFC;  // PROC_PID_INIT_INO
constexpr const char* kTracepointPrefix = "tracepoint/syscalls/";
const char* const kEventDirs[] = {"/sys/kernel/tracing/events/syscalls", "/sys/kernel/debug/tracing/events/syscalls"};

// The tracepoint ids of the named syscall events (missing names are left out).
std::map<std::string, int> readEventIds(const std::string& dir, const std::vector<std::string>& names) {
  std::map<std::string, int> ids;
  for (const auto& name : names) {
    auto text = readFile(dir + "/" + name + "/id");
    if (text.ok()) ids[name] = std::atoi(text->c_str());
  }
  return ids;
}

// The ids come from tracefs. When the host has it mounted nowhere, a short-lived thread mounts it in a mount
// namespace of its own (gone with the thread), so the host's mounts stay as they were.
Result<std::map<std::string, int>> syscallEventIds(const std::vector<std::string>& names) {
  for (const char* dir : kEventDirs) {
    auto ids = readEventIds(dir, names);
    if (!ids.empty()) return ids;
  }
  std::map<std::string, int> ids;
  int error = 0;
  std::thread reader([&] {
    if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("tracefs", "/sys/kernel/tracing", "tracefs", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) {
      error = errno;
      return;
    }
    ids = readEventIds(kEventDirs[0], names);
  });
  reader.join();
  if (error != 0) return Error::sys(error, "mount tracefs to find the syscall tracepoints");
  if (ids.empty()) {
    return Error(ErrorCode::kUnsupported, "the kernel has no syscall tracepoints (CONFIG_FTRACE_SYSCALLS)");
  }
  return ids;
}

double bootSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_BOOTTIME, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

}  // namespace

Result<uint32_t> mountNamespaceOf(int pidfd, pid_t pid) {
  struct stat st {};
  UniqueFd ns(::ioctl(pidfd, PIDFD_GET_MNT_NAMESPACE, 0));
  if (ns) {
    if (::fstat(ns.get(), &st) != 0) return Error::sys(errno, "stat a mount namespace");
    return static_cast<uint32_t>(st.st_ino);
  }
  // Before 6.11: through /proc, then make sure the pid still named the pidfd's process.
  if (::stat(("/proc/" + std::to_string(pid) + "/ns/mnt").c_str(), &st) != 0) {
    return Error::sys(errno, "find the mount namespace of process " + std::to_string(pid));
  }
  if (::syscall(SYS_pidfd_send_signal, pidfd, 0, nullptr, 0) != 0) {
    return Error::sys(errno, "process " + std::to_string(pid) + " is gone");
  }
  return static_cast<uint32_t>(st.st_ino);
}

Result<std::unique_ptr<FileWatch>> FileWatch::start() {
  std::unique_ptr<FileWatch> watch(new FileWatch());
  watch->skeleton_ = dsec_filewatch__open();
  if (watch->skeleton_ == nullptr) return Error::sys(errno, "open the file watch's BPF programs");
  // Events name the caller by its pid in the initial pid namespace: only an agent there can find it in /proc.
  struct stat pidns {};
  watch->callers_visible_ = ::stat("/proc/self/ns/pid", &pidns) == 0 && pidns.st_ino == kInitialPidNamespaceInode;
  if (!watch->callers_visible_) {
    DSEC_LOG(kInfo, "container") << "file watch: the agent is not in the initial pid namespace; refused calls are "
                                    "resolved through each sandbox's init (absolute paths only)";
  }
  if (dsec_filewatch__load(watch->skeleton_) != 0) {
    return Error(ErrorCode::kUnsupported,
                 "the kernel refused the file watch's BPF programs (syscall tracepoints, BTF for CO-RE)", errno);
  }
  DSEC_TRY(watch->attach());
  DSEC_ASSIGN_OR_RETURN(watch->events_, BpfEventThread::start("file watch", bpf_map__fd(watch->skeleton_->maps.events),
                                                              [w = watch.get()](const void* data, size_t size) {
                                                                if (size < sizeof(dsec_fw_event)) return;
                                                                dsec_fw_event event{};
                                                                std::memcpy(&event, data, sizeof event);
                                                                w->deliver(event);
                                                              }));
  return watch;
}

Status FileWatch::attach() {
  std::vector<std::pair<bpf_program*, std::string>> programs;
  std::vector<std::string> names;
  bpf_program* program = nullptr;
  bpf_object__for_each_program(program, skeleton_->obj) {
    std::string section = bpf_program__section_name(program);
    if (!startsWith(section, kTracepointPrefix)) continue;
    programs.emplace_back(program, section.substr(std::strlen(kTracepointPrefix)));
    names.push_back(programs.back().second);
  }
  DSEC_ASSIGN_OR_RETURN(auto ids, syscallEventIds(names));
  std::vector<std::string> missing;
  for (const auto& [prog, event] : programs) {
    auto id = ids.find(event);
    if (id == ids.end()) {
      missing.push_back(event);
      continue;
    }
    perf_event_attr attr{};
    attr.type = PERF_TYPE_TRACEPOINT;
    attr.size = sizeof attr;
    attr.config = static_cast<uint64_t>(id->second);
    attr.sample_period = 1;
    attr.wakeup_events = 1;
    // One event is enough: a BPF program on a tracepoint runs for every CPU and task.
    const int fd = static_cast<int>(::syscall(SYS_perf_event_open, &attr, -1, 0, -1, PERF_FLAG_FD_CLOEXEC));
    if (fd < 0) return Error::sys(errno, "open the tracepoint syscalls/" + event);
    bpf_link* link = bpf_program__attach_perf_event(prog, fd);
    if (link == nullptr) {
      const int err = errno;
      ::close(fd);
      return Error::sys(err, "attach the file watch to syscalls/" + event);
    }
    links_.push_back(link);
    if (startsWith(event, "sys_enter_")) ++watched_calls_;
  }
  if (!missing.empty()) {
    DSEC_LOG(kDebug, "container") << "file watch: " << missing.size() << " syscall tracepoints absent here (e.g. "
                                  << missing.front() << ")";
  }
  if (watched_calls_ == 0) return Error(ErrorCode::kUnsupported, "none of the file syscalls has a tracepoint here");
  return okStatus();
}

FileWatch::~FileWatch() {
  events_.reset();
  for (bpf_link* link : links_) bpf_link__destroy(link);  // closes the perf event too
  if (skeleton_ != nullptr) dsec_filewatch__destroy(skeleton_);
}

Status FileWatch::watch(uint32_t mntns, Watched sandbox) {
  std::lock_guard lock(mu_);
  if (sandboxes_.find(mntns) == sandboxes_.end()) {
    dsec_fw_sandbox state{};
    if (bpf_map_update_elem(bpf_map__fd(skeleton_->maps.sandboxes), &mntns, &state, BPF_ANY) != 0) {
      return Error::sys(errno, "watch a sandbox's file calls");
    }
  }
  sandboxes_[mntns] = std::move(sandbox);
  return okStatus();
}

void FileWatch::unwatch(uint32_t mntns) {
  std::lock_guard lock(mu_);
  if (sandboxes_.erase(mntns) == 0) return;
  (void)bpf_map_delete_elem(bpf_map__fd(skeleton_->maps.sandboxes), &mntns);
}

void FileWatch::deliver(const dsec_fw_event& event) {
  Watched sandbox;
  {
    std::lock_guard lock(mu_);
    auto found = sandboxes_.find(event.mntns);
    if (found == sandboxes_.end()) return;
    sandbox = found->second;
  }
  auto log = sandbox.log.lock();
  if (!log) return;
  dsec_fw_event seen = event;
  if (!callers_visible_) seen.tgid = 0;
  auto violation = protectedPathViolation(resolveRefusedCall(seen, sandbox.init_pid), sandbox.protected_paths);
  if (!violation) return;
  violation->time_unix =
      static_cast<double>(time(nullptr)) - (bootSeconds() - static_cast<double>(event.time_boot_ns) / 1e9);
  if (event.suppressed > 0) {
    violation->detail += "; " + std::to_string(event.suppressed) + " earlier refused calls not reported (rate bound)";
  }
  log->record(std::move(*violation));
}

}  // namespace dsec::backends
