// What the agent makes of a refused file call (FileWatch.h): its paths as the sandbox sees them, and whether one is
// protected. Best effort by nature: the caller may be gone when its event is read (then a relative path cannot be
// resolved and is left out) and the files may have changed since the call.
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <set>

#include "FileWatch.h"
#include "FileWatchMaps.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Strings.h"

namespace dsec::backends {
namespace {

#define DSEC_FW_NAME(name) #name,
const char* const kCallNames[] = {DSEC_FW_CALLS(DSEC_FW_NAME)};
#undef DSEC_FW_NAME

// Calls that act on what a symlink at the path points to (open without O_NOFOLLOW and the like): both the link
// and its target are candidates. The others act on the name itself.
bool followsLinks(uint16_t call, uint32_t flags) {
  static const std::set<uint16_t> kFollowing = {
      DSEC_FW_open,       DSEC_FW_openat,      DSEC_FW_openat2,      DSEC_FW_creat,     DSEC_FW_truncate,
      DSEC_FW_chmod,      DSEC_FW_fchmodat,    DSEC_FW_fchmodat2,    DSEC_FW_chown,     DSEC_FW_fchownat,
      DSEC_FW_utime,      DSEC_FW_utimes,      DSEC_FW_futimesat,    DSEC_FW_utimensat, DSEC_FW_setxattr,
      DSEC_FW_setxattrat, DSEC_FW_removexattr, DSEC_FW_removexattrat};
  if (kFollowing.count(call) == 0) return false;
  const bool opens = call == DSEC_FW_open || call == DSEC_FW_openat || call == DSEC_FW_openat2;
  return !(opens && (flags & O_NOFOLLOW) != 0);
}

std::optional<std::string> readLink(const std::string& path) {
  char buf[4096];
  const ssize_t n = ::readlink(path.c_str(), buf, sizeof buf);
  if (n <= 0 || static_cast<size_t>(n) >= sizeof buf) return std::nullopt;
  return std::string(buf, static_cast<size_t>(n));
}

// "/a//b/./c/" -> "/a/b/c"; ".." pops lexically (links are resolved separately, where they can be).
std::string lexicallyNormal(const std::string& path) {
  std::vector<std::string> parts;
  for (const auto& part : split(path, '/')) {
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
      continue;
    }
    parts.push_back(part);
  }
  std::string out;
  for (const auto& part : parts) out += "/" + part;
  return out.empty() ? "/" : out;
}

// The sandbox's files as one process sees them: its root, and the prefix under which the agent's readlink shows
// paths of that root (normally none: /proc links of another mount namespace read from that namespace's root).
struct SandboxView {
  pid_t pid = -1;  // the caller while it lives in the sandbox, else the sandbox's init
  bool caller = false;
  UniqueFd root;
  std::string prefix;

