#include "dsec/fs3/LayerStore.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "AptSources.h"
#include "Erofs.h"
#include "Manifest.h"
#include "StagingDir.h"
#include "dsec/common/Directory.h"
#include "dsec/common/Fault.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/MountInfo.h"

namespace dsec::fs3 {
namespace {

constexpr const char* kImageFile = "layer.erofs";
constexpr const char* kManifestFile = "manifest.json";

Error alreadyExists(const LayerRef& ref) {
  return Error(ErrorCode::kAlreadyExists,
               "layer " + ref.toString() + " already exists; layers are immutable - build a new version");
}

bool pathExists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

Status checkSourceDir(const std::string& dir) {
  if (dir.empty()) return Error::invalid("no source directory given");
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    int err = errno;
    if (err == ENOENT) return Error(ErrorCode::kInvalidArgument, "source directory " + dir + " does not exist", err);
    return Error(ErrorCode::kInvalidArgument, Error::sys(err, "source directory " + dir).message(), err);
  }
  if (!S_ISDIR(st.st_mode)) return Error::invalid("source " + dir + " is not a directory");
  return okStatus();
}

Status checkSuite(const std::string& suite) {
  bool ok = !suite.empty() && suite.size() <= 64 && std::isalnum(static_cast<unsigned char>(suite[0]));
  for (char c : suite) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_');
  if (!ok) return Error::invalid("invalid debootstrap suite '" + suite + "' (e.g. bookworm)");
  return okStatus();
}

// debootstrap copies the build host's resolv.conf and hostname into the tree; neither belongs in a layer
// shared by every sandbox. An empty resolv.conf means "localhost resolver" and is a valid bind-mount target
// for a backend that gives a sandbox network.
Status sanitizeDebootstrapTree(const std::string& rootfs, const std::string& suite, const std::string& mirror) {
  std::string resolv = rootfs + "/etc/resolv.conf";
  if (::unlink(resolv.c_str()) != 0 && errno != ENOENT) return Error::sys(errno, "unlink " + resolv);
  DSEC_TRY(writeFileAtomic(resolv, "", 0644));
  DSEC_TRY(writeFileAtomic(rootfs + "/etc/hostname", "localhost\n", 0644));
  std::string sources = rootfs + "/etc/apt/sources.list";
  auto text = readFile(sources);
  if (!text.ok() || trim(*text).empty()) {
    DSEC_TRY(writeFileAtomic(sources, "deb " + mirror + " " + suite + " main\n", 0644));
  }
  return okStatus();
}

}  // namespace

LayerStore::LayerStore(std::string root) {
  std::error_code ec;
  auto abs = std::filesystem::absolute(root.empty() ? std::string(".") : root, ec);
  root_ = ec ? root : abs.lexically_normal().string();
  while (root_.size() > 1 && root_.back() == '/') root_.pop_back();
}

Status LayerStore::init() {
  if (root_.empty()) return Error::invalid("empty store root");
  DSEC_TRY(makeDirs(root_, 0755));
  DSEC_TRY(makeDirs(layersDir(), 0755));
  return removeStaleStagingDirs(layersDir());
}

std::string LayerStore::layerDir(const LayerRef& ref) const { return layersDir() + "/" + ref.name + "/" + ref.version; }
std::string LayerStore::imagePath(const LayerRef& ref) const { return layerDir(ref) + "/" + kImageFile; }
std::string LayerStore::mountDir(const LayerRef& ref) const { return root_ + "/mnt/" + ref.name + "/" + ref.version; }

Result<LayerManifest> LayerStore::buildFromDir(const LayerRef& ref, const std::string& dir, const std::string& built_on,
                                               const std::string& source) {
  DSEC_TRY(validateLayerRef(ref));
  DSEC_TRY(checkSourceDir(dir));
  if (pathExists(layerDir(ref))) return alreadyExists(ref);
  DSEC_TRY(makeDirs(layersDir(), 0755));
  DSEC_ASSIGN_OR_RETURN(StagingDir staging, StagingDir::create(layersDir()));
  return publish(ref, staging, dir, built_on, source.empty() ? "dir:" + dir : source);
}

