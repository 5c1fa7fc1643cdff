#include "LayerBuild.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <fstream>
#include <sstream>

#include "Progress.h"
#include "dsec/backends/container/ContainerBackend.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/LayerMounter.h"

namespace dsec::cli {

namespace {

std::atomic<bool> g_interrupted{false};

void onInterrupt(int) { g_interrupted.store(true); }

// Ctrl-C during a build stops the command (at its next output) and still cleans up, instead of killing us
// with a sandbox and a build dir left behind.
class InterruptGuard {
 public:
  InterruptGuard() {
    struct sigaction sa = {};
    sa.sa_handler = onInterrupt;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~InterruptGuard() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }

 private:
  struct sigaction old_int_ = {};
  struct sigaction old_term_ = {};
};

class TerminalSink : public backends::ExecSink {
 public:
  bool onStdout(const char* data, size_t size) override { return copy(STDOUT_FILENO, data, size); }
  bool onStderr(const char* data, size_t size) override { return copy(STDERR_FILENO, data, size); }

 private:
  static bool copy(int fd, const char* data, size_t size) {
    while (size > 0) {
      ssize_t n = ::write(fd, data, size);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      data += n;
      size -= static_cast<size_t>(n);
    }
    return !g_interrupted.load();
  }
};

class BuildDir {
 public:
  explicit BuildDir(std::string path) : path_(std::move(path)) {}
  ~BuildDir() { (void)removeTree(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string unescapeMountPath(const std::string& field) {
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size()) {  // octal escapes: \040 is a space
      out += static_cast<char>(std::stoi(field.substr(i + 1, 3), nullptr, 8));
      i += 3;
    } else {
      out += field[i];
    }
  }
  return out;
}

// With a network the init bind-mounts the host's /etc/resolv.conf and /etc/hosts (read-only) over files it
// creates in the root, so the upper holds those placeholders (empty, or copied up from the image). The command
// cannot have written them (the binds are read-only), and the host's resolver is no part of the layer.
// The upper was written by the build: every lookup in it stays beneath it and follows no symlink (a build that
// made /etc a symlink to / must not get a host file removed).
Status dropHostNetworkFiles(const std::string& upper) {
  UniqueFd upper_fd(::open(upper.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!upper_fd) return Error::sys(errno, "open " + upper);
  open_how how{};
  how.flags = O_PATH | O_DIRECTORY | O_CLOEXEC;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
  UniqueFd etc(static_cast<int>(syscall(SYS_openat2, upper_fd.get(), "etc", &how, sizeof how)));
  if (!etc) return errno == ENOENT || errno == ELOOP || errno == ENOTDIR ? okStatus() : Error::sys(errno, "open etc");
  for (const char* name : {"resolv.conf", "hosts"}) {
    struct stat st {};
    if (fstatat(etc.get(), name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
    if (unlinkat(etc.get(), name, 0) != 0) return Error::sys(errno, std::string("unlink etc/") + name);
  }
  return okStatus();
}

}  // namespace

Result<RunBuildOutcome> buildLayerByRunning(fs3::LayerStore& store, const fs3::LayerRef& ref, const std::string& image,
                                            const std::string& command, bool scrub_git, Progress* progress) {
  auto step = [progress](const std::string& name) {
    if (progress != nullptr) progress->step(name);
  };
  if (store.exists(ref)) {
    return Error(ErrorCode::kAlreadyExists,
                 "layer " + ref.toString() + " already exists (layers are immutable: build a new version)");
  }
  DSEC_ASSIGN_OR_RETURN(auto layers, fs3::parseImageRef(image));
  DSEC_TRY(store.checkImage(layers));
  DSEC_ASSIGN_OR_RETURN(auto backend, backends::makeContainerBackend({}));

  // The backend puts the overlay's upper and work dirs inside spec.upper_dir (<build>/upper, <build>/work).
  BuildDir build(store.root() + "/layers/.build-" + randomHex(12));
  std::string upper = build.path() + "/upper";
  DSEC_TRY(makeDirs(build.path(), 0700));

  step("mounting " + image);
  fs3::LayerMounter mounter(&store);
  DSEC_ASSIGN_OR_RETURN(auto mounted, mounter.acquire(layers));

  backends::SandboxSpec spec;
  spec.id = "build-" + randomHex(12);
  spec.image = image;
  spec.lower_dirs = mounted->dirs();
  spec.network = backends::NetworkMode::kEgress;  // packages come from the network, never through the host's
  // Anywhere but the node and link-local addresses (the operator's own build, not an agent's turn).
  spec.egress = backends::parseEgressPolicy({"0.0.0.0/0"}).value();
  spec.upper_dir = build.path();
  spec.env = {{"PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
              {"HOME", "/root"},
              {"DEBIAN_FRONTEND", "noninteractive"}};
  step("starting the build sandbox");
  DSEC_ASSIGN_OR_RETURN(auto sandbox, backend->create(spec));
  step("running " + command);
  if (progress != nullptr) progress->hold();  // the command's own output follows

  backends::ExecRequest request;
  request.argv = {"/bin/sh", "-c", command};
  TerminalSink sink;
  Result<backends::ExecResult> ran = Error::internal("not run");
  {
    InterruptGuard guard;
    ran = sandbox->execStream(request, sink);
  }
  Status destroyed = sandbox->destroy();
  sandbox.reset();
  if (!ran.ok()) return ran.error().wrap("running the build command");
  if (g_interrupted.load()) return Error(ErrorCode::kConflict, "interrupted; no layer was built");
  DSEC_TRY(destroyed);
  RunBuildOutcome outcome;
  outcome.exit_code = ran->exit_code;
  if (ran->exit_code != 0) return outcome;
  DSEC_TRY(dropHostNetworkFiles(upper));
  if (scrub_git) {  // while the image is still mounted: its layers are checked for files under each repository
    step("scrubbing git repositories");
    fs3::GitScrubOptions options;
    options.original_root = "/";
    options.lower_dirs = mounted->dirs();
    options.scratch_dir = build.path() + "/scratch";
    DSEC_TRY(makeDirs(options.scratch_dir, 0700));
    DSEC_ASSIGN_OR_RETURN(outcome.scrubbed, fs3::scrubGitRepositories(upper, options));
  }
  mounted.reset();
  DSEC_ASSIGN_OR_RETURN(outcome.manifest, store.buildFromDir(ref, upper, image, "run:" + command));
  return outcome;
}

Result<fs3::LayerManifest> buildLayerFromDirScrubbingGit(fs3::LayerStore& store, const fs3::LayerRef& ref,
                                                         const std::string& dir,
                                                         std::vector<fs3::ScrubbedRepository>* scrubbed) {
  // Absolute gitdir pointers (worktrees) were written against the directory's real path.
  char resolved[PATH_MAX];
  std::string original_root = realpath(dir.c_str(), resolved) != nullptr ? std::string(resolved) : dir;
  auto prepare = [&](const std::string& tree, const std::string& scratch) -> Status {
    fs3::GitScrubOptions options;
    options.original_root = original_root;
    options.scratch_dir = scratch;
    DSEC_ASSIGN_OR_RETURN(*scrubbed, fs3::scrubGitRepositories(tree, options));
    return okStatus();
  };
  return store.buildFromCopyOfDir(ref, dir, "dir:" + dir, prepare);
}

Result<fs3::LayerManifest> ensureBusyboxLayer(fs3::LayerStore& store, const fs3::LayerRef& ref) {
  if (store.exists(ref)) return store.get(ref);
  BuildDir dir(store.root() + "/layers/.build-" + randomHex(12));
  std::string rootfs = dir.path() + "/rootfs";
  DSEC_TRY(makeDirs(rootfs, 0755));
  DSEC_TRY(writeBusyboxRootfs(rootfs));
  auto built = store.buildFromDir(ref, rootfs, "", "busybox:/bin/busybox");
  if (!built.ok() && built.error().code() == ErrorCode::kAlreadyExists) return store.get(ref);  // a racing build
  return built;
}

bool isLayerMounted(const fs3::LayerStore& store, const fs3::LayerRef& ref) {
  std::string root = store.root();
  char resolved[PATH_MAX];
  if (realpath(root.c_str(), resolved) != nullptr) root = resolved;
  std::string want = root + "/mnt/" + ref.name + "/" + ref.version;
  std::ifstream mountinfo("/proc/self/mountinfo");
  std::string line;
  while (std::getline(mountinfo, line)) {
    std::istringstream fields(line);
    std::string id, parent, dev, source_root, mount_point;
    fields >> id >> parent >> dev >> source_root >> mount_point;
    if (unescapeMountPath(mount_point) == want) return true;
  }
  return false;
}

}  // namespace dsec::cli
