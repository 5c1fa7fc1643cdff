#include "UserNamespace.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/mount.h>
#include <sched.h>
#include <signal.h>
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

// The lease files an allocator has open, one shared read-write file description each (kept while the allocator or
// any hold lives: at most count / 64 fds), and the ranges it holds through them.
class LeaseFiles {
 public:
  explicit LeaseFiles(std::string dir) : dir_(std::move(dir)) {}

  std::string path(uint32_t slot) const { return dir_ + "/ranges-" + std::to_string(slot / kRangesPerLeaseFile); }

  // The shared file description of slot's lease file, opened on first use. mu() held.
  Result<int> sharedFd(uint32_t slot) {
    auto it = files_.find(slot / kRangesPerLeaseFile);
    if (it != files_.end()) return it->second.get();
    const std::string file = path(slot);
    // Read-write: a write lock (the lease test) needs it. Root's and private, like its directory.
    UniqueFd fd(::open(file.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd) return Error::sys(errno, "open id range lease file " + file);
    const int raw = fd.get();
    files_.emplace(slot / kRangesPerLeaseFile, std::move(fd));
    return raw;
  }

  std::mutex& mu() { return mu_; }
  bool holds(uint32_t slot) const { return held_.count(slot) != 0; }
  void markHeld(uint32_t slot) { held_.insert(slot); }

  void release(uint32_t slot) {
    std::lock_guard lock(mu_);
    if (held_.erase(slot) == 0) return;
    auto it = files_.find(slot / kRangesPerLeaseFile);
    if (it != files_.end()) (void)lockByte(it->second.get(), slot, F_UNLCK);
  }

  // One range's byte of its lease file, locked (F_RDLCK, F_WRLCK) or unlocked through fd's file description;
  // fails with EAGAIN when another file description's lock conflicts.
  static int lockByte(int fd, uint32_t slot, short type) {
    struct flock fl {};
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = static_cast<off_t>(slot % kRangesPerLeaseFile);
    fl.l_len = 1;
    return ::fcntl(fd, F_OFD_SETLK, &fl);
  }

  // Whether a file description other than fd's holds a lock on slot's byte.
  static Result<bool> lockedByOthers(int fd, uint32_t slot) {
    struct flock fl {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = static_cast<off_t>(slot % kRangesPerLeaseFile);
    fl.l_len = 1;
    if (::fcntl(fd, F_OFD_GETLK, &fl) != 0) return Error::sys(errno, "test id range lease");
    return fl.l_type != F_UNLCK;
  }

 private:
  std::mutex mu_;
  const std::string dir_;
  std::map<uint32_t, UniqueFd> files_;  // lease file index -> the shared file description
  std::set<uint32_t> held_;
};

IdRangeHold& IdRangeHold::operator=(IdRangeHold&& other) noexcept {
  if (this != &other) {
    reset();
    files_ = std::move(other.files_);
    slot_ = other.slot_;
  }
  return *this;
}

void IdRangeHold::reset() {
  if (!files_) return;
  files_->release(slot_);
  files_.reset();
}

IdRangeAllocator::IdRangeAllocator(IdRangeOptions options)
    : options_(std::move(options)), files_(std::make_shared<LeaseFiles>(options_.lease_dir)) {}

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
  std::lock_guard files_lock(files_->mu());
  for (uint32_t tried = 0; tried < options_.count; ++tried) {
    const uint32_t slot = (next_ + tried) % options_.count;
    if (files_->holds(slot)) continue;  // one of ours (our own lock would not refuse us)
    DSEC_ASSIGN_OR_RETURN(int shared, files_->sharedFd(slot));
    if (LeaseFiles::lockByte(shared, slot, F_WRLCK) != 0) {
      if (errno == EAGAIN || errno == EACCES || errno == EINTR) continue;  // someone else's
      return Error::sys(errno, "lock id range lease " + files_->path(slot));
    }
    // Ours alone now. Ours becomes a read lock (atomically: the byte is never unlocked in between), then init's
    // file description takes one of its own. Read-only: init can do nothing with it but keep the lock.
    (void)LeaseFiles::lockByte(shared, slot, F_RDLCK);
    UniqueFd init_fd(::open(files_->path(slot).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (!init_fd || LeaseFiles::lockByte(init_fd.get(), slot, F_RDLCK) != 0) {
      Error e = Error::sys(errno, "lock id range lease " + files_->path(slot) + " for init");
      (void)LeaseFiles::lockByte(shared, slot, F_UNLCK);
      return e;
    }
    files_->markHeld(slot);
    next_ = (slot + 1) % options_.count;
    IdRangeLease lease;
    lease.host_base = options_.first_host_id + slot * kIdRangeSize;
    lease.hold = IdRangeHold(files_, slot);
    lease.init_fd = std::move(init_fd);
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
  const auto slot = static_cast<uint32_t>(offset / kIdRangeSize);
  std::lock_guard lock(mu_);
  std::lock_guard files_lock(files_->mu());
  auto conflict = [&] {
    return Error(ErrorCode::kConflict, "host id range " + std::to_string(host_base) +
                                           " is leased by another process than its sandbox's init");
  };
  if (files_->holds(slot)) return conflict();  // another sandbox of ours has it
  DSEC_ASSIGN_OR_RETURN(int shared, files_->sharedFd(slot));
  struct stat want {};
  if (::fstat(shared, &want) != 0) return Error::sys(errno, "stat id range lease " + files_->path(slot));
  // Init's lease fd: the file description holding its lock.
  UniqueFd held(static_cast<int>(syscall(SYS_pidfd_getfd, init_pidfd, init_protocol::kLeaseFd, 0)));
  struct stat got {};
  if (held && ::fstat(held.get(), &got) == 0 && got.st_dev == want.st_dev && got.st_ino == want.st_ino) {
    // Nobody but init may hold the range (its own lock does not count: the test goes through its description).
    DSEC_ASSIGN_OR_RETURN(bool others, LeaseFiles::lockedByOthers(held.get(), slot));
    if (others) return conflict();
    // Init's lock (taken again if it had let it go: nobody else holds the range), then ours beside it.
    if (LeaseFiles::lockByte(held.get(), slot, F_RDLCK) != 0 || LeaseFiles::lockByte(shared, slot, F_RDLCK) != 0) {
      if (errno == EAGAIN || errno == EACCES) return conflict();
      return Error::sys(errno, "lock id range lease " + files_->path(slot));
    }
  } else {
    // Init does not hold it (it should): the range is ours only if nobody else holds it.
    if (LeaseFiles::lockByte(shared, slot, F_WRLCK) != 0) {
      if (errno == EAGAIN || errno == EACCES) return conflict();
      return Error::sys(errno, "lock id range lease " + files_->path(slot));
    }
    (void)LeaseFiles::lockByte(shared, slot, F_RDLCK);
  }
  files_->markHeld(slot);
  IdRangeLease lease;
  lease.host_base = host_base;
  lease.hold = IdRangeHold(files_, slot);
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
