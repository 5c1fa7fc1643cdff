// The shared layer store from the command line (docs/layer-store.md): `dsec layer push`, `dsec layer ls --store`,
// `dsec layer prefetch`, and the push that `dsec layer build --store` does after its build.
#pragma once

#include <string>
#include <vector>

#include "Cli.h"
#include "dsec/common/Result.h"
#include "dsec/fs3/LayerRef.h"
#include "dsec/fs3/LayerStore.h"

namespace dsec::cli {

// --store's default: $DSEC_STORE, else "" (no shared store).
std::string defaultStore();

// Pushes a layer of the local store to the shared store at store_dir and prints what it wrote.
Status pushLayer(const fs3::LayerStore& local, const fs3::LayerRef& ref, const std::string& store_dir,
                 int64_t chunk_size);

int layerPush(const Invocation& inv);
// `dsec layer prefetch IMAGE`: fills the node's chunk cache (<root>/chunk-cache) with what the image's recordings
// name (--all: every chunk), e.g. from a fleet job's prolog.
int layerPrefetch(const Invocation& inv);
// `dsec layer pull IMAGE --store DIR|URL`: copies the image's layers whole into the node's own store.
int layerPull(const Invocation& inv);
// `dsec layer gc --store DIR [--grace SECONDS] [--dry-run]`: deletes chunks no manifest names.
int layerGc(const Invocation& inv);
// `dsec layer rm NAME:VERSION... --store DIR`: removes layers from the shared store (refused while a node uses one).
int layerRmStore(const Invocation& inv, const std::vector<fs3::LayerRef>& refs, const std::string& store_dir);
// `dsec layer serve --store DIR`: the store over HTTP for nodes started with --store http://... (CmdLayerServe.cc).
int layerServe(const Invocation& inv);
// `dsec layer ls --store DIR [--json]`.
int layerLsStore(const Invocation& inv, const std::string& store_dir, bool json);

}  // namespace dsec::cli
