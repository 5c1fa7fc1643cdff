#include "UserNamespace.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/mount.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "InitProtocol.h"
#include "dsec/common/Strings.h"

namespace dsec::backends {

namespace {

// A subordinate id range of a host user ("name:first:count" in /etc/subuid or /etc/subgid) that overlaps
// [first, end): that user could take a sandbox root's host id and signal or ptrace its processes.
std::string overlappingSubordinateRange(const std::string& file, uint64_t first, uint64_t end) {
  auto text = readFile(file);
  if (!text.ok()) return "";
  for (const auto& line : split(*text, '\n')) {
    auto fields = split(trim(line), ':');
    if (fields.size() != 3 || fields[1].empty() || fields[2].empty()) continue;
    char* stop = nullptr;
    uint64_t start = std::strtoull(fields[1].c_str(), &stop, 10);
    uint64_t count = std::strtoull(fields[2].c_str(), &stop, 10);
    if (start < end && start + count > first) return file + ": " + trim(line);
  }
  return "";
}

}  // namespace

IdRangeAllocator::IdRangeAllocator(IdRangeOptions options) : options_(std::move(options)) {}

Status IdRangeAllocator::prepare() {
  const uint64_t end = uint64_t{options_.first_host_id} + uint64_t{options_.count} * kIdRangeSize;
  if (options_.count == 0) return Error::invalid("no host id ranges configured for user namespaces");
  if (options_.first_host_id < kIdRangeSize) {
    return Error::invalid("host id ranges must start at or above 65536 (login users and system ids live below)");
  }
  // 2^32-1 is the invalid id; stay below it (and below the ids some tools read as negative).
  if (end > (uint64_t{1} << 32) - 1) return Error::invalid("host id ranges reach past 2^32-1");
  for (const auto& file : options_.subordinate_id_files) {
    std::string overlap = overlappingSubordinateRange(file, options_.first_host_id, end);
    if (!overlap.empty()) {
      return Error::invalid("the sandboxes' host id ranges (" + std::to_string(options_.first_host_id) + " to " +
                            std::to_string(end - 1) + ") overlap a subordinate range a host user holds (" + overlap +
                            "): choose other ranges for sandboxes");
    }
  }
  DSEC_TRY(makePrivateDir(options_.lease_dir));
  // Not following a symlink planted by someone else: the directory must be root's and private.
  struct stat st {};
  if (::lstat(options_.lease_dir.c_str(), &st) != 0) return Error::sys(errno, "stat " + options_.lease_dir);
  if (!S_ISDIR(st.st_mode) || st.st_uid != 0 || (st.st_mode & 022) != 0) {
    return Error::invalid(options_.lease_dir + " must be a directory owned by root and writable only by it");
  }
  return okStatus();
}

Result<IdRangeLease> IdRangeAllocator::acquire() {
  std::lock_guard lock(mu_);
  for (uint32_t tried = 0; tried < options_.count; ++tried) {
    const uint32_t slot = (next_ + tried) % options_.count;
    const std::string path = options_.lease_dir + "/" + std::to_string(slot);
    // Read-only: the init that ends up holding it can do nothing with it but keep the lock.
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0400));
    if (!fd) return Error::sys(errno, "open id range lease " + path);
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno == EWOULDBLOCK || errno == EINTR) continue;
      return Error::sys(errno, "lock id range lease " + path);
    }
    next_ = (slot + 1) % options_.count;
    IdRangeLease lease;
    lease.host_base = options_.first_host_id + slot * kIdRangeSize;
    lease.lock_fd = std::move(fd);
    return lease;
  }
  return Error(ErrorCode::kResourceExhausted,
               "all " + std::to_string(options_.count) + " host id ranges for sandboxes are in use on this node");
}

Result<IdRangeLease> IdRangeAllocator::adopt(uint32_t host_base, int init_pidfd) {
  const uint64_t offset = uint64_t{host_base} - options_.first_host_id;
  if (host_base < options_.first_host_id || offset % kIdRangeSize != 0 || offset / kIdRangeSize >= options_.count) {
    return Error::notFound("host id " + std::to_string(host_base) + " is not the root of a range leased here");
  }
  std::lock_guard lock(mu_);
  const std::string path = options_.lease_dir + "/" + std::to_string(offset / kIdRangeSize);
  UniqueFd file(::open(path.c_str(), O_RDONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0400));
  if (!file) return Error::sys(errno, "open id range lease " + path);
  struct stat want {};
  if (::fstat(file.get(), &want) != 0) return Error::sys(errno, "stat id range lease " + path);
  // Init's copy is the lock itself; a lock of our own on a new file description would conflict with it.
  UniqueFd held(static_cast<int>(syscall(SYS_pidfd_getfd, init_pidfd, init_protocol::kLeaseFd, 0)));
  struct stat got {};
  if (held && ::fstat(held.get(), &got) == 0 && got.st_dev == want.st_dev && got.st_ino == want.st_ino) {
    IdRangeLease lease;
    lease.host_base = host_base;
    lease.lock_fd = std::move(held);
    return lease;
  }
  // Init does not hold it (it should): the range is ours only if nobody else does.
  if (::flock(file.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) return Error::sys(errno, "lock id range lease " + path);
    return Error(ErrorCode::kConflict, "host id range " + std::to_string(host_base) +
                                           " is leased by another process than its sandbox's init");
  }
  IdRangeLease lease;
  lease.host_base = host_base;
  lease.lock_fd = std::move(file);
  return lease;
}