Result<LayerManifest> LayerStore::buildFromCopyOfDir(const LayerRef& ref, const std::string& dir,
                                                     const std::string& source, const PrepareTree& prepare) {
  DSEC_TRY(validateLayerRef(ref));
  DSEC_TRY(checkSourceDir(dir));
  if (pathExists(layerDir(ref))) return alreadyExists(ref);
  DSEC_TRY(makeDirs(layersDir(), 0755));
  DSEC_ASSIGN_OR_RETURN(StagingDir staging, StagingDir::create(layersDir()));
  std::string tree = staging.path() + "/tree";
  std::string scratch = staging.path() + "/scratch";
  // --preserve=all: a failure to keep an xattr or SELinux label is not fatal, as with mkfs.erofs of dir itself.
  CommandOptions options;
  options.timeout_seconds = 3600;
  reportStep("copying " + dir);
  auto copied = runCommandChecked(
      {"cp", "-a", "--preserve=all", "--reflink=auto", "--no-target-directory", "--", dir, tree}, options);
  if (!copied.ok()) return copied.error().wrap("building layer " + ref.toString() + ": copying " + dir);
  DSEC_TRY(makeDirs(scratch, 0700));
  Status prepared = prepare(tree, scratch);
  DSEC_TRY(removeTree(scratch));  // only the image and the manifest may stay in the staging directory
  if (!prepared.ok()) return prepared.error().wrap("building layer " + ref.toString());
  return publish(ref, staging, tree, "", source.empty() ? "dir:" + dir : source);
}

Result<LayerManifest> LayerStore::buildDebootstrap(const LayerRef& ref, const std::string& suite,
                                                   const std::string& mirror_arg) {
  DSEC_TRY(validateLayerRef(ref));
  DSEC_TRY(checkSuite(suite));
  // Checked before the minutes of work, and again when the result is published.
  if (pathExists(layerDir(ref))) return alreadyExists(ref);
  if (findProgram("debootstrap").empty()) {
    return Error(ErrorCode::kUnsupported, "debootstrap not found on PATH (install debootstrap)");
  }
  std::string mirror = mirror_arg.empty() ? hostAptMirror() : mirror_arg;
  if (mirror.empty()) {
    return Error::invalid("no mirror given and no http(s) Debian mirror found in /etc/apt/sources.list(.d)");
  }
  DSEC_TRY(makeDirs(layersDir(), 0755));
  DSEC_ASSIGN_OR_RETURN(StagingDir staging, StagingDir::create(layersDir()));
  std::string rootfs = staging.path() + "/rootfs";
  DSEC_TRY(makeDirs(rootfs, 0755));
  // The tree lives only until mkfs has read it: on a tmpfs, dpkg's many fsyncs cost nothing and removing it is
  // an unmount. On disk (ext4 here) deleting the freshly unpacked 200 MB tree took 16 s of a loaded machine.
  // Without nodev/noexec (debootstrap refuses such targets); if tmpfs is unavailable, the disk it is.
  if (::mount("tmpfs", rootfs.c_str(), "tmpfs", 0, "mode=0755") != 0) {
    DSEC_LOG(kWarn, "fs3") << "tmpfs for debootstrap: " << Error::sys(errno, "mount").message() << "; using the disk";
  }
  DSEC_LOG(kInfo, "fs3") << "debootstrap " << suite << " from " << mirror << " for layer " << ref.toString();
  double start = monotonicSeconds();
  CommandOptions options;
  options.extra_env = {{"DEBIAN_FRONTEND", "noninteractive"}, {"LC_ALL", "C"}};
  options.timeout_seconds = 1800;
  if (progress_.detail) {
    options.on_line = [this](std::string_view line) {
      if (line.substr(0, 3) == "I: ") progress_.detail(line.substr(3));  // its own "I: Retrieving ..." steps
    };
  }
  reportStep("debootstrap " + suite + " from " + mirror);
  auto run = runCommand({"debootstrap", "--variant=minbase", suite, rootfs, mirror}, options);
  // debootstrap mounts /proc and /sys inside its target; a killed one leaves them there. (The tmpfs stays.)
  detachMountsUnder(rootfs, false);
  if (!run.ok()) return run.error().wrap("building layer " + ref.toString());
  if (run->exit_code != 0) {
    std::string out = run->output;
    if (auto log = readFile(rootfs + "/debootstrap/debootstrap.log"); log.ok()) out += "\n" + *log;
    if (out.size() > 4000) out = out.substr(out.size() - 4000);
    return Error(ErrorCode::kSystem, "building layer " + ref.toString() + ": debootstrap --variant=minbase " + suite +
                                         " " + mirror + " exited with status " + std::to_string(run->exit_code) + ": " +
                                         trim(out));
  }
  DSEC_LOG(kInfo, "fs3") << "debootstrap " << suite << " done in " << (monotonicSeconds() - start) << " s";
  DSEC_TRY(sanitizeDebootstrapTree(rootfs, suite, mirror));
  return publish(ref, staging, rootfs, "", "debootstrap:" + suite);
}

