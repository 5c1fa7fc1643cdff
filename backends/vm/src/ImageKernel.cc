#include "dsec/backends/vm/ImageKernel.h"

#include <fcntl.h>
#include <linux/mount.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <sstream>

#include "dsec/backends/vm/Initramfs.h"
#include "dsec/common/Directory.h"
#include "dsec/common/Strings.h"

namespace dsec::backends::vm {
namespace {

constexpr int64_t kMaxKernelBytes = 256ll << 20;
constexpr int64_t kMaxModuleBytes = 64ll << 20;
constexpr int64_t kMaxIndexBytes = 16ll << 20;  // modules.dep, modules.builtin
constexpr size_t kMaxModules = 64;

// What the agent needs on q35 (PCI); `optional` ones only lose a feature (the balloon: reclaim).
struct WantedModule {
  const char* name;
  bool optional;
};
constexpr WantedModule kWanted[] = {{"virtio_pci", false},    {"virtio_blk", false}, {"virtio_console", false},
                                    {"virtio_balloon", true}, {"erofs", false},      {"overlay", false}};

// Opens rel inside the image: symlinks resolve against the image's root, never the host's.
Result<UniqueFd> openIn(int root_fd, const std::string& rel, int flags) {
  open_how how{};
  how.flags = static_cast<uint64_t>(flags) | O_CLOEXEC;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
  int fd = static_cast<int>(syscall(SYS_openat2, root_fd, rel.c_str(), &how, sizeof how));
  if (fd < 0) return Error::sys(errno, "open /" + rel + " in the image");
  return UniqueFd(fd);
}

// A regular file of the image, whole, at most `limit` bytes.
Result<std::string> readIn(int root_fd, const std::string& rel, int64_t limit) {
  DSEC_ASSIGN_OR_RETURN(UniqueFd fd, openIn(root_fd, rel, O_RDONLY | O_NOFOLLOW | O_NONBLOCK));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Error::sys(errno, "stat /" + rel + " in the image");
  if (!S_ISREG(st.st_mode)) return Error::invalid("/" + rel + " in the image is not a regular file");
  if (st.st_size > limit) {
    return Error::invalid("/" + rel + " in the image is larger than " + formatBytes(limit));
  }
  std::string data(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < data.size()) {
    ssize_t n = ::read(fd.get(), data.data() + got, data.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error::sys(errno, "read /" + rel + " in the image");
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  data.resize(got);
  return data;
}

bool isExecutableFile(int root_fd, const std::string& rel) {
  auto fd = openIn(root_fd, rel, O_PATH);
  struct stat st {};
  return fd.ok() && ::fstat(fd->get(), &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 0111) != 0;
}

bool isDirectory(int root_fd, const std::string& rel) {
  auto fd = openIn(root_fd, rel, O_PATH | O_DIRECTORY);
  return fd.ok();
}

bool validRelease(const std::string& release) {
  if (release.empty() || release.size() > 128 || release[0] == '.') return false;
  return std::all_of(release.begin(), release.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || strchr("._+-~", c); });
}

// "vmlinuz-<release>" -> release ("" when name is not one).
std::string releaseOf(const std::string& name) {
  constexpr std::string_view kPrefix = "vmlinuz-";
  if (!name.starts_with(kPrefix)) return "";
  std::string release = name.substr(kPrefix.size());
  return validRelease(release) ? release : "";
}

// A symlink's target's release: Debian keeps /vmlinuz (or /boot/vmlinuz) pointing at the current kernel.
std::string releaseOfLink(int root_fd, const std::string& rel) {
  char target[4096];
  std::string dir = rel.find('/') == std::string::npos ? "" : rel.substr(0, rel.rfind('/'));
  auto parent = dir.empty() ? Result<UniqueFd>(UniqueFd(::dup(root_fd))) : openIn(root_fd, dir, O_PATH | O_DIRECTORY);
  if (!parent.ok() || !*parent) return "";
  std::string name = rel.substr(rel.rfind('/') == std::string::npos ? 0 : rel.rfind('/') + 1);
  ssize_t n = ::readlinkat(parent->get(), name.c_str(), target, sizeof target - 1);
  if (n <= 0) return "";
  std::string t(target, static_cast<size_t>(n));
  return releaseOf(t.substr(t.rfind('/') == std::string::npos ? 0 : t.rfind('/') + 1));
}

// modules.dep's name of a module path: basename without .ko[.xz|.zst|.gz], '-' as '_'.
std::string moduleName(const std::string& path) {
  std::string base = path.substr(path.rfind('/') == std::string::npos ? 0 : path.rfind('/') + 1);
  size_t ko = base.find(".ko");
  if (ko != std::string::npos) base.resize(ko);
  std::replace(base.begin(), base.end(), '-', '_');
  return base;
}

bool safeModulePath(const std::string& path) {
  if (path.empty() || path[0] == '/' || path.size() > 512) return false;
  for (const auto& part : split(path, '/')) {
    if (part.empty() || part == "." || part == "..") return false;
  }
  std::string base = path.substr(path.rfind('/') == std::string::npos ? 0 : path.rfind('/') + 1);
  return isModuleFileName(base);
}

}  // namespace

Result<UniqueFd> openImageView(const std::vector<std::string>& lower_dirs) {
  if (lower_dirs.empty()) return Error::invalid("an image without layers");
  if (lower_dirs.size() == 1) {
    UniqueFd fd(::open(lower_dirs[0].c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!fd) return Error::sys(errno, "open layer " + lower_dirs[0]);
    return fd;
  }
  std::string lower;
  for (auto it = lower_dirs.rbegin(); it != lower_dirs.rend(); ++it) {
    if (it->find_first_of(":,\\") != std::string::npos) return Error::invalid("layer path overlay cannot take: " + *it);
    lower += (lower.empty() ? "" : ":") + *it;
  }
  UniqueFd fs(static_cast<int>(syscall(SYS_fsopen, "overlay", FSOPEN_CLOEXEC)));
  if (!fs) return Error::sys(errno, "fsopen overlay");
  if (syscall(SYS_fsconfig, fs.get(), FSCONFIG_SET_STRING, "lowerdir", lower.c_str(), 0) != 0) {
    return Error::sys(errno, "overlay lowerdir " + lower);
  }
  if (syscall(SYS_fsconfig, fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0) {
    return Error::sys(errno, "overlay of the image's layers");
  }
  UniqueFd mnt(static_cast<int>(syscall(SYS_fsmount, fs.get(), FSMOUNT_CLOEXEC,
                                        MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC)));
  if (!mnt) return Error::sys(errno, "fsmount the image's overlay");
  return mnt;
}

Result<std::optional<ImageKernel>> findImageKernel(int image_root_fd) {
  ImageKernel k;
  for (const char* link : {"vmlinuz", "boot/vmlinuz"}) {
    std::string release = releaseOfLink(image_root_fd, link);
    if (!release.empty() && isDirectory(image_root_fd, "boot") &&
        openIn(image_root_fd, "boot/vmlinuz-" + release, O_PATH).ok()) {
      k.release = release;
      break;
    }
  }
  if (k.release.empty()) {
    auto boot = openIn(image_root_fd, "boot", O_RDONLY | O_DIRECTORY);
    if (!boot.ok()) return std::optional<ImageKernel>();
    DSEC_ASSIGN_OR_RETURN(auto entries, listDirectoryAt(boot->get(), "/boot in the image"));
    for (const auto& e : entries) {
      std::string release = releaseOf(e.name);
      if (release.empty() || e.is_dir) continue;
      if (k.release.empty() || strverscmp(release.c_str(), k.release.c_str()) > 0) k.release = release;
    }
    if (k.release.empty()) return std::optional<ImageKernel>();
  }
  k.kernel_path = "boot/vmlinuz-" + k.release;
  for (const char* dir : {"lib/modules/", "usr/lib/modules/"}) {
    if (isDirectory(image_root_fd, dir + k.release)) {
      k.modules_dir = std::string(dir) + k.release;
      break;
    }
  }
  if (k.modules_dir.empty()) {
    return Error::invalid("the image has kernel " + k.release + " but no /lib/modules/" + k.release +
                          " (install its modules with the kernel package)");
  }
  if (!openIn(image_root_fd, k.modules_dir + "/modules.dep", O_PATH).ok()) {
    return Error::invalid("the image's kernel " + k.release + " has no modules.dep (run `depmod " + k.release +
                          "` in the image)");
  }
  if (isExecutableFile(image_root_fd, "sbin/init")) k.init = "/sbin/init";
  return std::optional<ImageKernel>(std::move(k));
}

Result<std::vector<std::string>> imageKernelModules(int image_root_fd, const ImageKernel& kernel) {
  DSEC_ASSIGN_OR_RETURN(std::string dep_text,
                        readIn(image_root_fd, kernel.modules_dir + "/modules.dep", kMaxIndexBytes));
  std::set<std::string> builtin;
  if (auto text = readIn(image_root_fd, kernel.modules_dir + "/modules.builtin", kMaxIndexBytes); text.ok()) {
    std::istringstream lines(*text);
    for (std::string line; std::getline(lines, line);) builtin.insert(moduleName(trim(line)));
  }
  std::map<std::string, std::string> path_of;               // name -> path
  std::map<std::string, std::vector<std::string>> deps_of;  // path -> its dependencies' paths
  std::istringstream lines(dep_text);
  for (std::string line; std::getline(lines, line);) {
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string path = trim(line.substr(0, colon));
    if (!safeModulePath(path)) continue;
    std::vector<std::string> deps;
    for (const auto& d : split(trim(line.substr(colon + 1)), ' ')) {
      if (!d.empty()) deps.push_back(d);
    }
    path_of.emplace(moduleName(path), path);
    deps_of[path] = std::move(deps);
  }
  std::vector<std::string> order;
  std::set<std::string> seen;
  // Dependencies first; modules.dep lists a module's whole closure, but visiting recursively keeps the order right.
  auto visit = [&](auto&& self, const std::string& path, int depth) -> Status {
    if (seen.count(path) != 0) return okStatus();
    if (depth > 32 || !safeModulePath(path))
      return Error::invalid("modules.dep of " + kernel.release + ": bad " + path);
    seen.insert(path);
    for (const auto& d : deps_of[path]) DSEC_TRY(self(self, d, depth + 1));
    order.push_back(path);
    if (order.size() > kMaxModules) return Error::invalid("modules.dep of " + kernel.release + ": too many modules");
    return okStatus();
  };
  for (const auto& w : kWanted) {
    if (builtin.count(w.name) != 0) continue;
    auto it = path_of.find(w.name);
    if (it == path_of.end()) {
      if (w.optional) continue;
      return Error::invalid(std::string("the image's kernel ") + kernel.release + " has no " + w.name +
                            " module (neither built in nor in modules.dep)");
    }
    DSEC_TRY(visit(visit, it->second, 0));
  }
  return order;
}

Result<std::string> prepareImageKernelDir(int image_root_fd, const ImageKernel& kernel, const std::string& cache_root) {
  DSEC_ASSIGN_OR_RETURN(std::string vmlinuz, readIn(image_root_fd, kernel.kernel_path, kMaxKernelBytes));
  DSEC_ASSIGN_OR_RETURN(auto paths, imageKernelModules(image_root_fd, kernel));
  std::vector<std::pair<std::string, std::string>> modules;  // file name -> bytes
  std::set<std::string> names;
  for (const auto& p : paths) {
    std::string name = p.substr(p.rfind('/') == std::string::npos ? 0 : p.rfind('/') + 1);
    if (!names.insert(name).second) return Error::invalid("two modules named " + name + " in " + kernel.release);
    DSEC_ASSIGN_OR_RETURN(std::string bytes, readIn(image_root_fd, kernel.modules_dir + "/" + p, kMaxModuleBytes));
    modules.emplace_back(name, std::move(bytes));
  }
  uint64_t hash = 14695981039346656037ull;  // FNV-1a over everything the dir will hold
  auto mix = [&](std::string_view bytes) {
    for (unsigned char c : bytes) hash = (hash ^ c) * 1099511628211ull;
    hash = (hash ^ 0xff) * 1099511628211ull;
  };
  mix(kernel.release);
  mix(vmlinuz);
  for (const auto& [name, bytes] : modules) {
    mix(name);
    mix(bytes);
  }
  char leaf[64];
  std::snprintf(leaf, sizeof leaf, "/kernel-%016llx", static_cast<unsigned long long>(hash));
  const std::string dir = cache_root + leaf;
  if (::access((dir + "/VERSION").c_str(), R_OK) == 0) return dir;

  DSEC_TRY(makePrivateDir(cache_root));
  const std::string tmp = dir + ".tmp." + std::to_string(::getpid()) + "." + randomHex(8);
  auto write_all = [&]() -> Status {
    DSEC_TRY(makeDirs(tmp + "/modules", 0755));
    DSEC_TRY(writeFile(tmp + "/vmlinuz", vmlinuz));
    std::string order;
    for (const auto& [name, bytes] : modules) {
      DSEC_TRY(writeFile(tmp + "/modules/" + name, bytes));
      order += name + "\n";
    }
    DSEC_TRY(writeFile(tmp + "/modules.order", order));
    return writeFile(tmp + "/VERSION", "image kernel " + kernel.release + "\n");
  };
  Status written = write_all();
  if (written.ok() && ::chmod(tmp.c_str(), 0755) != 0) written = Error::sys(errno, "chmod " + tmp);
  if (written.ok() && ::rename(tmp.c_str(), dir.c_str()) != 0) {
    // Another sandbox wrote the same dir first: theirs is as good.
    if (errno != ENOTEMPTY && errno != EEXIST) written = Error::sys(errno, "rename " + tmp);
  }
  (void)removeTree(tmp);
  if (!written.ok()) return written.error().wrap("preparing the image's kernel " + kernel.release);
  return dir;
}

}  // namespace dsec::backends::vm
