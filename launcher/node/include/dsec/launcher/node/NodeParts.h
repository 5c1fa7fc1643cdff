// The collaborators a node agent is built on, injected so that its lifecycle, session, reaper and density logic
// runs the same over the real parts (container backend, layer store, state files) and over the simulated ones
// (records only), which need no root: simulated nodes and the node core's unit tests use those.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "dsec/backends/BackendKind.h"
#include "dsec/backends/Sandbox.h"
#include "dsec/launcher/node/ImageSource.h"
#include "dsec/launcher/node/StateStore.h"
#include "dsec/placement/DensityController.h"

namespace dsec::launcher {

struct NodeOptions;

struct NodeParts {
  std::unique_ptr<backends::Backend> backend;  // null when it could not start: backend_unavailable says why
  std::string backend_unavailable;
  // The machine backends (microvm, vm) where they can run, and why the others cannot; notes say how the ones
  // here run ("TCG: this host's KVM runs only PVM guest kernels"). Sandboxes of other kinds use `backend`.
  std::map<backends::BackendKind, std::unique_ptr<backends::Backend>> machine_backends;
  std::map<backends::BackendKind, std::string> machine_unavailable;
  std::map<backends::BackendKind, std::string> machine_notes;
  std::unique_ptr<ImageSource> images;
  std::unique_ptr<StateStore> state;
  // Where the backend puts sandbox cgroups (the CPU allocator and density loop look there, and the agent removes
  // it when empty); "" : cgroupParentForRoot(options.root).
  std::string cgroup_parent;
  // What the backend's sandboxes have. Simulated ones have no cgroups (the CPU allocator books cores but moves
  // nothing), run no processes (no fncall workers) and use nothing of the host (the density controller admits by
  // its books but ignores the host's pressure, which other work on the machine would otherwise drive).
  bool has_cgroups = true;
  bool runs_processes = true;
  bool uses_host_resources = true;
};

// The parts options ask for: the simulated ones for options.simulate, else the container backend, the layer
// store under options.root and a state file per sandbox under <root>/state/sandboxes.
NodeParts makeNodeParts(const NodeOptions& options);
NodeParts makeSimulatedNodeParts();

// The density configuration of a node whose sandboxes use nothing of the host: admission by the books only.
placement::DensityConfig hostIndependentDensityConfig(placement::DensityConfig base);

}  // namespace dsec::launcher
