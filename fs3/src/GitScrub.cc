#include "dsec/fs3/GitScrub.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <optional>

#include "dsec/common/Directory.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"

namespace dsec::fs3 {
namespace {

namespace fs = std::filesystem;

constexpr size_t kMaxGitFile = 1 << 20;  // a HEAD, a pointer file or an exclude list
constexpr double kGitTimeoutSeconds = 1800;
// Fixed identity and date: the new commit's hash depends on the working tree only.
constexpr const char* kIdentityName = "dsec";
constexpr const char* kIdentityEmail = "dsec@localhost";
constexpr const char* kCommitDate = "946684800 +0000";  // 2000-01-01T00:00:00Z
constexpr const char* kCommitMessage = "Snapshot of the working tree\n";
constexpr const char* kFallbackBranch = "main";

std::string join(const std::string& rel, const std::string& name) { return rel == "." ? name : rel + "/" + name; }

// Everything below is resolved beneath the tree (or a lower layer) without following symlinks: the tree may
// have been written by an untrusted build command, and a link must not make us read a host file.
UniqueFd openBeneath(int root_fd, const std::string& rel, int flags) {
  open_how how{};
  how.flags = static_cast<uint64_t>(flags) | O_CLOEXEC;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
  return UniqueFd(static_cast<int>(syscall(SYS_openat2, root_fd, rel.c_str(), &how, sizeof how)));
}

// A small regular file beneath root_fd, or nullopt if it is missing, not a regular file or too large.
std::optional<std::string> readBeneath(int root_fd, const std::string& rel) {
  UniqueFd fd = openBeneath(root_fd, rel, O_RDONLY | O_NONBLOCK);
  struct stat st {};
  if (!fd || fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > static_cast<off_t>(kMaxGitFile)) {
    return std::nullopt;
  }
  std::string text;
  char buf[8192];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::nullopt;
    if (n == 0 || text.size() + static_cast<size_t>(n) > kMaxGitFile) break;
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

// A path relative to the tree, or nullopt if it leaves it.
std::optional<std::string> normalizeInside(const std::string& rel) {
  std::string normal = fs::path(rel).lexically_normal().string();
  while (normal.size() > 1 && normal.back() == '/') normal.pop_back();
  if (normal.empty() || normal[0] == '/' || normal == ".." || startsWith(normal, "../")) return std::nullopt;
  return normal;
}

// Directories (relative, "." for the root) that hold a `.git` entry, deepest first.
Result<std::vector<std::string>> findRepositories(const std::string& tree) {
  std::vector<std::string> found;
  std::vector<std::string> pending{"."};
  while (!pending.empty()) {
    std::string rel = pending.back();
    pending.pop_back();
    DSEC_ASSIGN_OR_RETURN(auto entries, listDirectory(rel == "." ? tree : tree + "/" + rel));
    for (const auto& e : entries) {
      if (e.name == ".git") {
        found.push_back(rel);  // a .git directory is not searched: nothing in it is a working tree
      } else if (e.is_dir) {
        pending.push_back(join(rel, e.name));
      }
    }
  }
  auto depth = [](const std::string& rel) { return rel == "." ? 0 : std::count(rel.begin(), rel.end(), '/') + 1; };
  std::sort(found.begin(), found.end(), [&](const std::string& a, const std::string& b) {
    return depth(a) != depth(b) ? depth(a) > depth(b) : a < b;
  });
  return found;
}

// What a repository's replacement keeps of it, read before any repository is replaced (a worktree's or a
// submodule's HEAD lives in another repository's .git).
struct RepositoryPlan {
  std::string rel;
  std::string branch;  // "" = detached
  std::optional<std::string> exclude;
  uid_t uid = 0;
  gid_t gid = 0;
};

// The git directory a `.git` entry names, relative to the tree, if it is inside it.
std::optional<std::string> locateGitDir(int root_fd, const std::string& rel, const struct stat& dot_git,
                                        const std::string& original_root) {
  if (S_ISDIR(dot_git.st_mode)) return join(rel, ".git");
  if (!S_ISREG(dot_git.st_mode)) return std::nullopt;  // a symlink: not followed
  auto pointer = readBeneath(root_fd, join(rel, ".git"));
  if (!pointer) return std::nullopt;
  std::string target = trim(pointer->substr(0, pointer->find('\n')));
  if (!startsWith(target, "gitdir:")) return std::nullopt;
  target = trim(target.substr(7));
  if (target.empty()) return std::nullopt;
  if (target[0] != '/') return normalizeInside(join(rel, target));
  std::string root = fs::path(original_root).lexically_normal().string();
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  if (root == "/") return normalizeInside(target.substr(1));
  if (!startsWith(target, root + "/")) return std::nullopt;
  return normalizeInside(target.substr(root.size() + 1));
}

Result<RepositoryPlan> planRepository(const std::string& tree, int root_fd, const std::string& rel,
                                      const std::string& original_root) {
  RepositoryPlan plan;
  plan.rel = rel;
  std::string dot_git = tree + "/" + join(rel, ".git");
  struct stat st {};
  if (::lstat(dot_git.c_str(), &st) != 0) return Error::sys(errno, "stat " + dot_git);
  plan.uid = st.st_uid;
  plan.gid = st.st_gid;
  plan.branch = kFallbackBranch;
  auto git_dir = locateGitDir(root_fd, rel, st, original_root);
  if (!git_dir) return plan;
  if (auto head = readBeneath(root_fd, *git_dir + "/HEAD")) {
    std::string ref = trim(*head);
    plan.branch = startsWith(ref, "ref: refs/heads/") ? ref.substr(16) : "";
  }
  plan.exclude = readBeneath(root_fd, *git_dir + "/info/exclude");
  return plan;
}

// A build's upper is merged with the layers below it: files they hold in the repository's directory would be
// in the sandbox's working tree but not in the commit. Such repositories are refused unless an opaque directory
// of the upper hides the layers there.
Status checkNotOverLowerFiles(const std::string& tree, const std::string& rel, const std::vector<std::string>& lowers) {
  if (lowers.empty()) return okStatus();
  std::string prefix = tree;
  for (const auto& part : rel == "." ? std::vector<std::string>{} : split(rel, '/')) {
    prefix += "/" + part;
    char value[2] = {};
    if (::lgetxattr(prefix.c_str(), "trusted.overlay.opaque", value, 1) == 1 && value[0] == 'y') return okStatus();
  }
  for (const auto& lower : lowers) {
    UniqueFd lower_fd(::open(lower.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!lower_fd) return Error::sys(errno, "open " + lower);
    UniqueFd dir =
        rel == "." ? UniqueFd(::dup(lower_fd.get())) : openBeneath(lower_fd.get(), rel, O_RDONLY | O_DIRECTORY);
    if (!dir) continue;  // missing, a symlink or not a directory there: the upper's directory hides it
    DSEC_ASSIGN_OR_RETURN(auto entries, listDirectoryAt(dir.get(), lower + "/" + rel));
    if (!entries.empty()) {
      return Error::invalid("--scrub-git: repository /" + (rel == "." ? std::string() : rel) +
                            " is in a directory the image already has files in; only repositories the build command "
                            "makes in a new directory can be scrubbed (e.g. clone into a new directory)");
    }
  }
  return okStatus();
}

class Git {
 public:
  Git(std::string program, std::string scratch) : program_(std::move(program)), scratch_(std::move(scratch)) {}

  // Runs git in an empty environment. With a work tree, GIT_DIR and GIT_WORK_TREE name it (no discovery).
  Result<std::string> run(const std::vector<std::string>& args, const std::string& work_tree = "") const {
    std::string home = scratch_ + "/home";
    std::vector<std::string> argv = {"env",
                                     "-i",
                                     "PATH=/usr/local/bin:/usr/bin:/bin",
                                     "HOME=" + home,
                                     "XDG_CONFIG_HOME=" + home + "/.config",
                                     "LC_ALL=C",
                                     "TZ=UTC",
                                     "GIT_CONFIG_NOSYSTEM=1",
                                     "GIT_CONFIG_GLOBAL=/dev/null",
                                     "GIT_TERMINAL_PROMPT=0",
                                     std::string("GIT_AUTHOR_NAME=") + kIdentityName,
                                     std::string("GIT_AUTHOR_EMAIL=") + kIdentityEmail,
                                     std::string("GIT_AUTHOR_DATE=") + kCommitDate,
                                     std::string("GIT_COMMITTER_NAME=") + kIdentityName,
                                     std::string("GIT_COMMITTER_EMAIL=") + kIdentityEmail,
                                     std::string("GIT_COMMITTER_DATE=") + kCommitDate};
    if (!work_tree.empty()) {
      argv.push_back("GIT_DIR=" + work_tree + "/.git");
      argv.push_back("GIT_WORK_TREE=" + work_tree);
    }
    argv.push_back(program_);
    // Belt and braces: the repositories are fresh (no hooks, no config of the source), and these say so again.
    for (const char* setting :
         {"core.hooksPath=/dev/null", "core.fsmonitor=false", "safe.directory=*", "core.logAllRefUpdates=false",
          "advice.addEmbeddedRepo=false", "gc.auto=0", "maintenance.auto=false", "core.autocrlf=false"}) {
      argv.push_back("-c");
      argv.push_back(setting);
    }
    argv.insert(argv.end(), args.begin(), args.end());
    CommandOptions options;
    options.cwd = work_tree.empty() ? scratch_ : work_tree;
    options.timeout_seconds = kGitTimeoutSeconds;
    return runCommandChecked(argv, options);
  }

  // A command that prints one object name.
  Result<std::string> runForHash(const std::vector<std::string>& args, const std::string& work_tree) const {
    DSEC_ASSIGN_OR_RETURN(std::string out, run(args, work_tree));
    std::string hash = trim(out);
    bool hex = (hash.size() == 40 || hash.size() == 64) && std::all_of(hash.begin(), hash.end(), [](char c) {
                 return std::isxdigit(static_cast<unsigned char>(c));
               });
    if (!hex) return Error::internal("git " + args[0] + " printed '" + hash + "', not an object name");
    return hash;
  }

 private:
  std::string program_;
  std::string scratch_;
};

Status chownTree(const std::string& dir, uid_t uid, gid_t gid) {
  if (::lchown(dir.c_str(), uid, gid) != 0) return Error::sys(errno, "chown " + dir);
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (::lchown(it->path().c_str(), uid, gid) != 0) return Error::sys(errno, "chown " + it->path().string());
  }
  if (ec) return Error::sys(ec.value(), "walk " + dir);
  return okStatus();
}

Result<ScrubbedRepository> replaceRepository(const std::string& tree, const RepositoryPlan& plan, const Git& git,
                                             const std::string& template_dir) {
  std::string work_tree = plan.rel == "." ? tree : tree + "/" + plan.rel;
  std::string git_dir = work_tree + "/.git";
  DSEC_TRY(removeTree(git_dir));
  std::vector<std::string> init = {"init", "-q", "--template=" + template_dir};
  if (!plan.branch.empty()) init.insert(init.end(), {"-b", plan.branch});
  init.push_back(work_tree);
  DSEC_TRY(git.run(init));
  if (plan.exclude) {
    DSEC_TRY(makeDirs(git_dir + "/info", 0755));
    DSEC_TRY(writeFile(git_dir + "/info/exclude", *plan.exclude));
  }
  DSEC_TRY(git.run({"add", "-A"}, work_tree));
  DSEC_ASSIGN_OR_RETURN(std::string tree_hash, git.runForHash({"write-tree"}, work_tree));
  ScrubbedRepository out;
  out.path = plan.rel;
  out.branch = plan.branch;
  DSEC_ASSIGN_OR_RETURN(out.commit, git.runForHash({"commit-tree", tree_hash, "-m", kCommitMessage}, work_tree));
  if (plan.branch.empty()) {
    DSEC_TRY(git.run({"update-ref", "--no-deref", "HEAD", out.commit}, work_tree));
  } else {
    DSEC_TRY(git.run({"update-ref", "HEAD", out.commit}, work_tree));  // through HEAD: the branch it names
  }
  DSEC_TRY(removeTree(git_dir + "/logs"));
  if (plan.uid != ::geteuid() || plan.gid != ::getegid()) DSEC_TRY(chownTree(git_dir, plan.uid, plan.gid));
  return out;
}

}  // namespace

Result<std::vector<ScrubbedRepository>> scrubGitRepositories(const std::string& tree, const GitScrubOptions& options) {
  DSEC_ASSIGN_OR_RETURN(auto found, findRepositories(tree));
  std::vector<ScrubbedRepository> scrubbed;
  if (found.empty()) return scrubbed;
  std::string program = findProgram("git");
  if (program.empty()) return Error(ErrorCode::kUnsupported, "--scrub-git: git not found on PATH (install git)");
  if (options.scratch_dir.empty()) return Error::invalid("--scrub-git: no scratch directory");

  UniqueFd root_fd(::open(tree.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!root_fd) return Error::sys(errno, "open " + tree);
  std::vector<RepositoryPlan> plans;
  for (const auto& rel : found) {
    DSEC_TRY(checkNotOverLowerFiles(tree, rel, options.lower_dirs));
    DSEC_ASSIGN_OR_RETURN(auto plan, planRepository(tree, root_fd.get(), rel, options.original_root));
    plans.push_back(std::move(plan));
  }

  std::string template_dir = options.scratch_dir + "/template";  // empty: no hooks, no sample files
  DSEC_TRY(makeDirs(template_dir, 0700));
  DSEC_TRY(makeDirs(options.scratch_dir + "/home", 0700));
  Git git(program, options.scratch_dir);
  for (const auto& plan : plans) {
    auto replaced = replaceRepository(tree, plan, git, template_dir);
    if (!replaced.ok()) return replaced.error().wrap("--scrub-git: repository " + plan.rel);
    scrubbed.push_back(std::move(*replaced));
  }
  return scrubbed;
}

}  // namespace dsec::fs3