Result<LayerManifest> LayerStore::importImage(const LayerRef& ref, const std::string& image,
                                              const std::string& built_on, const std::string& source) {
  DSEC_TRY(validateLayerRef(ref));
  if (pathExists(layerDir(ref))) return alreadyExists(ref);
  UniqueFd in(::open(image.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!in) return Error::sys(errno, "open " + image);
  struct stat st {};
  if (::fstat(in.get(), &st) != 0) return Error::sys(errno, "stat " + image);
  if (!S_ISREG(st.st_mode)) return Error::invalid(image + " is not a regular file");
  DSEC_TRY(makeDirs(layersDir(), 0755));
  DSEC_ASSIGN_OR_RETURN(StagingDir staging, StagingDir::create(layersDir()));
  // A copy, not a link: the source may be on other storage (a fleet's shared snapshot dir) and goes on its own.
  std::string copy = staging.path() + "/" + kImageFile;
  UniqueFd out(::open(copy.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!out) return Error::sys(errno, "create " + copy);
  for (off_t left = st.st_size; left > 0;) {
    ssize_t n = ::sendfile(out.get(), in.get(), nullptr, static_cast<size_t>(std::min<off_t>(left, 1 << 30)));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error::sys(errno, "copy " + image + " into the layer store");
    if (n == 0) return Error(ErrorCode::kSystem, image + " shrank while it was imported");
    left -= n;
  }
  out.reset();
  return publish(ref, staging, "", built_on, source);
}

Result<LayerManifest> LayerStore::installImage(const LayerManifest& m,
                                               const std::function<Status(int fd)>& write_image) {
  DSEC_TRY(validateLayerRef(m.ref));
  if (pathExists(layerDir(m.ref))) return alreadyExists(m.ref);
  DSEC_TRY(makeDirs(layersDir(), 0755));
  DSEC_ASSIGN_OR_RETURN(StagingDir staging, StagingDir::create(layersDir()));
  const std::string image = staging.path() + "/" + kImageFile;
  {
    UniqueFd out(::open(image.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0444));
    if (!out) return Error::sys(errno, "create " + image);
    if (::ftruncate(out.get(), static_cast<off_t>(m.size)) != 0) return Error::sys(errno, "size " + image);
    DSEC_TRY(write_image(out.get()));
    if (::fdatasync(out.get()) != 0) return Error::sys(errno, "fsync " + image);
  }
  DSEC_TRY(writeFileAtomic(staging.path() + "/" + kManifestFile, manifestToJson(m), 0644));
  DSEC_TRY(moveIntoPlace(m.ref, staging));
  return m;
}

Status LayerStore::moveIntoPlace(const LayerRef& ref, StagingDir& staging) {
  std::string name_dir = layersDir() + "/" + ref.name;
  DSEC_TRY(makeDirs(name_dir, 0755));
  Status published = staging.publish(layerDir(ref));
  if (published.ok()) return okStatus();
  ::rmdir(name_dir.c_str());  // only if we created it and it stayed empty
  if (published.error().code() == ErrorCode::kAlreadyExists) return alreadyExists(ref);
  return published.error();
}

Result<LayerManifest> LayerStore::publish(const LayerRef& ref, StagingDir& staging, const std::string& tree,
                                          const std::string& built_on, const std::string& source) {
  std::string context = "building layer " + ref.toString();
  std::string image = staging.path() + "/" + kImageFile;
  double start = monotonicSeconds();
  reportStep("packing the EROFS image");
  Status made = tree.empty() ? okStatus() : makeErofsImage(tree, image);
  if (!made.ok()) return made.error().wrap(context);
  if (::chmod(image.c_str(), 0444) != 0) return Error::sys(errno, "chmod " + image).wrap(context);
  double mkfs_done = monotonicSeconds();
  reportStep("checksumming and publishing");
  auto digest = syncAndHashFile(image);
  if (!digest.ok()) return digest.error().wrap(context);
  LayerManifest m;
  m.ref = ref;
  m.sha256 = digest->sha256;
  m.size = digest->size;
  m.created = nowRfc3339();
  m.built_on = built_on;
  m.source = source;
  DSEC_TRY(writeFileAtomic(staging.path() + "/" + kManifestFile, manifestToJson(m), 0644));
  double hash_done = monotonicSeconds();
  // A tree staged next to the image (debootstrap's) must be gone before the directory becomes the layer.
  if (!tree.empty() && startsWith(tree, staging.path() + "/")) {
    detachMountsUnder(tree);
    Status st = removeTree(tree);
    if (!st.ok()) return st.error().wrap(context);
  }
  double cleanup_done = monotonicSeconds();
  DSEC_TRY(checkFault("fs3.before_publish"));
  if (Status published = moveIntoPlace(ref, staging); !published.ok()) {
    if (published.error().code() == ErrorCode::kAlreadyExists) return published.error();
    return published.error().wrap(context);
  }
  DSEC_LOG(kInfo, "fs3") << "built layer " << ref.toString() << " (" << formatBytes(m.size) << ", sha256 "
                         << m.sha256.substr(0, 12) << ") in " << (monotonicSeconds() - start) << " s (mkfs "
                         << (mkfs_done - start) << " s, fsync+sha256 " << (hash_done - mkfs_done)
                         << " s, removing the staged tree " << (cleanup_done - hash_done) << " s)";
  return m;
}

Result<LayerManifest> LayerStore::get(const LayerRef& ref) const {
  DSEC_TRY(validateLayerRef(ref));
  std::string path = layerDir(ref) + "/" + kManifestFile;
  auto text = readFile(path);
  if (!text.ok()) {
    if (text.error().sysErrno() == ENOENT) return Error::notFound("layer " + ref.toString() + " not found");
    return text.error();
  }
  DSEC_ASSIGN_OR_RETURN(LayerManifest m, manifestFromJson(*text, path));
  if (m.ref != ref) return Error::internal(path + " names layer " + m.ref.toString() + ", not " + ref.toString());
  return m;
}

bool LayerStore::exists(const LayerRef& ref) const {
  return validateLayerRef(ref).ok() && pathExists(layerDir(ref) + "/" + kManifestFile);
}

Result<std::vector<LayerManifest>> LayerStore::list() const {
  std::vector<LayerManifest> out;
  auto entries = [](const std::string& dir) -> Result<std::vector<std::string>> {
    std::vector<std::string> names;
    auto listed = listDirectory(dir);
    if (!listed.ok()) {
      if (listed.error().code() == ErrorCode::kNotFound) return names;
      return listed.error();
    }
    for (auto& ent : *listed) {
      if (ent.name[0] != '.') names.push_back(std::move(ent.name));  // also skips .tmp-* staging dirs
    }
    return names;
  };
  DSEC_ASSIGN_OR_RETURN(auto names, entries(layersDir()));
  for (const auto& name : names) {
    auto versions = entries(layersDir() + "/" + name);
    if (!versions.ok()) continue;  // not a directory
    for (const auto& version : *versions) {
      LayerRef ref{name, version};
      if (!validateLayerRef(ref).ok()) continue;
      auto m = get(ref);
      if (m.ok()) {
        out.push_back(std::move(m).value());
      } else {
        DSEC_LOG(kWarn, "fs3") << "skipping layer " << ref.toString() << ": " << m.error().message();
      }
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.ref < b.ref; });
  return out;
}

Status LayerStore::remove(const LayerRef& ref) {
  DSEC_TRY(validateLayerRef(ref));
  std::string dir = layerDir(ref);
  if (!pathExists(dir)) return Error::notFound("layer " + ref.toString() + " not found");
  DSEC_ASSIGN_OR_RETURN(auto mounts, mountsUnder(mountDir(ref)));
  if (!mounts.empty()) {
    return Error(ErrorCode::kConflict, "layer " + ref.toString() + " is mounted at " + mountDir(ref) +
                                           " (in use by sandboxes, or left by a node agent that stopped: its next "
                                           "start unmounts unused layers)");
  }
  // Renamed into a staging dir first so the layer disappears at once; the staging dir removes the tree.
  DSEC_ASSIGN_OR_RETURN(StagingDir staging, StagingDir::create(layersDir()));
  std::string graveyard = staging.path() + "/removed";
  if (::rename(dir.c_str(), graveyard.c_str()) != 0) {
    int err = errno;
    if (err == ENOENT) return Error::notFound("layer " + ref.toString() + " not found");
    return Error::sys(err, "rename " + dir + " to " + graveyard);
  }
  ::rmdir((layersDir() + "/" + ref.name).c_str());  // the NAME dir, if that was its last version
  DSEC_LOG(kInfo, "fs3") << "removed layer " << ref.toString();
  return removeTree(staging.path() + "/removed");
}

Status LayerStore::checkImage(const std::vector<LayerRef>& layers) const {
  if (layers.empty()) return Error::invalid("image has no layers");
  for (const auto& l : layers) {
    DSEC_TRY(validateLayerRef(l));
    if (!exists(l)) {
      return Error::notFound("layer " + l.toString() + " of image " + imageToString(layers) +
                             " not found (build it with `dsec layer build " + l.toString() + " ...`)");
    }
  }
  return okStatus();
}

}  // namespace dsec::fs3
