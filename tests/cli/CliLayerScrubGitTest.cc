// `dsec layer build --scrub-git`: the layer keeps each repository's working tree and one fresh commit of it, and
// nothing an agent could read an old answer from (as root: real images, EROFS mounts, sandboxes for --run).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "BusyboxRootfs.h"
#include "CliRunner.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/LayerMounter.h"
#include "dsec/fs3/LayerStore.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::testing {
namespace {

namespace fs = std::filesystem;

// Only in history: a removed file, a stashed change, and an old commit of a nested repository.
constexpr const char* kAnswer = "SECRET-ANSWER-4242";
constexpr const char* kStashed = "STASHED-SECRET-777";
constexpr const char* kSubAnswer = "SUB-SECRET-99";
constexpr uid_t kSourceOwner = 1234;

// bash -s SRC MARKER_DIR full|plain. A repository with every place an old answer hides: commits, a tag, a branch,
// a packed history (git gc), a stash, a remote and its remote-tracking ref, reflogs, ORIG_HEAD, hooks and an
// fsmonitor that would leave a file in MARKER_DIR if they ran; a modified, an untracked and an ignored file.
// "full" adds a nested repository with its own history, a worktree of the feature branch (a `.git` pointer
// file) and hands the tree to uid kSourceOwner.
constexpr const char* kMakeRepository = R"(set -e
src=$1; marker=$2; mode=$3
export HOME=$marker/home GIT_CONFIG_NOSYSTEM=1 GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@t GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@t
mkdir -p "$HOME" "$src" && cd "$src"
git init -q -b main .
echo '*.log' > .gitignore; echo v1 > code.txt; git add -A; git commit -qm base
git checkout -qb feature; echo feat > feature.txt; git add feature.txt; git commit -qm feature; git checkout -q main
echo SECRET-ANSWER-4242 > answer.txt; git add answer.txt; git commit -qm answer; git tag v1
git rm -q answer.txt; echo fixed > code.txt; git add -A; git commit -qm fix
git remote add origin https://example.invalid/repo.git; git update-ref refs/remotes/origin/main HEAD~1
git gc -q
echo STASHED-SECRET-777 > code.txt; git stash -q
git reset -q --soft HEAD
if [ "$mode" = full ]; then
  mkdir sub; (cd sub && git init -q -b trunk . && echo SUB-SECRET-99 > s.txt && git add -A && git commit -qm s1 &&
              echo sub-now > s.txt && git commit -qam s2)
  git worktree add -q wt feature
fi
for hook in reference-transaction pre-commit post-commit post-checkout; do
  printf '#!/bin/sh\ntouch %s/hook-ran\n' "$marker" > .git/hooks/$hook; chmod +x .git/hooks/$hook
done
printf '#!/bin/sh\ntouch %s/fsmonitor-ran\n' "$marker" > "$marker/fsmonitor"; chmod +x "$marker/fsmonitor"
git config core.fsmonitor "$marker/fsmonitor"
echo untracked > untracked.txt; echo ignored > build.log; echo modified >> code.txt
if [ "$mode" = full ]; then chown -R 1234:1234 .; fi
)";

std::string shell(const std::string& script) {
  auto out = runCommandChecked({"bash", "-c", script});
  EXPECT_TRUE(out.ok()) << out.error().toString();
  return out.ok() ? *out : "";
}

std::string git(const std::string& repo, const std::string& args) {
  return shell("GIT_CONFIG_NOSYSTEM=1 HOME=/nonexistent git -c safe.directory='*' -C '" + repo + "' " + args);
}

std::string blobOf(const std::string& line) {
  return trim(shell("printf '%s\\n' '" + line + "' | git hash-object --stdin"));
}

// Every file's path, type, mode, size, mtime and owner, and every regular file's content hash.
std::string snapshot(const std::string& dir) {
  return shell("cd '" + dir + "' && find . -printf '%p %y %m %s %T@ %U\\n' | sort && " +
               "find . -type f -print0 | sort -z | xargs -0 sha256sum");
}

