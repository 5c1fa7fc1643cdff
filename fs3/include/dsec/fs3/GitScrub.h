// Layers without git history (`dsec layer build --scrub-git`): every git repository of a tree becomes one fresh
// commit of its working tree, so a sandbox cannot read an answer out of old commits, branches, tags, reflogs,
// stashes, packs or remotes.
#pragma once

#include <string>
#include <vector>

#include "dsec/common/Result.h"

namespace dsec::fs3 {

struct GitScrubOptions {
  // Where the tree stood when git wrote its `.git` pointer files (worktrees, submodules): an absolute gitdir below
  // it is read at the same place beneath the tree. The source directory for --from-dir, "/" for a build's upper.
  std::string original_root = "/";
  // The overlay layers a build's upper will sit on (any order). A repository whose directory already has files in
  // one of them is refused: its commit could not hold the files a sandbox sees there.
  std::vector<std::string> lower_dirs;
  // An empty private directory for git's HOME and template (removed by the caller).
  std::string scratch_dir;
};

struct ScrubbedRepository {
  std::string path;    // relative to the tree; "." for its root
  std::string branch;  // the branch HEAD names; "" when HEAD is detached at the new commit
  std::string commit;  // the single commit's hash
};

// Finds every directory of `tree` holding a `.git` entry (a directory, or a pointer file or symlink of a worktree
// or submodule), without following symlinks, and replaces that entry by a fresh repository (git init with no
// template: no hooks) whose only object graph is one commit of the working tree as `git add -A` sees it: untracked
// files are committed, ignored ones (.gitignore files, the old .git/info/exclude, which is kept) stay in the tree
// uncommitted. HEAD keeps its branch name (or stays detached); nothing else of the old .git survives: no other
// refs, no reflog, no stash, no packs, no config (remotes, filters, hooks paths). Nested repositories go first, so
// an outer commit records the inner one's new commit. The new .git belongs to the owner of the old entry.
// git runs with an empty environment (no system or global config, a fixed author, committer and date, so the
// commit hashes depend on the tree only) and never reads the old repository. `tree` is changed in place: it must
// be the caller's own copy. An empty result means the tree has no repository.
Result<std::vector<ScrubbedRepository>> scrubGitRepositories(const std::string& tree, const GitScrubOptions& options);

}  // namespace dsec::fs3
