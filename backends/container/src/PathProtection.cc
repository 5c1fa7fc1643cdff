#include "PathProtection.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <set>

#include "MountHelper.h"
#include "SandboxFiles.h"
#include "dsec/common/Directory.h"

namespace dsec::backends {
namespace {

bool isUnder(const std::string& path, const std::string& dir) {
  return path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 && path[dir.size()] == '/';
}

std::string parentOf(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == 0 ? "/" : path.substr(0, slash);
}

size_t depth(const std::string& path) { return static_cast<size_t>(std::count(path.begin(), path.end(), '/')); }

Error checkError(int err, const std::string& path) {
  const std::string what = "protect: \"" + path + "\" ";
  if (err == ENOENT) return Error(ErrorCode::kNotFound, what + "does not exist in the sandbox", err);
  if (err == ELOOP) {
    return Error(ErrorCode::kInvalidArgument, what + "has a symlink in it (protect the path it points to)", err);
  }
  if (err == ENOTDIR) {
    return Error(ErrorCode::kInvalidArgument,
                 what +
                     "is not a directory or regular file (or a parent is not a "
                     "directory)",
                 err);
  }
  return Error::sys(err, what.substr(0, what.size() - 1));
}

std::vector<MountOp> mountOps(const ProtectionPlan& plan) {
  std::vector<MountOp> ops;
  for (const auto& p : plan.read_only) ops.push_back({MountOp::kBindReadOnly, p});
  for (const auto& p : plan.parents) ops.push_back({MountOp::kBindSelf, p});
  return ops;
}

std::vector<MountOp> unmountOps(const ProtectionPlan& plan) {
  std::vector<MountOp> ops;
  for (auto it = plan.parents.rbegin(); it != plan.parents.rend(); ++it) ops.push_back({MountOp::kUnmount, *it});
  for (auto it = plan.read_only.rbegin(); it != plan.read_only.rend(); ++it) ops.push_back({MountOp::kUnmount, *it});
  return ops;
}

// "/" first, then every planned mount point.
std::vector<std::string> cloneKeys(const ProtectionPlan& plan) {
  std::vector<std::string> keys = {"/"};
  keys.insert(keys.end(), plan.read_only.begin(), plan.read_only.end());
  keys.insert(keys.end(), plan.parents.begin(), plan.parents.end());
  return keys;
}

int openInClone(int root, const std::string& path, uint64_t flags) {
  open_how how{};
  how.flags = flags | O_CLOEXEC;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
  return static_cast<int>(syscall(SYS_openat2, root, path.c_str(), &how, sizeof how));
}

struct LinkedFile {
  nlink_t nlink = 0;
  std::vector<std::string> paths;  // inside the clone they were found in
};
using LinkedFiles = std::map<std::pair<dev_t, ino_t>, LinkedFile>;

// Regular files with more than one link below dir (an open directory at path inside the clone).
Status collectLinked(int dir_fd, const std::string& path, LinkedFiles& out) {
  DSEC_ASSIGN_OR_RETURN(auto entries, listDirectoryAt(dir_fd, path));
  for (const auto& e : entries) {
    const std::string child = path == "/" ? "/" + e.name : path + "/" + e.name;
    struct stat st;
    if (fstatat(dir_fd, e.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      UniqueFd sub(openat(dir_fd, e.name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!sub) return Error::sys(errno, "open " + child);
      DSEC_TRY(collectLinked(sub.get(), child, out));
    } else if (S_ISREG(st.st_mode) && st.st_nlink > 1) {
      auto& f = out[{st.st_dev, st.st_ino}];
      f.nlink = st.st_nlink;
      f.paths.push_back(child);
    }
  }
  return okStatus();
}

// Gives the file at path (inside the clone root) an inode of its own: a copy with the same owner, mode and
// times, renamed over it.
Status copyToOwnInode(int root, const std::string& path) {
  const std::string dir = parentOf(path), name = path.substr(path.rfind('/') + 1);
  UniqueFd dir_fd(openInClone(root, dir, O_PATH | O_DIRECTORY));
  if (!dir_fd) return Error::sys(errno, "open " + dir);
  UniqueFd src(openat(dir_fd.get(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!src) return Error::sys(errno, "open " + path);
  struct stat st;
  if (fstat(src.get(), &st) != 0 || !S_ISREG(st.st_mode)) return Error::sys(errno ? errno : EINVAL, "stat " + path);
  const std::string tmp = ".dsec-own-" + name.substr(0, 200);
  (void)unlinkat(dir_fd.get(), tmp.c_str(), 0);
  UniqueFd dst;
  {
    // Created as the file's owner: the sandbox's file system refuses ids its user namespace cannot map.
    ActingOwner as_owner(st.st_uid);
    dst.reset(openat(dir_fd.get(), tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  }
  if (!dst) return Error::sys(errno, "create a copy of " + path);
  for (off_t left = st.st_size; left > 0;) {
    ssize_t n = sendfile(dst.get(), src.get(), nullptr, static_cast<size_t>(std::min<off_t>(left, 1 << 30)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      (void)unlinkat(dir_fd.get(), tmp.c_str(), 0);
      return Error::sys(n < 0 ? errno : EIO, "copy " + path);
    }
    left -= n;
  }
  const timespec times[2] = {st.st_atim, st.st_mtim};
  if (fchown(dst.get(), st.st_uid, st.st_gid) != 0 || fchmod(dst.get(), st.st_mode & 07777) != 0 ||
      futimens(dst.get(), times) != 0 || renameat(dir_fd.get(), tmp.c_str(), dir_fd.get(), name.c_str()) != 0) {
    int err = errno;
    (void)unlinkat(dir_fd.get(), tmp.c_str(), 0);
    return Error::sys(err, "replace " + path + " by its copy");
  }
  return okStatus();
}

}  // namespace

ProtectionPlan planProtection(const std::vector<std::string>& normal_paths) {
  ProtectionPlan plan;
  std::vector<std::string> sorted = normal_paths;
  std::sort(sorted.begin(), sorted.end());
  for (const auto& p : sorted) {
    bool covered = std::any_of(sorted.begin(), sorted.end(), [&](const std::string& q) { return isUnder(p, q); });
    if (!covered) plan.read_only.push_back(p);
  }
  std::set<std::string> parents;
  for (const auto& p : plan.read_only) {
    for (std::string d = parentOf(p); d != "/"; d = parentOf(d)) parents.insert(d);
  }
  plan.parents.assign(parents.begin(), parents.end());
  std::stable_sort(plan.parents.begin(), plan.parents.end(),
                   [](const std::string& a, const std::string& b) { return depth(a) < depth(b); });
  return plan;
}

PathProtection::PathProtection(std::vector<std::string> paths)
    : paths_(std::move(paths)), plan_(planProtection(paths_)) {}

std::vector<std::string> PathProtection::paths() const {
  std::lock_guard lock(mu_);
  return paths_;
}

Status PathProtection::change(int init_pidfd, const std::vector<std::string>& next) {
  std::lock_guard lock(mu_);
  const ProtectionPlan next_plan = planProtection(next);
  std::vector<MountOp> ops;
  for (const auto& p : next_plan.read_only) ops.push_back({MountOp::kCheck, p});
  for (const auto& p : next_plan.parents) ops.push_back({MountOp::kCheckDir, p});
  const size_t checks = ops.size();
  for (auto& op : unmountOps(plan_)) ops.push_back(std::move(op));
  const size_t mounts_start = ops.size();
  for (auto& op : mountOps(next_plan)) ops.push_back(std::move(op));
  const size_t clones_start = ops.size();
  const std::vector<std::string> keys = next.empty() ? std::vector<std::string>{} : cloneKeys(next_plan);
  for (const auto& k : keys) ops.push_back({MountOp::kCloneWritable, k});

  DSEC_ASSIGN_OR_RETURN(MountOpsResult done, runMountOps(init_pidfd, ops));
  if (done.failed < checks) return checkError(done.error, ops[done.failed].path);
  if (done.failed < clones_start) {
    // Put back what was there: undo this change's mounts, make the previous set's again.
    std::vector<MountOp> undo;
    for (size_t i = done.failed; i > mounts_start; --i) undo.push_back({MountOp::kUnmount, ops[i - 1].path});
    for (auto& op : mountOps(plan_)) undo.push_back(std::move(op));
    auto undone = runMountOps(init_pidfd, undo);
    Error e = Error::sys(done.error, "protect: mount " + ops[done.failed].path + " in the sandbox");
    if (!undone.ok() || undone->failed != undo.size()) {
      return e.wrap("and the previous protection could not be restored");
    }
    return e;
  }
  paths_ = next;
  plan_ = next_plan;
  clones_.clear();
  if (done.failed < ops.size()) {
    // Protection is in force; the file API's route is made again on first use.
    return Error::sys(done.error, "protect: clone the mount at " + ops[done.failed].path + " for the file API");
  }
  for (size_t i = 0; i < keys.size(); ++i) clones_[keys[i]] = std::move(done.clones[i]);
  return breakOutsideLinks();
}

Status PathProtection::loadClones(int init_pidfd) {
  const std::vector<std::string> keys = cloneKeys(plan_);
  std::vector<MountOp> ops;
  for (const auto& k : keys) ops.push_back({MountOp::kCloneWritable, k});
  DSEC_ASSIGN_OR_RETURN(MountOpsResult done, runMountOps(init_pidfd, ops));
  if (done.failed < ops.size()) {
    return Error::sys(done.error, "clone the mount at " + ops[done.failed].path + " for the file API");
  }
  for (size_t i = 0; i < keys.size(); ++i) clones_[keys[i]] = std::move(done.clones[i]);
  return okStatus();
}

Result<std::optional<FileRoute>> PathProtection::routeFor(int init_pidfd, const std::string& normal_path) {
  std::lock_guard lock(mu_);
  if (paths_.empty()) return std::optional<FileRoute>();
  if (clones_.empty()) DSEC_TRY(loadClones(init_pidfd));
  // The deepest planned mount point strictly above the path: its clone holds the path with nothing mounted over
  // it. A planned mount point right below / is found in the clone of /.
  std::string best;
  for (const auto& [key, fd] : clones_) {
    if (key != "/" && isUnder(normal_path, key) && key.size() > best.size()) best = key;
  }
  std::string inside;
  if (!best.empty()) {
    inside = normal_path.substr(best.size());
  } else if (clones_.count(normal_path) != 0) {
    best = "/";
    inside = normal_path;
  } else {
    return std::optional<FileRoute>();
  }
  UniqueFd root(fcntl(clones_.at(best).get(), F_DUPFD_CLOEXEC, 0));
  if (!root) return Error::sys(errno, "dup a protected mount's clone");
  return std::optional<FileRoute>(FileRoute{std::move(root), std::move(inside)});
}

void PathProtection::release() {
  std::lock_guard lock(mu_);
  clones_.clear();
}

Status PathProtection::breakOutsideLinks() {
  // Each entry: "<clone key>\n<path inside that clone>".
  LinkedFiles linked;
  for (const auto& p : plan_.read_only) {
    auto& clone = clones_.at(p);
    struct stat st;
    if (fstatat(clone.get(), "", &st, AT_EMPTY_PATH) != 0) return Error::sys(errno, "stat " + p);
    if (S_ISREG(st.st_mode)) {
      if (st.st_nlink > 1) {
        // A protected file of its own: replaced through the clone its parent is in.
        const std::string parent = parentOf(p);
        const std::string key = clones_.count(parent) != 0 ? parent : std::string("/");
        auto& f = linked[{st.st_dev, st.st_ino}];
        f.nlink = st.st_nlink;
        f.paths.push_back(key + "\n" + (key == "/" ? p : p.substr(key.size())));
      }
      continue;
    }
    UniqueFd dir(openInClone(clone.get(), "/", O_RDONLY | O_DIRECTORY));
    if (!dir) return Error::sys(errno, "open " + p);
    LinkedFiles here;
    DSEC_TRY(collectLinked(dir.get(), "/", here));
    for (auto& [inode, f] : here) {
      auto& all = linked[inode];
      all.nlink = f.nlink;
      for (auto& path : f.paths) all.paths.push_back(p + "\n" + path);
    }
  }
  for (const auto& [inode, f] : linked) {
    if (f.paths.size() >= f.nlink) continue;  // every link is protected
    for (const auto& entry : f.paths) {
      const size_t nl = entry.find('\n');
      DSEC_TRY(copyToOwnInode(clones_.at(entry.substr(0, nl)).get(), entry.substr(nl + 1)));
    }
  }
  return okStatus();
}

}  // namespace dsec::backends