Status writeIdMaps(pid_t pid, uint32_t host_base) {
  const std::string line = "0 " + std::to_string(host_base) + " " + std::to_string(kIdRangeSize) + "\n";
  for (const char* map : {"uid_map", "gid_map"}) {
    const std::string path = "/proc/" + std::to_string(pid) + "/" + map;
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd) return Error::sys(errno, "open " + path);
    if (::write(fd.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      return Error::sys(errno, "write " + path);
    }
  }
  return okStatus();
}

Result<uint32_t> hostRootOf(pid_t pid) {
  DSEC_ASSIGN_OR_RETURN(std::string map, readFile("/proc/" + std::to_string(pid) + "/uid_map"));
  for (const auto& line : split(map, '\n')) {
    std::vector<std::string> fields;
    for (auto& f : split(line, ' ')) {
      if (!f.empty()) fields.push_back(f);
    }
    if (fields.size() == 3 && fields[0] == "0") return static_cast<uint32_t>(std::stoul(fields[1]));
  }
  return Error::notFound("root of the user namespace of " + std::to_string(pid) + " is not mapped");
}

Result<UniqueFd> detachedMount(const std::string& dir, int userns_fd, bool read_only) {
  UniqueFd tree(static_cast<int>(syscall(SYS_open_tree, AT_FDCWD, dir.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)));
  if (!tree) return Error::sys(errno, "clone mount " + dir);
  mount_attr attr{};
  attr.attr_set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (read_only ? MOUNT_ATTR_RDONLY : 0);
  if (userns_fd >= 0) {
    attr.attr_set |= MOUNT_ATTR_IDMAP;
    attr.userns_fd = static_cast<uint64_t>(userns_fd);
  }
  if (syscall(SYS_mount_setattr, tree.get(), "", AT_EMPTY_PATH, &attr, sizeof attr) != 0) {
    return Error::sys(errno, std::string(userns_fd >= 0 ? "idmap" : "set attributes of") + " mount " + dir);
  }
  return tree;
}

namespace {

// One probe: a child (as nobody when unprivileged) makes a user namespace; we map it and idmap a mount to it.
std::string probeOnce(const std::string& probe_dir, bool unprivileged) {
  int to_child[2];
  if (::pipe2(to_child, O_CLOEXEC) != 0) return "user namespaces (pipe: " + std::string(strerror(errno)) + ")";
  UniqueFd read_end(to_child[0]), write_end(to_child[1]);
  int ready[2];
  if (::pipe2(ready, O_CLOEXEC) != 0) return "user namespaces (pipe: " + std::string(strerror(errno)) + ")";
  UniqueFd ready_r(ready[0]), ready_w(ready[1]);
  pid_t child = ::fork();
  if (child < 0) return "user namespaces (fork: " + std::string(strerror(errno)) + ")";
  if (child == 0) {
    ::close(write_end.get());  // EOF on read_end once the parent closes its copy
    ::close(ready_r.get());
    constexpr uid_t kNobody = 65534;
    bool dropped = !unprivileged || (::setgroups(0, nullptr) == 0 && ::setresgid(kNobody, kNobody, kNobody) == 0 &&
                                     ::setresuid(kNobody, kNobody, kNobody) == 0);
    char c = dropped && ::unshare(CLONE_NEWUSER) == 0 ? 'y' : 'n';
    (void)!::write(ready_w.get(), &c, 1);
    (void)!::read(read_end.get(), &c, 1);  // until the parent is done with our namespace
    _exit(0);
  }
  ready_w.reset();
  char c = 'n';
  (void)!::read(ready_r.get(), &c, 1);
  std::string problem;
  if (c != 'y') {
    problem = "user namespaces (unshare(CLONE_NEWUSER) refused; check user.max_user_namespaces)";
  } else if (auto mapped = writeIdMaps(child, 0x7fff0000); !mapped.ok()) {
    problem = "user namespaces (" + mapped.error().message() + ")";
  } else {
    UniqueFd userns(::open(("/proc/" + std::to_string(child) + "/ns/user").c_str(), O_RDONLY | O_CLOEXEC));
    auto mount = userns ? detachedMount(probe_dir, userns.get(), true)
                        : Result<UniqueFd>(Error::sys(errno, "open user namespace"));
    if (!mount.ok()) problem = "idmapped mounts (Linux >= 5.12; " + mount.error().message() + ")";
  }
  write_end.reset();
  while (::waitpid(child, nullptr, 0) < 0 && errno == EINTR) {
  }
  return problem;
}

}  // namespace

UserNamespaceSupport probeUserNamespaces(const std::string& probe_dir) {
  if (::access("/proc/self/ns/user", F_OK) != 0) return {"user namespaces (CONFIG_USER_NS)", false};
  UserNamespaceSupport support;
  if (probeOnce(probe_dir, true).empty()) return support;
  support.unprivileged_owner = false;
  support.problem = probeOnce(probe_dir, false);
  return support;
}

}  // namespace dsec::backends