void expectOneCommitOnly(const std::string& repo, const std::string& branch,
                         const std::vector<std::string>& absent_blobs) {
  SCOPED_TRACE(repo);
  EXPECT_EQ(split(trim(git(repo, "log --oneline --all")), '\n').size(), 1u);
  EXPECT_EQ(trim(git(repo, "for-each-ref --format='%(refname)'")), "refs/heads/" + branch);
  EXPECT_EQ(trim(git(repo, "symbolic-ref HEAD")), "refs/heads/" + branch);
  EXPECT_EQ(git(repo, "stash list"), "");
  EXPECT_EQ(git(repo, "reflog"), "");
  EXPECT_EQ(git(repo, "remote"), "");
  EXPECT_EQ(git(repo, "fsck --unreachable --no-reflogs --no-progress"), "");
  EXPECT_EQ(git(repo, "fsck --lost-found --no-reflogs --no-progress"), "");
  EXPECT_EQ(git(repo, "status --porcelain"), "");
  for (const char* name : {"ORIG_HEAD", "FETCH_HEAD", "packed-refs", "logs", "hooks", "refs/stash", "worktrees",
                           "modules", "COMMIT_EDITMSG"}) {
    EXPECT_FALSE(fs::exists(fs::symlink_status(repo + "/.git/" + name))) << name;
  }
  EXPECT_EQ(git(repo, "config --local --get-regexp 'remote|fsmonitor|hooks' || true"), "")
      << "config of the source kept";
  std::string objects = git(repo, "cat-file --batch-all-objects --batch-check");
  EXPECT_FALSE(objects.empty());
  for (const auto& blob : absent_blobs) EXPECT_EQ(objects.find(blob), std::string::npos) << "old blob " << blob;
}

class CliLayerScrubGit : public ::testing::Test {
 protected:
  void SetUp() override {
    DSEC_SKIP_UNLESS_ROOT();
    if (findProgram("mkfs.erofs").empty()) GTEST_SKIP() << "mkfs.erofs missing (erofs-utils)";
    if (findProgram("git").empty()) GTEST_SKIP() << "git missing (apt-get install git)";
  }
  CliResult dsec(std::vector<std::string> args, double timeout = 120) {
    args.insert(args.end(), {"--root", root_.path()});
    return runDsec(args, {}, timeout);
  }
  void makeRepository(const std::string& src, const std::string& mode) {
    shell("bash -s '" + src + "' '" + markers_.path() + "' " + mode + " <<'EOF'\n" + kMakeRepository + "EOF\n");
  }
  void expectNoHookRan() {
    EXPECT_FALSE(fs::exists(markers_.path() + "/hook-ran")) << "a hook of the source repository ran";
    EXPECT_FALSE(fs::exists(markers_.path() + "/fsmonitor-ran")) << "the source's core.fsmonitor ran";
  }
  // grep over the mounted tree (.git included) and over the image's bytes (EROFS here is uncompressed).
  void expectNowhere(const std::string& text, const std::string& tree, const std::string& image) {
    EXPECT_EQ(shell("grep -r -l -a -F '" + text + "' '" + tree + "' || true"), "") << text;
    EXPECT_EQ(shell("grep -c -a -F '" + text + "' '" + image + "' || true"), "0\n") << text;
  }

  TempDir root_;
  TempDir markers_;
};

