// User namespaces of container sandboxes: every sandbox's root is mapped to a host id range that no other
// sandbox and no host service uses, and the layers appear inside with their own ownership through idmapped
// mounts.
//
// Ranges are leased node-wide (every agent, CLI and test on a node shares one lease directory): a range is in use
// while a lock is held on its byte of its lease file (ranges-<k> holds ranges 64k..64k+63, range r at byte r % 64;
// open file description locks, F_OFD_SETLK). The sandbox's init holds a read lock of its own (its fd 5) for the
// sandbox's life, and the agent that runs the sandbox holds another, through the one file description per lease
// file it keeps for all its sandboxes: thousands of sandboxes cost the agent one fd per 64 ranges, not one each.
// Init alone is not enough: the kernel closes a dying init's files before it kills the rest of its pid namespace,
// so the range would come free while the sandbox's other processes still run with its ids. The agent lets its lock
// go only once init has been reaped, which happens after every other process of the namespace is gone. Whoever
// leases a range takes a write lock on its byte first, which any other holder's lock refuses.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"

namespace dsec::backends {

// 65536 ids per sandbox: root (0), the ids Debian's packages use, and nobody (65534).
constexpr uint32_t kIdRangeSize = 65536;

struct IdRangeOptions {
  std::string lease_dir = "/run/dsec/idranges";
  uint32_t first_host_id = 0x40000000;  // 1073741824: far above login users and the usual subordinate ranges
  uint32_t count = 16384;               // ranges available (16384 * 65536 ids end at 2^31)
  // Host users' subordinate id ranges: none may overlap the sandboxes'.
  std::vector<std::string> subordinate_id_files = {"/etc/subuid", "/etc/subgid"};
};

// Ranges per lease file (one byte each).
constexpr uint32_t kRangesPerLeaseFile = 64;

// The open lease files of one allocator and which of their ranges it holds (shared by its holds, which may
// outlive it).
class LeaseFiles;

// An agent's hold on one range: a read lock on the range's byte through the allocator's shared file description.
// Let go by reset() or by going away.
class IdRangeHold {
 public:
  IdRangeHold() = default;
  IdRangeHold(std::shared_ptr<LeaseFiles> files, uint32_t slot) : files_(std::move(files)), slot_(slot) {}
  IdRangeHold(IdRangeHold&& other) noexcept : files_(std::move(other.files_)), slot_(other.slot_) {}
  IdRangeHold& operator=(IdRangeHold&& other) noexcept;
  IdRangeHold(const IdRangeHold&) = delete;
  IdRangeHold& operator=(const IdRangeHold&) = delete;
  ~IdRangeHold() { reset(); }
  void reset();
  explicit operator bool() const { return files_ != nullptr; }

 private:
  std::shared_ptr<LeaseFiles> files_;
  uint32_t slot_ = 0;
};

// A leased range: the agent's hold, and (from acquire) a file description of the range's lease file with a read
// lock of its own on the range, for the sandbox's init to keep (InitProtocol.h, fd 5). The agent closes its copy
// of init_fd once init has it.
struct IdRangeLease {
  uint32_t host_base = 0;  // host uid and gid of the sandbox's root
  IdRangeHold hold;
  UniqueFd init_fd;
};

class IdRangeAllocator {
 public:
  explicit IdRangeAllocator(IdRangeOptions options);
  // Checks the options and makes the lease directory.
  Status prepare();
  // A range nobody holds now; kResourceExhausted when all are taken.
  Result<IdRangeLease> acquire();
  // The agent's hold on the range whose root is host_base, whose lock the sandbox init (init_pidfd) keeps in its
  // lease fd; a range init does not hold is taken only if nobody else does. No init_fd. kNotFound when host_base is
  // not a range of these options (nothing here hands it out); kConflict when the range is leased by someone other
  // than that init.
  Result<IdRangeLease> adopt(uint32_t host_base, int init_pidfd);
  const IdRangeOptions& options() const { return options_; }

 private:
  IdRangeOptions options_;
  std::mutex mu_;
  uint32_t next_ = 0;  // where the next search starts (ranges are reused last)
  std::shared_ptr<LeaseFiles> files_;
};

// Writes "0 BASE 65536" to /proc/PID/uid_map and gid_map (PID made a user namespace and waits for them).
Status writeIdMaps(pid_t pid, uint32_t host_base);
// The host id that root of the user namespace of PID maps to (read from its uid_map); kNotFound if none.
Result<uint32_t> hostRootOf(pid_t pid);

// A detached copy of the mount at dir (read-only when asked, always nosuid and nodev), idmapped to the user
// namespace userns_fd when that is valid: files owned by 0 on disk appear owned by the namespace's root, and
// files its root creates are stored as 0. The caller attaches it (move_mount) or closes it.
Result<UniqueFd> detachedMount(const std::string& dir, int userns_fd, bool read_only);

// Whether this kernel has user namespaces and idmapped mounts on a file system like the layers' (checked once by
// trying, in throw-away children).
struct UserNamespaceSupport {
  std::string problem;             // empty when usable, else what is missing
  bool unprivileged_owner = true;  // an unprivileged id may make them (else only root: some hosts restrict it)
};
UserNamespaceSupport probeUserNamespaces(const std::string& probe_dir);

}  // namespace dsec::backends
