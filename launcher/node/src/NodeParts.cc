#include "dsec/launcher/node/NodeParts.h"

#include "dsec/backends/container/ContainerBackend.h"
#include "dsec/backends/simulated/SimulatedBackend.h"
#include "dsec/backends/vm/VmBackend.h"
#include "dsec/common/Logging.h"
#include "dsec/launcher/node/NodeAgent.h"

namespace dsec::launcher {

namespace {

void addMachineBackends(const NodeOptions& options, NodeParts& parts) {
  for (auto kind : {backends::BackendKind::kMicrovm, backends::BackendKind::kVm}) {
    if (!options.vm.enabled) {
      parts.machine_unavailable[kind] = "off on this node (--vm off)";
      continue;
    }
    backends::vm::VmBackendOptions vm;
    vm.kind = kind;
    vm.cgroup_parent = parts.cgroup_parent;
    vm.kernel_dir = options.vm.kernel_dir;
    vm.accel = options.vm.accel;
    vm.default_memory_bytes = options.vm.default_memory_bytes;
    auto made = backends::vm::makeVmBackend(vm);
    if (!made.ok()) {
      parts.machine_unavailable[kind] = made.error().message();
      DSEC_LOG(kInfo, "node") << backends::backendKindName(kind) << " unavailable: " << made.error().message();
      continue;
    }
    auto accel = backends::vm::chooseAccel(vm.accel, vm.qemu);
    if (accel.ok() && !accel->note.empty()) parts.machine_notes[kind] = accel->note;
    parts.machine_backends[kind] = std::move(made).value();
  }
}

}  // namespace

NodeParts makeSimulatedNodeParts() {
  NodeParts parts;
  parts.backend = backends::makeSimulatedBackend();
  parts.images = std::make_unique<InMemoryImageSource>();
  parts.state = std::make_unique<DiscardingStateStore>();
  parts.has_cgroups = false;
  parts.runs_processes = false;
  parts.uses_host_resources = false;
  return parts;
}

NodeParts makeNodeParts(const NodeOptions& options) {
  if (options.simulate) return makeSimulatedNodeParts();
  NodeParts parts;
  backends::ContainerBackendOptions backend_options;
  backend_options.cgroup_parent =
      options.cgroup_parent.empty() ? cgroupParentForRoot(options.root) : options.cgroup_parent;
  parts.cgroup_parent = backend_options.cgroup_parent;
  backend_options.cpu_qos = options.cpu_qos;
  backend_options.egress_never = options.egress_never;
  if (!options.user_namespaces) {
    backend_options.user_namespace = backends::UserNamespaceMode::kOff;
    DSEC_LOG(kWarn, "node") << "user namespaces are off by the operator's choice: sandbox root is host root "
                               "(with reduced capabilities, no_new_privs and seccomp); see docs/security.md";
  }
  auto backend = backends::makeContainerBackend(backend_options);
  if (backend.ok()) {
    parts.backend = std::move(*backend);
  } else {
    parts.backend_unavailable = "container backend unavailable: " + backend.error().message();
  }
  addMachineBackends(options, parts);
  auto images = std::make_unique<LayerImageSource>(options.root);
  if (!options.store_dir.empty()) {
    fs3::SharedLayersOptions shared;
    shared.store_dir = options.store_dir;
    shared.cache_dir = options.root + "/chunk-cache";
    shared.cache_bytes = options.chunk_cache_bytes;
    shared.mountpoint = options.root + "/lazy";
    (void)images->useSharedStore(shared,
                                 options.shared_store);  // a failure is logged and shown in GET /v1/node "layer_store"
  }
  parts.images = std::move(images);
  parts.state = std::make_unique<FileStateStore>(options.root + "/state/sandboxes");
  return parts;
}

placement::DensityConfig hostIndependentDensityConfig(placement::DensityConfig c) {
  c.overcommit = true;
  constexpr double kNever = 1e9;
  for (int i = 0; i < 3; ++i) {
    c.use_enter[i] = c.use_leave[i] = kNever;
    c.psi_some_enter[i] = c.psi_some_leave[i] = kNever;
    c.psi_full_enter[i] = c.psi_full_leave[i] = kNever;
  }
  c.cpu_psi_some = kNever;
  c.use_bound_min_fraction = kNever;  // no use-based bound on the ratio either
  c.oom_hold_seconds = 0;
  return c;
}

}  // namespace dsec::launcher