  std::string inside(const std::string& link) const {
    if (prefix.empty() || prefix == "/") return link;
    if (link == prefix) return "/";
    if (startsWith(link, prefix + "/")) return link.substr(prefix.size());
    return link;
  }
  std::optional<std::string> procLink(const std::string& what) const {
    auto link = readLink("/proc/" + std::to_string(pid) + "/" + what);
    if (!link) return std::nullopt;
    return inside(*link);
  }
  // The path an O_PATH open of path (in the sandbox's root, links followed or not) ends at.
  std::optional<std::string> resolve(const std::string& path, bool follow) const {
    open_how how{};
    how.flags = O_PATH | O_CLOEXEC | (follow ? 0 : O_NOFOLLOW);
    how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
    UniqueFd fd(static_cast<int>(::syscall(SYS_openat2, root.get(), path.c_str(), &how, sizeof how)));
    if (!fd) return std::nullopt;
    auto link = readLink("/proc/self/fd/" + std::to_string(fd.get()));
    if (!link) return std::nullopt;
    return inside(*link);
  }
};

SandboxView viewFor(const dsec_fw_event& event, pid_t init_pid) {
  SandboxView view;
  struct stat ns {};
  if (event.tgid != 0 && ::stat(("/proc/" + std::to_string(event.tgid) + "/ns/mnt").c_str(), &ns) == 0 &&
      ns.st_ino == event.mntns) {
    view.pid = static_cast<pid_t>(event.tgid);
    view.caller = true;
  } else {
    view.pid = init_pid;
  }
  const std::string root = "/proc/" + std::to_string(view.pid) + "/root";
  view.root = UniqueFd(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  view.prefix = readLink(root).value_or("/");
  return view;
}

// The candidates for one (dirfd, path) pair of the call.
void addCandidates(const SandboxView& view, int dirfd, const std::string& path, bool no_path, bool follow,
                   std::vector<std::string>& out) {
  std::string full;
  if (!path.empty() && path[0] == '/') {
    full = path;
  } else {
    if (!view.caller) return;  // relative to a directory of a process that is gone
    auto base = dirfd == AT_FDCWD ? view.procLink("cwd") : view.procLink("fd/" + std::to_string(dirfd));
    if (!base || (*base)[0] != '/') return;  // an fd that is not a path (pipe:[...]) or gone
    full = no_path ? *base : *base + "/" + path;
  }
  const std::string normal = lexicallyNormal(full);
  if (normal != "/" && view.root) {
    const size_t slash = normal.rfind('/');
    const std::string leaf = normal.substr(slash + 1);
    auto parent = view.resolve(slash == 0 ? "/" : normal.substr(0, slash), true);
    out.push_back(parent ? lexicallyNormal(*parent + "/" + leaf) : normal);
  } else {
    out.push_back(normal);
  }
  if (follow && view.root) {
    if (auto target = view.resolve(full, true); target && *target != out.back()) out.push_back(*target);
  }
}

bool under(const std::string& path, const std::string& root) {
  return path == root || (root == "/" ? true : startsWith(path, root + "/"));
}

}  // namespace

RefusedFileCall resolveRefusedCall(const dsec_fw_event& event, pid_t init_pid) {
  RefusedFileCall call;
  call.call = event.call < DSEC_FW_CALL_COUNT ? kCallNames[event.call] : "call " + std::to_string(event.call);
  call.error = event.error;
  const SandboxView view = viewFor(event, init_pid);
  for (int i = 0; i < 2; ++i) {
    const std::string path(event.path[i], strnlen(event.path[i], DSEC_FW_PATH_MAX));
    // No path: the first pair names the file by its fd (fchmod, utimensat(fd, NULL, ...)); a second pair only
    // when the call has two paths.
    const bool no_path = path.empty();
    if (no_path && (i == 1 || event.dirfd[0] == AT_FDCWD)) continue;
    addCandidates(view, event.dirfd[i], path, no_path, followsLinks(event.call, event.flags), call.candidates);
  }
  return call;
}

std::optional<Violation> protectedPathViolation(const RefusedFileCall& call,
                                                const std::vector<std::string>& protected_paths) {
  Violation v;
  v.kind = ViolationKind::kFile;
  for (const auto& candidate : call.candidates) {
    for (const auto& protected_path : protected_paths) {
      if (!under(candidate, protected_path)) continue;
      v.target = candidate;
      v.detail = call.call + ": " + std::strerror(call.error) + " (protected path)";
      return v;
    }
  }
  // Moving or removing a directory above a protected path: refused because it is pinned (a mount point).
  if (call.error != EBUSY) return std::nullopt;
  for (const auto& candidate : call.candidates) {
    for (const auto& protected_path : protected_paths) {
      if (candidate == protected_path || !under(protected_path, candidate)) continue;
      v.target = candidate;
      v.detail = call.call + ": " + std::strerror(call.error) + " (parent of protected path " + protected_path + ")";
      return v;
    }
  }
  return std::nullopt;
}

}  // namespace dsec::backends
