// Copying a layer of the shared store whole into a node's own store (`dsec layer pull`): for a node that must
// run without the store later, and what every node did before on-demand mounts (the eager copy that
// `dsec bench image-start` measures against them).
#pragma once

#include <cstdint>

#include "dsec/common/Result.h"
#include "dsec/fs3/LayerStore.h"
#include "dsec/fs3/SharedStore.h"

namespace dsec::fs3 {

struct PullReport {
  LayerManifest layer;
  int64_t chunks = 0;
  int64_t bytes = 0;
};

// Fetches every chunk of `layer` with `threads` parallel fetches, checks each against its hash and length, writes it
// in place and publishes the layer in `local` (atomically: a failed pull leaves nothing). kAlreadyExists if local has
// the layer; kSystem with EIO for a chunk that fails its check.
Result<PullReport> pullLayer(SharedStore& store, const StoredLayer& layer, LayerStore& local, int threads = 8);

}  // namespace dsec::fs3
