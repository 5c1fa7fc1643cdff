#include "dsec/launcher/node/JobOwnership.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <nlohmann/json.hpp>

#include "dsec/backends/container/ContainerBackend.h"
#include "dsec/common/Directory.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/MountInfo.h"
#include "dsec/launcher/node/StateStore.h"

namespace dsec::launcher {
namespace {

using nlohmann::json;
constexpr const char* kLog = "jobend";

bool isJobId(const std::string& job) {
  return !job.empty() && job.size() <= 20 &&
         std::all_of(job.begin(), job.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// One file per (host, directory): a node may run agents on several directories, and hosts may share /run
// (several Slurm nodes on one machine).
std::string claimPath(const std::string& registry_dir, const JobClaim& claim) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a of host and directory
  for (unsigned char c : claim.host + "\n" + claim.state_dir) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return registry_dir + "/" + claim.job + "/" + hex + ".json";
}

// The epilog runs as root and kills what a claim names: a claim only this uid (root, in an epilog) could have
// written is read, anything else (another user's file, a symbolic link, a loose directory) is refused.
Result<JobClaim> readClaim(const std::string& path) {
  DSEC_ASSIGN_OR_RETURN(std::string text, readPrivateFile(path));
  json j = json::parse(text, nullptr, false);
  if (!j.is_object()) return Error::invalid("job claim " + path + " is not a JSON object");
  JobClaim c;
  try {
    c.job = j.at("job").get<std::string>();
    c.host = j.at("host").get<std::string>();
    c.node = j.value("node", "");
    c.state_dir = j.at("state_dir").get<std::string>();
    c.cgroup_parent = j.at("cgroup_parent").get<std::string>();
    c.pid = j.value("pid", 0);
  } catch (const json::exception& e) {
    return Error::invalid("job claim " + path + ": " + e.what());
  }
  if (c.state_dir.empty() || c.state_dir[0] != '/' || c.cgroup_parent.empty()) {
    return Error::invalid("job claim " + path + " names no absolute directory or cgroup parent");
  }
  return c;
}

// The node directory a claim names, and every directory above it, must be ones only root (or this uid) could have
// changed (the rule readPrivateFile applies to a private file's directory): the epilog reads the sandbox records
// there and kills what they name, so a directory another user may write would let them plant records for it.
// Walked from / with O_NOFOLLOW, so no component is a symbolic link either.
Status checkTrustedDirectory(const std::string& dir) {
  UniqueFd at(::open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!at) return Error::sys(errno, "open /");
  std::string walked;
  for (const auto& part : split(dir, '/')) {
    if (part.empty()) continue;
    walked += "/" + part;
    if (part == "." || part == "..") return Error::invalid(dir + " is not a plain absolute path");
    UniqueFd next(::openat(at.get(), part.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!next) return Error::sys(errno, "open " + walked + " (a symbolic link is refused)");
    struct stat st {};
    if (::fstat(next.get(), &st) != 0) return Error::sys(errno, "fstat " + walked);
    bool others_may_change = (st.st_mode & 022) != 0 && (st.st_mode & S_ISVTX) == 0;
    if ((st.st_uid != 0 && st.st_uid != ::geteuid()) || others_may_change) {
      return Error(ErrorCode::kConflict, walked + " may be changed by another user than root");
    }
    at = std::move(next);
  }
  return okStatus();
}

// A backend that only reaps: no init pool, no user namespaces to probe, nothing started inside.
Result<std::unique_ptr<backends::Backend>> reapingBackend(const std::string& cgroup_parent) {
  backends::ContainerBackendOptions options;
  options.cgroup_parent = cgroup_parent;
  options.init_pool_size = 0;
  options.user_namespace = backends::UserNamespaceMode::kOff;
  options.commands = false;
  return backends::makeContainerBackend(options);
}

// Every mount at or below <dir>/mnt (the layer mounts and the private bind of mnt itself), deepest first.
int releaseLayerMounts(const std::string& state_dir, JobCleanupReport& report) {
  std::string mnt = state_dir + "/mnt";
  auto mounts = fs3::mountsUnder(mnt);
  if (!mounts.ok()) {
    report.notes.push_back("listing the layer mounts under " + mnt + ": " + mounts.error().message());
    return 0;
  }
  std::vector<std::string> points;
  for (const auto& m : *mounts) points.push_back(m.mount_point);
  std::sort(points.begin(), points.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
  int released = 0;
  for (const auto& p : points) {
    if (::umount2(p.c_str(), MNT_DETACH | UMOUNT_NOFOLLOW) == 0) {
      if (p != mnt) ++released;
      if (p != mnt) ::rmdir(p.c_str());
    } else if (errno != EINVAL && errno != ENOENT) {
      report.notes.push_back(Error::sys(errno, "umount " + p).message());
    }
  }
  return released;
}

// The sandboxes of claim.job in one node directory; false when the directory was left alone. It is locked
// first: a live agent holding it (in an epilog no agent of the job is alive any more, so it is another job's,
// which took the directory over) is left alone, and so is the claim, for a later run.
bool cleanUpClaim(const JobClaim& claim, JobCleanupReport& report) {
  if (auto trusted = checkTrustedDirectory(claim.state_dir);
      !trusted.ok() && trusted.error().code() != ErrorCode::kNotFound) {
    report.notes.push_back(claim.state_dir + " left alone: " + trusted.error().message());
    return false;
  }
  auto lock = StateDirLock::acquire(claim.state_dir, claim.job);
  if (!lock.ok() && ::access(claim.state_dir.c_str(), F_OK) == 0) {
    report.notes.push_back(claim.state_dir + " left alone: " + lock.error().message());
    return false;
  }
  // (A directory removed since: no records and no mounts there, but the cgroups under the parent still go.)
  FileStateStore store(claim.state_dir + "/state/sandboxes");
  auto records = store.loadAll();
  if (!records.ok() && records.error().code() != ErrorCode::kNotFound) {
    report.notes.push_back("reading the records in " + claim.state_dir + ": " + records.error().message());
    return false;
  }
  auto backend = reapingBackend(claim.cgroup_parent);
  if (!backend.ok()) {
    report.notes.push_back("cannot reap in " + claim.state_dir + ": " + backend.error().message());
    return false;
  }
  int other_jobs = 0;
  for (const auto& entry : records.ok() ? *records : std::vector<StoredState>{}) {
    // A record that does not decode is reaped too: no agent could re-adopt it.
    if (entry.record.ok() && entry.record->slurm_job != claim.job) {
      ++other_jobs;
      continue;
    }
    if (auto st = (*backend)->reap(entry.backend_state); !st.ok()) {
      report.notes.push_back("reaping " + entry.id + ": " + st.error().message());
      continue;
    }
    (void)store.remove(entry.id);
    ++report.sandboxes;
  }
  if (other_jobs > 0) {
    report.notes.push_back(claim.state_dir + " keeps " + std::to_string(other_jobs) +
                           " sandbox(es) of other jobs, and its layer mounts");
    return true;
  }
  // No record is left: a cgroup under the parent is what a dead agent of this directory had not recorded yet.
  if (auto leftovers = (*backend)->listLeftovers(); leftovers.ok()) {
    for (const auto& id : *leftovers) {
      if (auto st = (*backend)->reapLeftover(id); st.ok()) {
        ++report.leftovers;
      } else {
        report.notes.push_back("reaping leftover " + id + ": " + st.error().message());
      }
    }
  }
  removeEmptyCgroupParent(claim.cgroup_parent);
  report.mounts += releaseLayerMounts(claim.state_dir, report);
  return true;
}

}  // namespace

Result<StateDirLock> StateDirLock::acquire(const std::string& dir, const std::string& slurm_job) {
  std::string path = dir + "/agent.lock";
  StateDirLock lock;
  lock.fd_.reset(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!lock.fd_) return Error::sys(errno, "open " + path);
  while (::flock(lock.fd_.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) return Error::sys(errno, "lock " + path);
    auto holder = readFile(path);
    std::string who = holder.ok() && !trim(*holder).empty() ? " (" + trim(*holder) + ")" : "";
    return Error(ErrorCode::kConflict, "node directory " + dir + " is in use by another process" + who);
  }
  std::string holder = "pid " + std::to_string(::getpid()) + (slurm_job.empty() ? "" : ", Slurm job " + slurm_job);
  // Only for the message another process gets: a failed write changes nothing about the lock.
  if (::ftruncate(lock.fd_.get(), 0) == 0 && ::pwrite(lock.fd_.get(), holder.data(), holder.size(), 0) < 0) {
    DSEC_LOG(kDebug, kLog) << "cannot note the holder in " << path;
  }
  return lock;
}

std::string currentHostName() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return host;
}

Status registerJobClaim(const std::string& registry_dir, const JobClaim& claim) {
  if (!isJobId(claim.job)) return Error::invalid("Slurm job id '" + claim.job + "' is not a number");
  DSEC_TRY(makePrivateDir(registry_dir + "/" + claim.job));
  json j{{"job", claim.job},
         {"host", claim.host},
         {"node", claim.node},
         {"state_dir", claim.state_dir},
         {"cgroup_parent", claim.cgroup_parent},
         {"pid", claim.pid}};
  return writeFileAtomic(claimPath(registry_dir, claim), j.dump(), 0600, Durability::kSurvivesAgentCrash);
}

namespace {
// Removes the claim; ok when there was none.
Status removeJobClaim(const std::string& registry_dir, const JobClaim& claim) {
  if (!isJobId(claim.job)) return okStatus();
  std::string path = claimPath(registry_dir, claim);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return Error::sys(errno, "remove " + path);
  (void)::rmdir((registry_dir + "/" + claim.job).c_str());  // the job's last claim on this machine
  return okStatus();
}
}  // namespace

void dropOtherJobsClaims(const std::string& registry_dir, const JobClaim& claim) {
  auto jobs = listDirectory(registry_dir);
  const auto* listed = jobs.ifOk();
  if (listed == nullptr) return;
  for (const auto& e : *listed) {
    if (e.name == claim.job || !isJobId(e.name)) continue;
    JobClaim theirs = claim;
    theirs.job = e.name;
    (void)removeJobClaim(registry_dir, theirs);
  }
}

Result<JobCleanupReport> cleanUpSlurmJob(const std::string& registry_dir, const std::string& job,
                                         const std::string& host) {
  if (!isJobId(job)) return Error::invalid("Slurm job id '" + job + "' is not a number");
  JobCleanupReport report;
  std::string dir = registry_dir + "/" + job;
  auto entries = listDirectory(dir);
  if (!entries.ok()) {
    if (entries.error().code() == ErrorCode::kNotFound) return report;  // the job ran no agent here
    return entries.error();
  }
  for (const auto& e : *entries) {
    if (e.name.size() < 5 || e.name.compare(e.name.size() - 5, 5, ".json") != 0) continue;
    std::string path = dir + "/" + e.name;
    auto claim = readClaim(path);
    if (!claim.ok()) {
      report.notes.push_back(claim.error().message());
      continue;
    }
    if (claim->host != host || claim->job != job) continue;  // another node's (sharing this /run) or misplaced
    ++report.directories;
    if (cleanUpClaim(*claim, report)) ::unlink(path.c_str());
  }
  (void)::rmdir(dir.c_str());
  if (report.sandboxes || report.leftovers || report.mounts) {
    DSEC_LOG(kInfo, kLog) << "Slurm job " << job << " ended: destroyed " << report.sandboxes << " sandbox(es) and "
                          << report.leftovers << " unrecorded cgroup(s), released " << report.mounts
                          << " layer mount(s)";
  }
  return report;
}

void removeEmptyCgroupParent(const std::string& parent) {
  // The backend creates <hierarchy>/<parent> on demand; with no sandbox left it is an empty directory per
  // hierarchy. rmdir only succeeds on an empty cgroup, so a sandbox of another agent is never touched.
  if (parent.empty() || parent.find('/') != std::string::npos || parent[0] == '.') return;
  (void)::rmdir(("/sys/fs/cgroup/" + parent).c_str());
  auto listed = listDirectory("/sys/fs/cgroup");
  const auto* hierarchies = listed.ifOk();  // (called from destructors: nothing here may throw)
  if (hierarchies == nullptr) return;
  for (const auto& h : *hierarchies) {
    if (h.name[0] != '.') (void)::rmdir(("/sys/fs/cgroup/" + h.name + "/" + parent).c_str());
  }
}

}  // namespace dsec::launcher
