#include "PythonTestImage.h"

#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <set>

#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/LayerMounter.h"
#include "dsec/fs3/LayerStore.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::testing {
namespace {

constexpr const char* kPython = "/usr/bin/python3.11";
constexpr const char* kPythonLib = "/usr/lib/python3.11";
constexpr const char* kBusybox = "/bin/busybox";
// Big or useless for snippets; left out so the layer builds fast.
constexpr const char* kDropped[] = {"test",      "idlelib",       "tkinter",       "turtledemo",
                                    "ensurepip", "lib2to3/tests", "dist-packages", "site-packages"};
constexpr const char* kApplets[] = {"sh",    "ls",   "cat",  "echo",   "sleep", "ps",      "id",     "env",   "true",
                                    "false", "head", "tail", "wc",     "touch", "mkdir",   "rm",     "grep",  "sed",
                                    "awk",   "kill", "seq",  "cut",    "tr",    "sort",    "uname",  "ln",    "chmod",
                                    "stat",  "find", "yes",  "dd",     "nc",    "ip",      "whoami", "mount", "df",
                                    "nproc", "pwd",  "test", "printf", "xargs", "timeout", "usleep"};

std::string realPath(const std::string& path) {
  char buf[PATH_MAX];
  if (realpath(path.c_str(), buf) == nullptr) return "";
  return buf;
}

std::string dirOf(const std::string& path) { return path.substr(0, path.rfind('/')); }

Status copyInto(const std::string& root, const std::string& host_path) {
  std::string dest = root + host_path;
  DSEC_TRY(makeDirs(dirOf(dest), 0755));
  auto copied = runCommandChecked({"cp", "-a", host_path, dest});
  if (!copied.ok()) return copied.error();
  return okStatus();
}

// The shared libraries (and the dynamic loader) a binary needs, as ldd prints their paths.
Result<std::set<std::string>> librariesOf(const std::string& binary) {
  DSEC_ASSIGN_OR_RETURN(CommandResult r, runCommand({"ldd", binary}));
  std::set<std::string> libs;
  for (const auto& line : split(r.output, '\n')) {
    std::string t = trim(line);
    size_t arrow = t.find("=> ");
    std::string path = arrow != std::string::npos ? t.substr(arrow + 3) : t;
    path = path.substr(0, path.find(' '));
    if (!path.empty() && path[0] == '/') libs.insert(path);
  }
  return libs;
}

// Copies a library to its real location in root and, when ldd named it through a symlink (/lib64/ld-linux
// -> ../lib/...), recreates that name as a symlink.
Status copyLibrary(const std::string& root, const std::string& lib) {
  std::string real = realPath(lib);
  if (real.empty()) return Error::sys(errno, "realpath " + lib);
  if (access((root + real).c_str(), F_OK) != 0) {
    DSEC_TRY(makeDirs(dirOf(root + real), 0755));
    auto copied = runCommandChecked({"cp", "-L", real, root + real});
    if (!copied.ok()) return copied.error();
  }
  std::string named = realPath(dirOf(lib)) + lib.substr(lib.rfind('/'));
  if (named != real && access((root + named).c_str(), F_OK) != 0) {
    DSEC_TRY(makeDirs(dirOf(root + named), 0755));
    if (symlink(real.c_str(), (root + named).c_str()) < 0) return Error::sys(errno, "symlink " + named);
  }
  return okStatus();
}

}  // namespace

std::string missingPythonRootfsTools() {
  if (!missingRoot().empty()) return missingRoot();
  if (access(kPython, X_OK) != 0) return "needs Debian's /usr/bin/python3.11 (apt-get install python3)";
  if (access(kBusybox, X_OK) != 0) return "needs /bin/busybox (apt-get install busybox-static)";
  if (findProgram("mkfs.erofs").empty()) return "needs mkfs.erofs (apt-get install erofs-utils)";
  if (findProgram("ldd").empty()) return "needs ldd";
  return "";
}