TEST_F(CliLayerScrubGit, FromDirKeepsTheWorkingTreeAndOneCommit) {
  TempDir parent;
  std::string src = parent.path() + "/src";
  makeRepository(src, "full");
  std::string before = snapshot(src);
  std::string history_before = git(src, "log --oneline --all");
  ASSERT_EQ(split(trim(history_before), '\n').size(), 6u) << history_before;  // 4 commits and the stash's 2

  auto r = dsec({"layer", "build", "clean:1", "--from-dir", src, "--scrub-git"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  expectNoHookRan();
  EXPECT_NE(r.out.find("scrubbed git repository .: one commit"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("scrubbed git repository sub: one commit"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("scrubbed git repository wt: one commit"), std::string::npos) << r.out;
  EXPECT_EQ(snapshot(src), before) << "the source directory changed";
  EXPECT_EQ(git(src, "log --oneline --all"), history_before);
  EXPECT_EQ(split(trim(git(src, "stash list")), '\n').size(), 1u);

  fs3::LayerStore store(root_.path());
  fs3::LayerMounter mounter(&store);
  auto mounted = mounter.acquire({fs3::LayerRef{"clean", "1"}});
  ASSERT_OK(mounted);
  std::string layer = (*mounted)->dirs()[0];
  std::vector<std::string> old_blobs = {blobOf(kAnswer), blobOf(kStashed), blobOf(kSubAnswer)};
  expectOneCommitOnly(layer, "main", old_blobs);
  expectOneCommitOnly(layer + "/sub", "trunk", old_blobs);
  expectOneCommitOnly(layer + "/wt", "feature", old_blobs);  // was a worktree: `.git` a pointer file
  for (const char* secret : {kAnswer, kStashed, kSubAnswer})
    expectNowhere(secret, layer, store.imagePath({"clean", "1"}));

  // The working trees as they were (modified, untracked and ignored files alike); the ignored file uncommitted,
  // the untracked one committed, the nested repositories recorded at their new commits.
  EXPECT_EQ(shell("diff -r --no-dereference -x .git '" + src + "' '" + layer + "' && echo same"), "same\n");
  EXPECT_EQ(git(layer, "status --porcelain --ignored"), "!! build.log\n");
  EXPECT_EQ(git(layer, "show HEAD:code.txt"), "fixed\nmodified\n");
  EXPECT_EQ(git(layer, "show HEAD:untracked.txt"), "untracked\n");
  EXPECT_EQ(trim(git(layer, "rev-parse HEAD:sub")), trim(git(layer + "/sub", "rev-parse HEAD")));
  struct stat st {};
  ASSERT_EQ(::stat((layer + "/.git/objects").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, kSourceOwner) << "the new .git belongs to the repository's owner";

  // Reproducible: the same tree gives the same commits.
  auto again = dsec({"layer", "build", "clean:2", "--from-dir", src, "--scrub-git"});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(again.out.substr(0, again.out.find("built")), r.out.substr(0, r.out.find("built")));
}

TEST_F(CliLayerScrubGit, DirWithoutRepositoryIsBuiltAndSaysSo) {
  TempDir src;
  std::ofstream(src.path() + "/hello.txt") << "hello\n";
  auto r = dsec({"layer", "build", "plain:1", "--from-dir", src.path(), "--scrub-git"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("no git repository found; nothing to scrub"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("built plain:1"), std::string::npos) << r.out;
}

TEST_F(CliLayerScrubGit, RefusedWithDebootstrap) {
  auto r = dsec({"layer", "build", "deb:1", "--debootstrap", "bookworm", "--scrub-git"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--scrub-git goes with --from-dir or --on/--run, not --debootstrap"), std::string::npos)
      << r.err;
}

// --on/--run: a busybox image whose /seed holds a repository's working tree and its .git under another name (so
// the image itself has no repository there), and a real repository at /src.
class CliLayerScrubGitRun : public CliLayerScrubGit {
 protected:
  void SetUp() override {
    CliLayerScrubGit::SetUp();
    if (IsSkipped()) return;
    std::string rootfs = image_tree_.path() + "/rootfs";
    ASSERT_OK(cli::writeBusyboxRootfs(rootfs));
    makeRepository(rootfs + "/seed/repo", "plain");
    ASSERT_EQ(::rename((rootfs + "/seed/repo/.git").c_str(), (rootfs + "/seed/dotgit").c_str()), 0);
    makeRepository(rootfs + "/src", "plain");
    auto r = dsec({"layer", "build", "seed:1", "--from-dir", rootfs});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  TempDir image_tree_;
};

// Into /work, which the image has as an empty directory: nothing of the image hides in the working tree.
TEST_F(CliLayerScrubGitRun, ScrubsTheRepositoryTheCommandMade) {
  auto r = dsec({"layer", "build", "work:1", "--on", "seed:1", "--scrub-git", "--run",
                 "cp -a /seed/repo/. /work/ && cp -a /seed/dotgit /work/.git"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("scrubbed git repository work: one commit"), std::string::npos) << r.out;
  expectNoHookRan();

  fs3::LayerStore store(root_.path());
  fs3::LayerMounter mounter(&store);
  auto mounted = mounter.acquire({fs3::LayerRef{"seed", "1"}, fs3::LayerRef{"work", "1"}});
  ASSERT_OK(mounted);
  std::string top = (*mounted)->dirs()[1];
  expectOneCommitOnly(top + "/work", "main", {blobOf(kAnswer), blobOf(kStashed)});
  for (const char* secret : {kAnswer, kStashed}) expectNowhere(secret, top, store.imagePath({"work", "1"}));
  EXPECT_EQ(shell("diff -r --no-dereference -x .git '" + image_tree_.path() + "/rootfs/seed/repo' '" + top +
                  "/work' && echo same"),
            "same\n");
}

TEST_F(CliLayerScrubGitRun, RefusesARepositoryTheImageHasFilesOf) {
  auto r = dsec(
      {"layer", "build", "src:1", "--on", "seed:1", "--scrub-git", "--run", "echo changed > /src/.git/description"});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.err.find("repository /src is in a directory the image already has files in"), std::string::npos) << r.err;
  EXPECT_FALSE(fs3::LayerStore(root_.path()).exists({"src", "1"}));
}

}  // namespace
}  // namespace dsec::testing
