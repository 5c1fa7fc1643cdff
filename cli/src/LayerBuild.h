// The ways `dsec layer build` makes a layer that are more than one store call.
#pragma once

#include <string>

#include "BusyboxRootfs.h"
#include "dsec/common/Result.h"
#include "dsec/fs3/GitScrub.h"
#include "dsec/fs3/LayerRef.h"
#include "dsec/fs3/LayerStore.h"

namespace dsec::cli {

class Progress;

struct RunBuildOutcome {
  int exit_code = 0;                              // the command's; non-zero means no layer was made
  fs3::LayerManifest manifest;                    // valid when exit_code == 0
  std::vector<fs3::ScrubbedRepository> scrubbed;  // with scrub_git: the repositories of the upper, replaced
};

// --on IMAGE --run CMD: runs `/bin/sh -c CMD` in a container sandbox over IMAGE (host network, so apt works)
// whose writable upper is a fresh host directory under <root>/layers/.build-<hex>/upper, streaming its output
// to our terminal; then captures that upper (whiteouts and opaque dirs included) as the layer. The build dir
// is removed whatever happens. With scrub_git the upper's git repositories are first replaced by one commit of
// their working trees (fs3::scrubGitRepositories; one in a directory the image has files in is refused).
// progress (optional) is told each step, and held while the command's output streams.
Result<RunBuildOutcome> buildLayerByRunning(fs3::LayerStore& store, const fs3::LayerRef& ref, const std::string& image,
                                            const std::string& command, bool scrub_git = false,
                                            Progress* progress = nullptr);

// --from-dir DIR --scrub-git: the layer is made from a copy of DIR whose git repositories were replaced by one
// commit of their working trees. DIR is only read.
Result<fs3::LayerManifest> buildLayerFromDirScrubbingGit(fs3::LayerStore& store, const fs3::LayerRef& ref,
                                                         const std::string& dir,
                                                         std::vector<fs3::ScrubbedRepository>* scrubbed);

// A tiny base layer from the host's static busybox: bin/busybox plus a symlink per applet, and the usual empty
// top-level directories. Used by the benchmarks and tests. No-op if the layer exists.
Result<fs3::LayerManifest> ensureBusyboxLayer(fs3::LayerStore& store, const fs3::LayerRef& ref);

// True if the layer is mounted now (<root>/mnt/NAME/VERSION appears in /proc/self/mountinfo).
bool isLayerMounted(const fs3::LayerStore& store, const fs3::LayerRef& ref);

}  // namespace dsec::cli