Status writePythonRootfs(const std::string& root) {
  DSEC_TRY(makeDirs(root, 0755));
  // The host's merged-/usr layout (bin -> usr/bin ...), so paths ldd prints resolve the same inside.
  for (const char* d : {"bin", "lib", "lib64", "sbin"}) {
    char target[PATH_MAX];
    ssize_t n = readlink((std::string("/") + d).c_str(), target, sizeof target - 1);
    if (n > 0) {
      target[n] = '\0';
      DSEC_TRY(makeDirs(root + "/" + target, 0755));
      if (symlink(target, (root + "/" + d).c_str()) < 0 && errno != EEXIST)
        return Error::sys(errno, "symlink /" + std::string(d));
    } else {
      DSEC_TRY(makeDirs(root + "/" + d, 0755));
    }
  }
  for (const char* d : {"/etc", "/tmp", "/work", "/proc", "/dev", "/root", "/usr/bin"})
    DSEC_TRY(makeDirs(root + d, 0755));
  chmod((root + "/tmp").c_str(), 01777);

  DSEC_TRY(copyInto(root, kPython));
  if (symlink("python3.11", (root + "/usr/bin/python3").c_str()) < 0 && errno != EEXIST) {
    return Error::sys(errno, "symlink python3");
  }
  DSEC_TRY(copyInto(root, kPythonLib));
  for (const char* d : kDropped) DSEC_TRY(removeTree(root + kPythonLib + "/" + d));
  if (access("/etc/python3.11", F_OK) == 0) DSEC_TRY(copyInto(root, "/etc/python3.11"));

  std::vector<std::string> binaries = {kPython};
  DSEC_ASSIGN_OR_RETURN(CommandResult so,
                        runCommand({"find", std::string(kPythonLib) + "/lib-dynload", "-name", "*.so"}));
  for (const auto& line : split(so.output, '\n')) {
    if (!trim(line).empty()) binaries.push_back(trim(line));
  }
  std::string bash = realPath("/bin/bash");
  if (!bash.empty()) {
    DSEC_TRY(copyInto(root, bash));
    binaries.push_back(bash);
  }
  std::set<std::string> libs;
  for (const auto& b : binaries) {
    auto found = librariesOf(b);
    if (found.ok()) libs.insert(found->begin(), found->end());
  }
  for (const auto& lib : libs) DSEC_TRY(copyLibrary(root, lib));

  std::string busybox = root + "/usr/bin/busybox";
  auto copied = runCommandChecked({"cp", kBusybox, busybox});
  if (!copied.ok()) return copied.error();
  for (const char* a : kApplets) {
    std::string path = root + "/usr/bin/" + a;
    if (access(path.c_str(), F_OK) != 0 && symlink("busybox", path.c_str()) < 0) {
      return Error::sys(errno, std::string("symlink ") + a);
    }
  }
  DSEC_TRY(writeFile(root + "/etc/passwd",
                     "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"));
  DSEC_TRY(writeFile(root + "/etc/group", "root:x:0:\nnogroup:x:65534:\n"));
  return okStatus();
}

Result<std::unique_ptr<PythonTestImage>> PythonTestImage::make() {
  std::unique_ptr<PythonTestImage> image(new PythonTestImage());
  char tmpl[] = "/tmp/dsec-fncall-image-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return Error::sys(errno, "mkdtemp");
  image->base_ = tmpl;
  std::string rootfs = image->base_ + "/rootfs";
  DSEC_TRY(writePythonRootfs(rootfs));
  image->store_ = std::make_unique<fs3::LayerStore>(image->base_ + "/store");
  DSEC_TRY(image->store_->init());
  DSEC_ASSIGN_OR_RETURN(auto layers, fs3::parseImageRef(kImage));
  auto built = image->store_->buildFromDir(layers[0], rootfs, "", "dir:" + rootfs);
  if (!built.ok()) return built.error().wrap("building the python test layer");
  DSEC_TRY(removeTree(rootfs));
  image->mounter_ = std::make_unique<fs3::LayerMounter>(image->store_.get());
  DSEC_ASSIGN_OR_RETURN(image->mount_, image->mounter_->acquire(layers));
  return image;
}

PythonTestImage::~PythonTestImage() {
  mount_.reset();
  mounter_.reset();
  store_.reset();
  if (!base_.empty()) {
    umount2((base_ + "/store/mnt").c_str(), MNT_DETACH);  // the mounter's private bind of its mount root
    (void)removeTree(base_);
  }
}

const std::vector<std::string>& PythonTestImage::lowerDirs() const { return mount_->dirs(); }

backends::fncall::WorkerSandboxFactory makeTestWorkerFactory(backends::Backend* backend, PythonTestImage* image) {
  return [backend, image](const std::string& name,
                          const backends::SandboxSpec& spec) -> Result<std::unique_ptr<backends::Sandbox>> {
    if (name != PythonTestImage::kImage) return Error::notFound("test image " + name + " does not exist");
    backends::SandboxSpec full = spec;
    full.lower_dirs = image->lowerDirs();
    return backend->create(full);
  };
}

}  // namespace dsec::testing
